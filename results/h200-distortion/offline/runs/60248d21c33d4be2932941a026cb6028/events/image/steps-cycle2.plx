step|timestamp|image
|2026-12-03 22:23:00.067308+00:00|{"path":"assets/image/steps-cycle2.png"}