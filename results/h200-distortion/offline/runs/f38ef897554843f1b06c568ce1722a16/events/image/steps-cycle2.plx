step|timestamp|image
|2026-12-03 22:20:58.781129+00:00|{"path":"assets/image/steps-cycle2.png"}