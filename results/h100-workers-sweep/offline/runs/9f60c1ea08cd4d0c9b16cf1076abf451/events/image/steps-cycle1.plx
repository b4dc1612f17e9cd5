step|timestamp|image
|2026-12-06 03:27:08.411543+00:00|{"path":"assets/image/steps-cycle1.png"}