step|timestamp|image
|2026-12-04 01:02:13.006452+00:00|{"path":"assets/image/steps-cycle1.png"}