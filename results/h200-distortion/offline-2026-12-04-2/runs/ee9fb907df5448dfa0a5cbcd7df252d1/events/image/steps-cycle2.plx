step|timestamp|image
|2026-12-04 00:59:53.541064+00:00|{"path":"assets/image/steps-cycle2.png"}