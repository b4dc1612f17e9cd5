step|timestamp|image
|2026-12-03 22:32:04.430088+00:00|{"path":"assets/image/steps-cycle2.png"}