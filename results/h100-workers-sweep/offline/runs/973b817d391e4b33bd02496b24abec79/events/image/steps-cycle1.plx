step|timestamp|image
|2026-12-06 03:27:30.867197+00:00|{"path":"assets/image/steps-cycle1.png"}