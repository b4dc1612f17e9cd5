step|timestamp|image
|2026-12-04 13:24:05.569550+00:00|{"path":"assets/image/steps-cycle2.png"}