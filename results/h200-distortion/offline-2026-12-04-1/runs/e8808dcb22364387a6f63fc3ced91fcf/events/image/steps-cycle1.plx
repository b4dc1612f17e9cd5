step|timestamp|image
|2026-12-04 00:50:59.662856+00:00|{"path":"assets/image/steps-cycle1.png"}