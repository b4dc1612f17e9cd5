step|timestamp|image
|2026-12-04 00:54:09.392254+00:00|{"path":"assets/image/steps-cycle2.png"}