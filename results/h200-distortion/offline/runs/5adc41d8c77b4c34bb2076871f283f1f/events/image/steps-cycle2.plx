step|timestamp|image
|2026-12-03 22:21:50.362035+00:00|{"path":"assets/image/steps-cycle2.png"}