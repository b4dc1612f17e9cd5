"""Seconds and peak memory of `steplens ranks` over 2, 16, 64 and 256 ranks, made from one real run's traces.

    python scripts/ranks_scale.py                          # 2 16 64 256 ranks; the table to results/scaling/ranks.md
    python scripts/ranks_scale.py --ranks 2 16 --out /tmp/ranks.md

Each rank's traces are the source run's two cycle traces (steps 2-4 and 7-9), shifted in time by rank x (their span
+ 1 ms) and relabelled: distributedInfo {rank, world_size} written before traceEvents, one rank{R} folder each. The
copies go to a temporary folder and are removed; only this script is stored. Each count is measured twice, each
time in a fresh process: `steplens ranks DIR --json` (the command), and what rank 0 of a DDP profile job holds (every
rank's figures with the rows of its step picture, then across()). Seconds are wall and CPU time; peak MB the process's
peak resident memory (VmHWM in /proc/self/status). Every rank is a copy of one rank, so the verdict means nothing
here; the figures are checked instead: every rank's mean step wall equals the source's ProfilerStep mean.
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

from scaling import machine, run_child  # noqa: E402

from steplens.atomic import write_atomic  # noqa: E402

SOURCE = "results/h200-reprofile/eager/runs/5ad75ecce38942bb8a82409565c94b80/outputs/traces"
CYCLES = ("trace-cycle1-steps2-4.pt.trace.json.gz", "trace-cycle2-steps7-9.pt.trace.json.gz")

# Run in a fresh process: the command's own main, its peak memory and its time, as one JSON line.
CHILD = """
from steplens.project import ranks

start_mb = status_mb("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
out = io.StringIO()
if sys.argv[2] == "command":
    with contextlib.redirect_stdout(out):
        code = ranks.main([sys.argv[1], "--json"])
    result = json.loads(out.getvalue()) if code == 0 else None
    across_cpu = None
else:  # what rank 0 of a DDP job holds: every rank's figures with the rows of its picture, then across()
    found = ranks.locate([sys.argv[1]])
    every = [ranks.rank_figures(p, r, lanes=True) for r, p in sorted(found["by_rank"].items())]
    c1 = time.process_time()
    code, result = 0, ranks.across(every, found["left_out"])
    across_cpu = time.process_time() - c1
print(json.dumps({"code": code, "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                  "across_cpu_seconds": across_cpu, "peak_mb": status_mb("VmHWM"), "start_mb": start_mb,
                  "result": result}))
"""


def load(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def span_us(doc):
    times = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0) or 0)) for e in doc["traceEvents"] if "ts" in e]
    return max(b for _, b in times) - min(a for a, _ in times)


def step_walls(doc):
    return [float(e["dur"]) for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]


def relabelled(doc, rank, world, shift):
    """The trace as rank `rank` of `world` would write it, its clock `shift` us later; traceEvents last, so that
    distributedInfo lies in the head steplens ranks reads."""
    events = [dict(e, ts=e["ts"] + shift) if isinstance(e.get("ts"), (int, float)) else e for e in doc["traceEvents"]]
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    return {**head, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": events}


def make_ranks(docs, world, folder):
    """world ranks' traces under folder/rank{R}/; returns the JSON bytes written."""
    shift = max(span_us(d) for d in docs) + 1000.0
    written = 0
    for r in range(world):
        os.makedirs(os.path.join(folder, f"rank{r}"))
        for name, doc in zip(CYCLES, docs):
            text = json.dumps(relabelled(doc, r, world, r * shift))
            written += len(text)
            with gzip.open(os.path.join(folder, f"rank{r}", name), "wt", encoding="utf-8", compresslevel=1) as f:
                f.write(text)
    return written


def measure(folder, mode):
    return run_child(CHILD, [folder, mode])


def check(m, world, source_mean_us):
    """The invariants a correct reading obeys; a broken one stops the script."""
    r = m["result"]
    problems = []
    if m["code"] != 0 or r is None:
        problems.append(f"exit {m['code']}")
    else:
        if r["ranks"] != list(range(world)) or r["ranks_left_out"]:
            problems.append(f"ranks {len(r['ranks'])}, left out {r['ranks_left_out']}")
        if r["steps_aligned"] != [2, 3, 4, 7, 8, 9]:
            problems.append(f"steps {r['steps_aligned']}")
        walls = [v["wall_us"] for v in r["per_rank"].values()]
        if any(abs(w - source_mean_us) > 1e-6 * source_mean_us for w in walls):
            problems.append(f"rank walls {min(walls)}-{max(walls)} us against the source's {source_mean_us} us")
    if problems:
        raise SystemExit(f"ranks_scale.py: error: {world} ranks: " + "; ".join(problems))


def table(rows, docs, source_mean_us, argv):
    sizes = [sum(len(json.dumps(d)) for d in docs) / 1e6]
    where = machine("Python " + platform.python_version())
    lines = [
        "# `steplens ranks` at 2 to 256 ranks",
        "",
        f"{datetime.date.today().isoformat()}, {where}, shared with other work.",
        "",
        "The command:",
        "",
        f"    python scripts/ranks_scale.py {' '.join(argv)}".rstrip(),
        "",
        f"The source: `{SOURCE}/` (an H200 eager run, workers 4, lean capture), its two cycle traces,",
        f"{sizes[0]:.1f} MB of JSON per rank together, 6 profiler steps. Each rank is a copy shifted in time and",
        "relabelled (scripts/ranks_scale.py says how); the copies are not stored.",
        "",
        "| ranks | JSON read (MB) | wall s | CPU s | CPU s per rank | peak RSS (MB) | RSS before reading (MB) "
        "| job's rank 0: peak RSS (MB) | job's rank 0: across() CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for world, written, m in rows:
        c, j = m["command"], m["job"]
        lines.append(
            f"| {world} | {written / 1e6:.0f} | {c['seconds']:.1f} | {c['cpu_seconds']:.1f} | "
            f"{c['cpu_seconds'] / world:.2f} | {c['peak_mb']:.0f} | {c['start_mb']:.0f} | {j['peak_mb']:.0f} | "
            f"{j['across_cpu_seconds']:.2f} |"
        )
    lines += [
        "",
        "The first columns are the command, `steplens ranks DIR --json`: it reads the ranks one after another and",
        "keeps each rank's figures only. The job's rank 0: what rank 0 of a DDP profile job holds once it has",
        "gathered every rank's figures with the rows of its step picture (rank_figures with lanes=True for every",
        "rank, read here in one process; in a job each rank reads its own traces at the same time), and the CPU",
        "time of across() over them. The drawing of the picture is not included.",
        "",
        "Checked at every count: all ranks compared, none left out, steps 2-4 and 7-9 aligned, and every rank's mean",
        f"step wall equal to the source's ProfilerStep mean ({source_mean_us / 1e3:.3f} ms).",
        "Peak RSS is the whole process's (VmHWM); the RSS before reading is the interpreter with steplens imported.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="ranks_scale.py", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 16, 64, 256], help="rank counts (default: 2 16 64 256)")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "scaling", "ranks.md"), help="the table (Markdown)")
    args = p.parse_args(argv)
    if any(n < 2 for n in args.ranks):
        p.error(f"--ranks must each be >= 2, got {args.ranks}")
    docs = [load(os.path.join(ROOT, SOURCE, name)) for name in CYCLES]
    walls = [w for d in docs for w in step_walls(d)]
    source_mean_us = sum(walls) / len(walls)
    rows = []
    for world in args.ranks:
        folder = tempfile.mkdtemp(prefix=f"ranks-{world}-")
        try:
            written = make_ranks(docs, world, folder)
            m = {mode: measure(folder, mode) for mode in ("command", "job")}
        finally:
            shutil.rmtree(folder)
        for mode, one in m.items():
            check(one, world, source_mean_us)
            print(
                f"ranks_scale.py: {world} ranks, {mode}: {one['seconds']:.1f} s, {one['peak_mb']:.0f} MB",
                file=sys.stderr,
            )
        rows.append((world, written, m))
    write_atomic(args.out, table(rows, docs, source_mean_us, argv))
    print(f"ranks_scale.py: written {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
