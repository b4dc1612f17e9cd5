step|timestamp|image
|2026-12-03 22:34:53.000929+00:00|{"path":"assets/image/steps-cycle1.png"}