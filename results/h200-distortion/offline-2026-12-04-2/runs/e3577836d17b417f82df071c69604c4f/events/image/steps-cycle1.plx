step|timestamp|image
|2026-12-04 01:01:12.544312+00:00|{"path":"assets/image/steps-cycle1.png"}