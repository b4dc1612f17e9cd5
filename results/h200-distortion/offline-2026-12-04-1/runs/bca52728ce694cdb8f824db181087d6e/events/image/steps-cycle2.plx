step|timestamp|image
|2026-12-04 00:52:12.973395+00:00|{"path":"assets/image/steps-cycle2.png"}