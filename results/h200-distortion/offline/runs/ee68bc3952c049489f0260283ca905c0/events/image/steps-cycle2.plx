step|timestamp|image
|2026-12-03 22:32:55.040641+00:00|{"path":"assets/image/steps-cycle2.png"}