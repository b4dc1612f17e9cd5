step|timestamp|image
|2026-12-03 22:20:30.487993+00:00|{"path":"assets/image/steps-cycle1.png"}