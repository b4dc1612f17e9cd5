"""python -m steplens: the same as the steplens console command."""

from steplens.cli import main

raise SystemExit(main())
