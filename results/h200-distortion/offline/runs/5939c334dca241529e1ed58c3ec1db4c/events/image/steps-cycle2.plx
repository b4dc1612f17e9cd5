step|timestamp|image
|2026-12-03 22:30:48.368604+00:00|{"path":"assets/image/steps-cycle2.png"}