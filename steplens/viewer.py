"""steplens viewer: Polyaxon's own UI over offline runs, started so that it works without internet.

The UI loads React and its other scripts from public CDNs unless POLYAXON_UI_OFFLINE=true: without it,
on a machine with no internet, the page shows only Polyaxon's logo. It listens on 127.0.0.1 only.
"""

import argparse
import os
import shutil
import sys

from steplens.polyaxonenv import OWNER, PROJECT

DEFAULT_ROOT = ".polyaxon-offline"


def viewer_env(environ: dict) -> dict:
    """The environment haupt viewer needs: its UI served from its own /static, no error reports sent."""
    env = dict(environ)
    env.update(POLYAXON_UI_OFFLINE="true", POLYAXON_UI_IN_SANDBOX="true", POLYAXON_DISABLE_ERRORS_REPORTING="true")
    return env


def viewer_command(haupt: str, root: str, port: int) -> list[str]:
    return [haupt, "viewer", "--host", "127.0.0.1", "--port", str(port), "--path", os.path.abspath(root)]


def runs_page(port: int) -> str:
    """The page that lists the local runs: a row per run, its readme one click away."""
    return f"http://127.0.0.1:{port}/ui/{OWNER}/{PROJECT}/runs"


def find_haupt() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "haupt")
    return beside if os.path.exists(beside) else shutil.which("haupt")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens viewer", description=__doc__.split("\n")[0])
    p.add_argument("--path", default=DEFAULT_ROOT, help=f"the offline runs' root (default: {DEFAULT_ROOT})")
    p.add_argument("--port", type=int, default=8001, help="the port on 127.0.0.1 (default: 8001)")
    args = p.parse_args(argv)
    if not os.path.isdir(os.path.join(args.path, "runs")):
        print(
            f"steplens viewer: error: {args.path} holds no runs/ folder: run `make run` first, or pass --path",
            file=sys.stderr,
        )
        return 2
    haupt = find_haupt()
    if haupt is None:
        print(
            "steplens viewer: error: no haupt command: pip install 'haupt[sandbox]==2.18.0' (make setup does)",
            file=sys.stderr,
        )
        return 2
    cmd = viewer_command(haupt, args.path, args.port)
    print(
        f"Polyaxon's UI over {os.path.abspath(args.path)}: {runs_page(args.port)} (Ctrl-C stops it)",
        flush=True,
    )
    os.execve(haupt, cmd, viewer_env(os.environ))


if __name__ == "__main__":
    raise SystemExit(main())
