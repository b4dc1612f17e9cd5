step|timestamp|image
|2026-12-06 03:28:16.650146+00:00|{"path":"assets/image/steps-cycle2.png"}