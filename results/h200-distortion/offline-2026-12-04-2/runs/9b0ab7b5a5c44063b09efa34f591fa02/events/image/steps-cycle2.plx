step|timestamp|image
|2026-12-04 00:58:39.294856+00:00|{"path":"assets/image/steps-cycle2.png"}