"""What the scaling scripts (ranks_scale.py, compare_scale.py, compare_server_scale.py) share: the measured child
process and the machine in words."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The top of every measured child's code: its own memory, now (VmRSS) or at its peak (VmHWM). ru_maxrss would not
# do: a child starts with the high-water mark of the parent it was forked from.
STATUS_MB = """
import contextlib, io, json, sys, time

def status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024
"""


def run_child(code: str, args: list[str], env: dict | None = None) -> dict:
    """Run code (after STATUS_MB) in a fresh Python from the repository root: its last stdout line, as JSON, with
    its stderr under "stderr"."""
    proc = subprocess.run(
        [sys.executable, "-c", STATUS_MB + code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env or dict(os.environ),
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: error: the measured process failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(lines[-1]), "stderr": proc.stderr}


def machine(versions: str) -> str:
    """The CPU, its cores and the memory, then the versions given."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPU cores ({model}), {mem:.0f} GiB memory, no GPU; {versions}"
