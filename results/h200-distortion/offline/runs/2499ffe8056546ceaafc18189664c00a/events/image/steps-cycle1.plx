step|timestamp|image
|2026-12-03 22:36:44.739944+00:00|{"path":"assets/image/steps-cycle1.png"}