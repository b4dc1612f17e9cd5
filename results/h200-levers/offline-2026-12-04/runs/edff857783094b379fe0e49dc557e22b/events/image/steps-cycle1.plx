step|timestamp|image
|2026-12-04 01:10:54.729875+00:00|{"path":"assets/image/steps-cycle1.png"}