step|timestamp|image
|2026-12-04 00:57:08.941083+00:00|{"path":"assets/image/steps-cycle1.png"}