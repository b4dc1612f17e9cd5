step|timestamp|image
|2026-12-04 00:48:21.388660+00:00|{"path":"assets/image/steps-cycle1.png"}