step|timestamp|image
|2026-12-04 00:59:27.876903+00:00|{"path":"assets/image/steps-cycle2.png"}