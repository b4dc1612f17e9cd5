step|timestamp|image
|2026-12-04 13:24:46.478094+00:00|{"path":"assets/image/steps-cycle1.png"}