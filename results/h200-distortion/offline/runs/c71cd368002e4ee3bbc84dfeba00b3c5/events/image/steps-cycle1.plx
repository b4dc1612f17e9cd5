step|timestamp|image
|2026-12-03 22:32:04.428230+00:00|{"path":"assets/image/steps-cycle1.png"}