step|timestamp|image
|2026-12-04 00:49:30.507227+00:00|{"path":"assets/image/steps-cycle1.png"}