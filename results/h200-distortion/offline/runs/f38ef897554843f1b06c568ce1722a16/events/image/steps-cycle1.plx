step|timestamp|image
|2026-12-03 22:20:58.778689+00:00|{"path":"assets/image/steps-cycle1.png"}