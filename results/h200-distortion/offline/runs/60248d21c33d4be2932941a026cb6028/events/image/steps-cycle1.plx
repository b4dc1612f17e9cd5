step|timestamp|image
|2026-12-03 22:23:00.058050+00:00|{"path":"assets/image/steps-cycle1.png"}