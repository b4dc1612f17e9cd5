step|timestamp|image
|2026-12-04 00:58:39.292961+00:00|{"path":"assets/image/steps-cycle1.png"}