step|timestamp|image
|2026-12-06 03:27:53.509097+00:00|{"path":"assets/image/steps-cycle2.png"}