step|timestamp|image
|2026-12-04 01:10:54.731087+00:00|{"path":"assets/image/steps-cycle2.png"}