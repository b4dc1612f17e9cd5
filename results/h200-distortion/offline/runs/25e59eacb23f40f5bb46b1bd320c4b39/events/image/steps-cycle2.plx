step|timestamp|image
|2026-12-03 22:31:37.159269+00:00|{"path":"assets/image/steps-cycle2.png"}