step|timestamp|image
|2026-12-04 00:58:09.212418+00:00|{"path":"assets/image/steps-cycle2.png"}