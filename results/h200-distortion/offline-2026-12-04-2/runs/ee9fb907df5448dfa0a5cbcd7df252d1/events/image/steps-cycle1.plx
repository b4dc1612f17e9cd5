step|timestamp|image
|2026-12-04 00:59:53.539580+00:00|{"path":"assets/image/steps-cycle1.png"}