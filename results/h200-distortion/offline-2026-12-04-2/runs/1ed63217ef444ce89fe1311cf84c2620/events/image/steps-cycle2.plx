step|timestamp|image
|2026-12-04 00:56:27.858378+00:00|{"path":"assets/image/steps-cycle2.png"}