step|timestamp|image
|2026-12-06 03:28:39.876807+00:00|{"path":"assets/image/steps-cycle1.png"}