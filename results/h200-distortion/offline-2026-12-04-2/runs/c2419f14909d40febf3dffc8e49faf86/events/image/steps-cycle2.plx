step|timestamp|image
|2026-12-04 01:02:13.008016+00:00|{"path":"assets/image/steps-cycle2.png"}