step|timestamp|image
|2026-12-03 22:30:15.403872+00:00|{"path":"assets/image/steps-cycle1.png"}