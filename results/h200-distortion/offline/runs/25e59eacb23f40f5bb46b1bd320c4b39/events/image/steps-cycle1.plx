step|timestamp|image
|2026-12-03 22:31:37.157454+00:00|{"path":"assets/image/steps-cycle1.png"}