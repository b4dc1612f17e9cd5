step|timestamp|image
|2026-12-03 22:21:50.359923+00:00|{"path":"assets/image/steps-cycle1.png"}