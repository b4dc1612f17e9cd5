step|timestamp|image
|2026-12-04 00:57:08.944565+00:00|{"path":"assets/image/steps-cycle2.png"}