step|timestamp|image
|2026-12-03 22:35:31.983090+00:00|{"path":"assets/image/steps-cycle1.png"}