"""`steplens compare -p` against a real Polyaxon server (haupt sandbox, 127.0.0.1) holding more runs than a page.

    python scripts/compare_server_scale.py               # 520 runs; the table to results/scaling/compare-server.md
    python scripts/compare_server_scale.py --runs 250 --out /tmp/server.md

The runs: the 20 bench runs of results/h200/offline in turn (4 groups, 5 alternating repeats), made on the server
through its API with their inputs (repeat + 5k for copy k, so that copies pair as the originals do), their outputs, and
the machine facts of their run.json as env_* outputs (as train.py logs them today), then marked succeeded. The server
and its store live in a temporary folder that is removed. Then `steplens compare -p PROJECT` runs twice in a fresh
process: with its defaults (every run), and with --limit 500. Each: wall seconds, the process's peak resident memory
(VmHWM), and its line on how many runs were read. Checked: every run read, each group n = runs / 4.
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "scripts")]

from polyaxon_support import Sandbox  # noqa: E402  (the tests' own server on 127.0.0.1)
from scaling import run_child  # noqa: E402

from steplens.atomic import write_atomic  # noqa: E402

SOURCE = os.path.join(ROOT, "results", "h200", "offline", "runs")
REPEATS = 5

CHILD = """
from steplens.project import compare

t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = compare.main(sys.argv[1:])
print(json.dumps({"code": code, "seconds": time.perf_counter() - t0, "peak_mb": status_mb("VmHWM")}))
"""


def source_runs():
    """(inputs, outputs with the machine facts as env_*) of each stored run."""
    out = []
    for u in sorted(os.listdir(SOURCE)):
        with open(os.path.join(SOURCE, u, "run.plx.json")) as f:
            run = json.load(f)
        with open(os.path.join(SOURCE, u, "outputs", "run.json")) as f:
            env = json.load(f)["environment"]
        facts = {f"env_{k}": env.get(k) for k in ("host", "gpu", "driver", "torch", "cuda")}
        facts.update(env_host=env.get("hostname"), env_cpu_budget=4)
        out.append((run["inputs"], {**run["outputs"], **{k: v for k, v in facts.items() if v is not None}}))
    return out


def make_runs(sandbox, project, runs, count):
    sandbox.cli("project", "create", "--name", project)
    for k in range(count // len(runs)):
        for inputs, outputs in runs:
            run = sandbox.api(sandbox.run_client(project).create, name=f"bench-{k}")
            client = sandbox.run_client(project, run.uuid)
            sandbox.api(client.log_inputs, async_req=False, **{**inputs, "repeat": inputs["repeat"] + REPEATS * k})
            sandbox.api(client.log_outputs, async_req=False, **outputs)
            sandbox.succeed(client)


def compare(sandbox, project, out, *extra):
    """steplens compare -p in a fresh process; its figures, its comparison.json and its line on the runs read."""
    m = run_child(CHILD, ["-p", project, "--out", out, *extra], env=sandbox.env())
    with open(os.path.join(out, "comparison.json")) as f:
        m["result"] = json.load(f)
    m["line"] = next(line for line in m["stderr"].splitlines() if "compare: read " in line)
    return m


def check(m, read):
    r = m["result"]
    ns = [g["n"] for t in r["tables"] for g in t["groups"]]
    if r["read"]["read"] != read or sum(ns) != read:
        raise SystemExit(
            f"compare_server_scale.py: error: read {r['read']}, groups {ns}, left out {r['left_out']}, "
            f"expected {read} runs"
        )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="compare_server_scale.py", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=520, help="runs on the server, a multiple of 20 (default: 520)")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "scaling", "compare-server.md"), help="the table")
    args = p.parse_args(argv)
    runs = source_runs()
    if args.runs < len(runs) or args.runs % len(runs):
        p.error(f"--runs must be a multiple of {len(runs)}, got {args.runs}")
    with tempfile.TemporaryDirectory(prefix="server-") as work:
        sandbox = Sandbox(work).start()
        try:
            t0 = time.perf_counter()
            make_runs(sandbox, "scale", runs, args.runs)
            made = time.perf_counter() - t0
            every = compare(sandbox, "scale", os.path.join(work, "every"))
            limited = compare(sandbox, "scale", os.path.join(work, "limited"), "--limit", "500")
        finally:
            sandbox.stop()
    check(every, args.runs)
    check(limited, min(500, args.runs))
    write_atomic(args.out, table(args, made, every, limited, argv))
    print(f"compare_server_scale.py: written {args.out}", file=sys.stderr)
    return 0


def table(args, made, every, limited, argv):
    from importlib.metadata import version

    lines = [
        f"# `steplens compare -p` over {args.runs} runs on a Polyaxon server",
        "",
        f"{datetime.date.today().isoformat()}, a {os.cpu_count()}-core CPU machine without a GPU, shared with other "
        f"work; Python {sys.version.split()[0]}, polyaxon {version('polyaxon')}, `haupt sandbox` {version('haupt')} "
        "on 127.0.0.1 (1 worker).",
        "",
        "The command:",
        "",
        f"    python scripts/compare_server_scale.py {' '.join(argv)}".rstrip(),
        "",
        f"{args.runs} bench runs made through the server's API from the 20 of results/h200/offline "
        f"({made:.0f} s); scripts/compare_server_scale.py says how. Then:",
        "",
        "| command | wall s | peak RSS (MB) | its line on stderr |",
        "|---|---|---|---|",
        f"| `steplens compare -p scale` | {every['seconds']:.1f} | {every['peak_mb']:.0f} | `{every['line']}` |",
        f"| `steplens compare -p scale --limit 500` | {limited['seconds']:.1f} | {limited['peak_mb']:.0f} "
        f"| `{limited['line']}` |",
        "",
        f"Checked: the first read all {args.runs} runs and its groups hold them all; the second read the newest "
        f"{min(500, args.runs)}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
