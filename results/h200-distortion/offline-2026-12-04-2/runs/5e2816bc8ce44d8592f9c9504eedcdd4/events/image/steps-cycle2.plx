step|timestamp|image
|2026-12-04 01:00:40.520207+00:00|{"path":"assets/image/steps-cycle2.png"}