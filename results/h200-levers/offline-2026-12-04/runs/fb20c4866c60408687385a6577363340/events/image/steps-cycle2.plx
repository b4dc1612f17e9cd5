step|timestamp|image
|2026-12-04 01:13:14.351644+00:00|{"path":"assets/image/steps-cycle2.png"}