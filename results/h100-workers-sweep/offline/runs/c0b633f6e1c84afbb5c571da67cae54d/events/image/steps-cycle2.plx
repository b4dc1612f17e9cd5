step|timestamp|image
|2026-12-06 03:26:45.646553+00:00|{"path":"assets/image/steps-cycle2.png"}