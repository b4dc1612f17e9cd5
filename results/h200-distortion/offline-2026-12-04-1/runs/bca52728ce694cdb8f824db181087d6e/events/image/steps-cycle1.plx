step|timestamp|image
|2026-12-04 00:52:12.971385+00:00|{"path":"assets/image/steps-cycle1.png"}