step|timestamp|image
|2026-12-06 03:26:45.638148+00:00|{"path":"assets/image/steps-cycle1.png"}