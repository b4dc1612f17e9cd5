step|timestamp|image
|2026-12-04 01:12:36.131079+00:00|{"path":"assets/image/steps-cycle1.png"}