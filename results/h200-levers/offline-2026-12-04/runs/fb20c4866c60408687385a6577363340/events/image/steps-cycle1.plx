step|timestamp|image
|2026-12-04 01:13:14.350417+00:00|{"path":"assets/image/steps-cycle1.png"}