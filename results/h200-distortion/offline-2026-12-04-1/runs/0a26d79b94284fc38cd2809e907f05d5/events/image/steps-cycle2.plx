step|timestamp|image
|2026-12-04 00:49:54.137032+00:00|{"path":"assets/image/steps-cycle2.png"}