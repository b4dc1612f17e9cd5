step|timestamp|image
|2026-12-04 00:52:50.561910+00:00|{"path":"assets/image/steps-cycle1.png"}