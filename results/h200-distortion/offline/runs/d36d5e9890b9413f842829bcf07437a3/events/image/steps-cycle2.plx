step|timestamp|image
|2026-12-03 22:35:31.984843+00:00|{"path":"assets/image/steps-cycle2.png"}