step|timestamp|image
|2026-12-04 00:47:41.854838+00:00|{"path":"assets/image/steps-cycle1.png"}