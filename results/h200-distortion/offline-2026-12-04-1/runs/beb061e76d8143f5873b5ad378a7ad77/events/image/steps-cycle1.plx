step|timestamp|image
|2026-12-04 00:54:09.390081+00:00|{"path":"assets/image/steps-cycle1.png"}