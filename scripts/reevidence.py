"""Read stored profile runs again with this checkout's evidence code (steplens), running nothing again.

    python scripts/reevidence.py ROOT [--out DIR]

ROOT is an offline root (ROOT/runs/<uuid>/outputs/run.json), such as one of the results/ folders. The
measurements of a profile run are its traces and the timings its run.json holds (the unprofiled steps
before the capture, and after it in runs made since that block was timed; the pauses between profiled
steps; and, in runs made since they were recorded, each step's duration);
the evidence is derived from them. This script derives it again, so that runs recorded before a change
to the derivation read as new runs would. The run's own files are not changed: for each profile run it
writes DIR/<uuid>/ (default ROOT/reevidence/<uuid>/): links to the traces, each cycle's evidence
(.evidence.json, .evidence.txt) beside them, and evidence.json (the headline, the per-cycle figures, the
capture's account). It prints one row per run. Where run.json has no step durations and waits for input
(runs recorded before the loop timed them), the traced steps' own times are used, and the untraced ones
(the schedule's wait and warm-up steps) get the mean compute time of the traced ones.
"""

import argparse
import json
import os
import shutil
import sys

from steplens.atomic import write_json_atomic
from steplens.evidence import cycle_evidence
from steplens.evidence.formatting import run_label
from steplens.project import report
from steplens.trace import reader

HERE = os.path.dirname(os.path.abspath(__file__))


class ReevidenceError(Exception):
    pass


def stored_trace(path, outputs):
    """A trace path recorded on another machine, found again under this run's outputs folder."""
    if os.path.exists(path):
        return path
    if "/outputs/" in path:
        here = os.path.join(outputs, path.split("/outputs/", 1)[1])
        if os.path.exists(here):
            return here
    raise ReevidenceError(f"{outputs}: trace {path} not found")


def capture_of(run):
    """The capture's timings and loader facts as write_evidence takes them, from a run.json."""
    res, loader = run["results"], run.get("loader") or {}
    workers = loader.get("num_workers") or 0
    return {
        "detail": res.get("profile_detail") or "full",
        "unprofiled": res.get("unprofiled"),
        "unprofiled_after": res.get("unprofiled_after"),  # absent in runs timed before the capture alone
        "pauses_s": res.get("pauses_s") or [],
        "steps_s": res.get("steps_s"),
        "inputs_s": res.get("inputs_s"),
        "queue_depth": workers * (loader.get("prefetch_factor") or 0),
        "queue": f"{workers} workers x prefetch_factor {loader.get('prefetch_factor')}"
        if workers
        else "no worker processes",
        "workers": workers,
        "device_input": loader.get("kind") == "device",
        "run_label": run_label(run.get("settings") or {}),  # the step pictures' titles
    }


def reread(outputs, out_dir):
    """The evidence of one stored profile run, derived again into out_dir; returns what evidence.json holds."""
    with open(os.path.join(outputs, "run.json")) as f:
        run = json.load(f)
    if run.get("mode") != "profile" or not (run.get("results") or {}).get("cycles"):
        raise ReevidenceError(f"{outputs}: not a finished profile run")
    if not run["results"].get("pauses_s"):
        raise ReevidenceError(f"{outputs}: run.json holds no pauses (a run older than the pause timing)")
    traces = os.path.join(out_dir, "traces")
    if os.path.isdir(traces):
        shutil.rmtree(traces)
    os.makedirs(traces)
    cycles = []
    for c in run["results"]["cycles"]:
        src = os.path.abspath(stored_trace(c["trace"], outputs))
        link = os.path.join(traces, os.path.basename(src))
        os.symlink(os.path.relpath(src, traces), link)  # relative: the folder can move with the runs
        cycles.append(
            {k: c[k] for k in ("cycle", "profiler_steps", "dump_before_step", "dump_seconds") if k in c}
            | {"trace": link}
        )
    head = cycle_evidence.write_evidence(cycles, capture_of(run))
    result = {
        "uuid": os.path.basename(os.path.dirname(outputs)),
        "settings": run.get("settings"),
        "evidence": head,
        "recorded_evidence": run["results"].get("evidence"),
        "cycles": [
            {
                k: c.get(k)
                for k in ("cycle", "profiler_steps", "refilled_by", "follows_dump", "evidence", "evidence_txt")
            }
            for c in cycles
        ],
    }
    write_json_atomic(os.path.join(out_dir, "evidence.json"), result)
    return result


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def row(r):
    e = r["evidence"]
    lo_hi = e.get("unprofiled_step_ms_range")
    unprofiled = fmt(e.get("unprofiled_step_ms"), ".2f") + (f" ({lo_hi[0]:.2f}-{lo_hi[1]:.2f})" if lo_hi else "")
    ratio = (
        fmt(e.get("profiler_distortion"), ".2f")
        + (f" +/- {e['profiler_distortion_se']:.2f}" if e.get("profiler_distortion_se") is not None else "")
        + (f" [{e['distortion_low']:.2f}, {e['distortion_high']:.2f}]" if e.get("distortion_low") is not None else "")
        + (" uncertain" if e.get("distortion_uncertain") else "")
    )
    used = (
        f"steps {','.join(map(str, e['headline_steps']))}"
        if e.get("headline_steps")
        else f"cycles {','.join(map(str, e.get('headline_cycles') or []))}"
    )
    return [
        r["uuid"][:8],
        report.configuration(r["settings"] or {}),
        (r["settings"] or {}).get("profile_detail") or "full",
        fmt(e.get("gpu_idle_share"), ".3f"),
        fmt(e.get("input_gap_share"), ".3f"),
        unprofiled,
        fmt(e.get("profiled_step_ms"), ".2f"),
        ratio,
        used,
    ]


def main(argv=None):
    p = argparse.ArgumentParser(prog="reevidence.py", description=__doc__.split("\n")[0])
    p.add_argument("root", help="an offline root: ROOT/runs/<uuid>/outputs/run.json")
    p.add_argument("--out", default=None, help="where the evidence goes (default: ROOT/reevidence)")
    args = p.parse_args(argv)
    runs_dir = os.path.join(args.root, "runs")
    if not os.path.isdir(runs_dir):
        print(f"reevidence.py: error: {args.root} holds no offline runs (no runs/ folder)", file=sys.stderr)
        return 1
    out = args.out or os.path.join(args.root, "reevidence")
    rows, skipped = [], []
    for uuid in sorted(os.listdir(runs_dir)):
        outputs = os.path.join(runs_dir, uuid, "outputs")
        try:
            with open(os.path.join(outputs, "run.json")) as f:
                if json.load(f).get("mode") != "profile":
                    continue
            rows.append(row(reread(outputs, os.path.join(out, uuid))))
        except (OSError, ValueError, ReevidenceError, reader.TraceError) as e:
            skipped.append(f"  {uuid[:8]}: {e}")
    if rows:
        print(
            report.table(
                [
                    "run",
                    "configuration",
                    "capture",
                    "GPU idle share",
                    "input gap share of idle",
                    "unprofiled step ms (range)",
                    "profiled step ms",
                    "distortion (95% interval)",
                    "headline from",
                ],
                rows,
            )
        )
        print(f"\nevidence written under {out}")
    if skipped:
        print("not read:\n" + "\n".join(skipped))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
