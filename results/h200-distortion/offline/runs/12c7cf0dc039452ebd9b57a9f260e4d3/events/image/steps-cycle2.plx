step|timestamp|image
|2026-12-03 22:34:53.003341+00:00|{"path":"assets/image/steps-cycle2.png"}