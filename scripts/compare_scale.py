"""Seconds and peak memory of `steplens compare --offline` over 100, 1,000 and 5,000 runs made from a stored study.

    python scripts/compare_scale.py                        # 100 1000 5000 runs; the table to results/scaling/compare.md
    python scripts/compare_scale.py --runs 100 --out /tmp/compare.md

The source: results/h200/offline, 20 bench runs (workers 0, 2, 4, 8; 5 alternating repeats). Copy k of a run has a
new uuid, starts k x (the study's span + 1 min) later and has repeat index repeat + 5k, so that copies pair as the
originals do; its outputs are the original's. Only run.plx.json and outputs/run.json are copied (all that compare
reads), to a temporary folder that is removed: only this script is stored. Each count is measured in a fresh process
running what `steplens compare --offline DIR --out OUT` runs after parsing its flags (read, compare, write the tables
and the picture), each stage timed: wall and CPU seconds, and the process's peak resident memory (VmHWM in
/proc/self/status). Checked at every count: every run read, each group n = runs / 4, and
each group's median equal to the source study's.
"""

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

from scaling import machine, run_child  # noqa: E402

from steplens.atomic import write_atomic  # noqa: E402
from steplens.project.runs import moment  # noqa: E402

SOURCE = "results/h200/offline"
REPEATS = 5  # the source study's repeats: copy k of repeat r is repeat r + 5k

CHILD = """
from steplens.project import compare, comparison, runs

def clock():
    return time.perf_counter(), time.process_time()

start_mb = status_mb("VmRSS")
marks = [clock()]
# What compare.main does after parsing its flags, one stage at a time.
records, read = runs.gather_offline(sys.argv[1])
marks.append(clock())
result = comparison.compare_records(records)
result["read"] = read
marks.append(clock())
compare.write_outputs(result, sys.argv[2])
with contextlib.redirect_stdout(io.StringIO()):
    sys.stdout.write(compare.markdown(result))
marks.append(clock())
cpu = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
print(json.dumps({"code": 0, "seconds": marks[-1][0] - marks[0][0], "cpu_seconds": marks[-1][1] - marks[0][1],
                  "stage_cpu_seconds": cpu, "peak_mb": status_mb("VmHWM"), "start_mb": start_mb}))
"""


def load(path):
    with open(path) as f:
        return json.load(f)


def source_runs():
    """The stored study's runs: (uuid, run.plx.json, run.json)."""
    runs_dir = os.path.join(ROOT, SOURCE, "runs")
    return [
        (u, load(os.path.join(runs_dir, u, "run.plx.json")), load(os.path.join(runs_dir, u, "outputs", "run.json")))
        for u in sorted(os.listdir(runs_dir))
    ]


def shifted(value, seconds):
    return (datetime.datetime.fromisoformat(moment(value)) + datetime.timedelta(seconds=seconds)).isoformat()


def make_runs(runs, count, root):
    """count runs under root/runs/, copies of the source's in turn (count a multiple of the source's size)."""
    starts = [datetime.datetime.fromisoformat(moment(run["created_at"])) for _, run, _ in runs]
    span = (max(starts) - min(starts)).total_seconds() + 60
    for k in range(count // len(runs)):
        for _, run, run_json in runs:
            new = uuid.uuid4().hex
            repeat = run["inputs"]["repeat"] + REPEATS * k
            plx = dict(run, uuid=new, inputs={**run["inputs"], "repeat": repeat})
            for key in ("created_at", "started_at", "finished_at"):
                if plx.get(key):
                    plx[key] = shifted(plx[key], k * span)
            record = dict(run_json, settings={**run_json["settings"], "repeat": repeat})
            os.makedirs(os.path.join(root, "runs", new, "outputs"))
            with open(os.path.join(root, "runs", new, "run.plx.json"), "w") as f:
                json.dump(plx, f)
            with open(os.path.join(root, "runs", new, "outputs", "run.json"), "w") as f:
                json.dump(record, f)


def measure(root, out):
    m = run_child(CHILD, [root, out])
    m["result"] = load(os.path.join(out, "comparison.json")) if m["code"] == 0 else None
    return m


def medians(result):
    return {g["group"]: (g["n"], g["median"]) for t in result["tables"] for g in t["groups"]}


def check(m, count, source):
    """Every run read, n = count / 4 per group, and the source's medians; a broken one stops the script."""
    r = m["result"]
    if m["code"] != 0 or r is None:
        raise SystemExit(f"compare_scale.py: error: {count} runs: exit {m['code']}")
    if r["read"]["read"] != count or r["read"]["matched"] != count:
        raise SystemExit(f"compare_scale.py: error: {count} runs: read {r['read']}")
    got, want = medians(r), {g: (count // 4, med) for g, (_, med) in source.items()}
    if got != want:
        raise SystemExit(f"compare_scale.py: error: {count} runs: groups {got}, expected {want}")


def versions():
    try:
        import matplotlib

        return f"Python {sys.version.split()[0]}, matplotlib {matplotlib.__version__}"
    except ImportError:
        return f"Python {sys.version.split()[0]}, no matplotlib (no picture drawn)"


def table(rows, argv):
    lines = [
        "# `steplens compare --offline` over 100 to 5,000 runs",
        "",
        f"{datetime.date.today().isoformat()}, {machine(versions())}, shared with other work.",
        "",
        "The command:",
        "",
        f"    python scripts/compare_scale.py {' '.join(argv)}".rstrip(),
        "",
        f"The runs: copies of the 20 bench runs of `{SOURCE}` (4 groups, 5 alternating repeats), each copy",
        "later in time with its own repeat indices, so that copies pair as the originals do (scripts/compare_scale.py",
        "says how); the copies are not stored.",
        "Each count ran, in a fresh process, what `steplens compare --offline DIR --out OUT` runs after parsing its",
        "flags, timed stage by stage: reading every run (gather_offline), comparing (grouping, pairing, the sign",
        "tests: compare_records), and writing comparison.md, .csv, .json and .png (write_outputs, markdown).",
        "",
        "| runs | wall s | CPU s | reading: CPU s | comparing: CPU s | writing (with the picture): CPU s "
        "| reading and comparing: CPU ms per run | peak RSS (MB) | RSS before reading (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for count, m in rows:
        read, compared, written = m["stage_cpu_seconds"]
        lines.append(
            f"| {count} | {m['seconds']:.1f} | {m['cpu_seconds']:.1f} | {read:.2f} | {compared:.2f} | {written:.2f} "
            f"| {1e3 * (read + compared) / count:.3f} | {m['peak_mb']:.0f} | {m['start_mb']:.0f} |"
        )
    lines += [
        "",
        "Checked at every count: every run read, each of the 4 groups holds a quarter of them, and each group's",
        "median equals the source study's (copies add no new rates).",
        "",
    ]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="compare_scale.py", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, nargs="+", default=[100, 1000, 5000], help="run counts (multiples of 20)")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "scaling", "compare.md"), help="the table")
    args = p.parse_args(argv)
    runs = source_runs()
    if any(n < len(runs) or n % len(runs) for n in args.runs):
        p.error(f"--runs must be multiples of {len(runs)} (the source's runs), got {args.runs}")
    rows, source = [], None
    for count in args.runs:
        work = tempfile.mkdtemp(prefix=f"compare-{count}-")
        try:
            if source is None:
                source = medians(measure(os.path.join(ROOT, SOURCE), os.path.join(work, "source"))["result"])
            make_runs(runs, count, os.path.join(work, "root"))
            m = measure(os.path.join(work, "root"), os.path.join(work, "out"))
        finally:
            shutil.rmtree(work)
        check(m, count, source)
        print(f"compare_scale.py: {count} runs: {m['seconds']:.1f} s, {m['peak_mb']:.0f} MB", file=sys.stderr)
        rows.append((count, m))
    write_atomic(args.out, table(rows, argv))
    print(f"compare_scale.py: written {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
