step|timestamp|image
|2026-12-03 22:24:20.276899+00:00|{"path":"assets/image/steps-cycle2.png"}