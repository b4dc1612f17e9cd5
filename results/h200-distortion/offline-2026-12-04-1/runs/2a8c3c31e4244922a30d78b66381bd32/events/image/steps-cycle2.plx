step|timestamp|image
|2026-12-04 00:47:41.865204+00:00|{"path":"assets/image/steps-cycle2.png"}