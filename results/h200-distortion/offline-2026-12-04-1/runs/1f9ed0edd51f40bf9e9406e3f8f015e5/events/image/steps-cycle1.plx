step|timestamp|image
|2026-12-04 00:55:03.748118+00:00|{"path":"assets/image/steps-cycle1.png"}