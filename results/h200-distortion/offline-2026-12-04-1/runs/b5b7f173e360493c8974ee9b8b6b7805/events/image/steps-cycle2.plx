step|timestamp|image
|2026-12-04 00:48:21.391774+00:00|{"path":"assets/image/steps-cycle2.png"}