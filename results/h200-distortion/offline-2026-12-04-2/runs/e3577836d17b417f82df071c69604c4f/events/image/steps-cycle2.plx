step|timestamp|image
|2026-12-04 01:01:12.545627+00:00|{"path":"assets/image/steps-cycle2.png"}