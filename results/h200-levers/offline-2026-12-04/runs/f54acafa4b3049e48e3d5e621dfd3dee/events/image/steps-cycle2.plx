step|timestamp|image
|2026-12-04 01:12:36.132319+00:00|{"path":"assets/image/steps-cycle2.png"}