step|timestamp|image
|2026-12-06 03:28:39.878971+00:00|{"path":"assets/image/steps-cycle2.png"}