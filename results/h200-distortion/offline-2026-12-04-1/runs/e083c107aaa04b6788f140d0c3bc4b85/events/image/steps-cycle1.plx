step|timestamp|image
|2026-12-04 00:50:34.526017+00:00|{"path":"assets/image/steps-cycle1.png"}