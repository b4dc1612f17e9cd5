"""python -m steplens: the same as the steplens console command."""

try:  # Ctrl-C while the command is loading: one line, as once it runs (steplens.cli.main)
    from steplens.cli import main
except KeyboardInterrupt:
    import sys

    print("steplens: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
