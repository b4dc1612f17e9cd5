step|timestamp|image
|2026-12-04 00:50:34.527390+00:00|{"path":"assets/image/steps-cycle2.png"}