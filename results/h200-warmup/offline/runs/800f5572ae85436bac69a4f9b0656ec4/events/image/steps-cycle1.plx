step|timestamp|image
|2026-12-04 13:24:05.567798+00:00|{"path":"assets/image/steps-cycle1.png"}