step|timestamp|image
|2026-12-03 22:32:55.038694+00:00|{"path":"assets/image/steps-cycle1.png"}