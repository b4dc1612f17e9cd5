step|timestamp|image
|2026-12-04 00:55:03.750578+00:00|{"path":"assets/image/steps-cycle2.png"}