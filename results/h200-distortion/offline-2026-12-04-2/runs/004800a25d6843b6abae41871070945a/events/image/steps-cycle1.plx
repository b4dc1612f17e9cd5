step|timestamp|image
|2026-12-04 00:59:27.875271+00:00|{"path":"assets/image/steps-cycle1.png"}