step|timestamp|image
|2026-12-04 00:50:59.664306+00:00|{"path":"assets/image/steps-cycle2.png"}