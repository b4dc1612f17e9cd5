step|timestamp|image
|2026-12-04 01:00:40.518859+00:00|{"path":"assets/image/steps-cycle1.png"}