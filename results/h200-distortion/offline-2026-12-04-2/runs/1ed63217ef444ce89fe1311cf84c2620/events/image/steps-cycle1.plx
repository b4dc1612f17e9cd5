step|timestamp|image
|2026-12-04 00:56:27.848323+00:00|{"path":"assets/image/steps-cycle1.png"}