step|timestamp|image
|2026-12-04 01:03:11.354177+00:00|{"path":"assets/image/steps-cycle2.png"}