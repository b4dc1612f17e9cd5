"""The profiler's distortion against the bench, from the runs of scripts/distortion_study.sh, as Markdown.

    python scripts/distortion_table.py ROOT [ROOT...] [--out FILE.md]

ROOT is an offline root (ROOT/runs/<uuid>/outputs/run.json), one study; several roots make one table, each
profile run paired only within its own root (the "study" column). Per configuration, capture (--profile-detail)
and repeat: the unprofiled steps' mean before and after the capture (and their standard deviations), the
profiled step, the distortion and its 95% interval (docs/EVIDENCE.md), the bench step of the same study,
repeat and configuration on the same machine (boot id and GPU UUID; its window's seconds over its steps),
profiled step / bench step, and whether that lies inside the interval.
A line per configuration counts how often it did. The table goes to FILE.md
(default: the first ROOT's distortion.md), written whole or not at all, and to stdout.
"""

import argparse
import json
import os
import sys

from steplens.atomic import write_atomic
from steplens.project import report

HERE = os.path.dirname(os.path.abspath(__file__))

HEADER = [
    "capture",
    "study",
    "repeat",
    "run",
    "machine",
    "unprofiled before ms (sd)",
    "unprofiled after ms (sd)",
    "after/before",
    "profiled step ms",
    "distortion (95% interval)",
    "bench step ms",
    "profiled/bench",
    "evidence",
    "inside",
]


class TableError(Exception):
    pass


def load(root, reevidence=None):
    """The finished runs under root with results, as (uuid, run.json), oldest first (by started_at).

    reevidence: a folder of scripts/reevidence.py's output: a run found there reads its evidence as this
    checkout derives it (run.json's "rederived" says so); the others keep the evidence they recorded."""
    runs_dir = os.path.join(root, "runs")
    if not os.path.isdir(runs_dir):
        raise TableError(f"{root} holds no offline runs (no runs/ folder)")
    runs = []
    for uuid in sorted(os.listdir(runs_dir)):
        try:
            with open(os.path.join(runs_dir, uuid, "outputs", "run.json")) as f:
                run = json.load(f)
        except (OSError, ValueError):
            continue
        again = os.path.join(reevidence or "", uuid, "evidence.json")
        if run.get("results") and reevidence and os.path.exists(again):
            with open(again) as f:
                run["results"]["evidence"], run["rederived"] = json.load(f)["evidence"], True
        if run.get("results"):
            runs.append((uuid, run))
    return sorted(runs, key=lambda ur: str(ur[1].get("started_at") or ""))


def bench_step_ms(run):
    """A bench job's step: its window's seconds over its steps, in ms (None without a window)."""
    res = run["results"]
    if not res.get("window_seconds") or not res.get("window_steps"):
        return None
    return res["window_seconds"] / res["window_steps"] * 1e3


def inside(e, bench_ms):
    """profiled step / bench step, and whether the run's 95% interval holds it (None where either is missing)."""
    if bench_ms is None or not e.get("profiled_step_ms"):
        return None, None
    ratio = e["profiled_step_ms"] / bench_ms
    if e.get("distortion_low") is None:
        return ratio, None
    return ratio, e["distortion_low"] <= ratio <= e["distortion_high"]


def machine_of(run):
    """The machine a run ran on, as its boot id and GPU UUID (8 characters each; "?" where not recorded):
    a profile run is paired only with a bench job of its own machine."""
    env = run.get("environment") or {}
    return "/".join(str(env.get(k) or "?").removeprefix("GPU-")[:8] for k in ("boot_id", "gpu_uuid"))


def _ms(mean, sd):
    return "n/a" if mean is None else f"{mean:.2f}" + ("" if sd is None else f" ({sd:.2f})")


def _f(v, spec):
    return "n/a" if v is None else format(v, spec)


def rows_of(runs):
    """{configuration: [row cells]} and {configuration: [inside flags]}, the configurations in study order."""
    config = lambda run: report.configuration(run.get("settings") or {})  # noqa: E731
    where = lambda run: (run.get("study", 1), (run.get("settings") or {}).get("repeat"), machine_of(run))  # noqa: E731
    bench = {}
    for _, run in runs:
        if run.get("mode") == "bench":
            bench.setdefault((config(run), *where(run)), bench_step_ms(run))
    rows, flags = {}, {}
    profiles = [(u, r) for u, r in runs if r.get("mode") == "profile"]
    for key in dict.fromkeys(config(r) for _, r in profiles):  # the configurations in the order they ran
        rows[key], flags[key] = [], []
    order = lambda ur: (
        (ur[1].get("settings") or {}).get("profile_detail") or "full",
        ur[1].get("study", 1),  # noqa: E731
        (ur[1].get("settings") or {}).get("repeat") or 0,
    )
    for uuid, run in sorted(profiles, key=order):
        s, e = run.get("settings") or {}, run["results"].get("evidence") or {}
        key = config(run)
        bench_ms = bench.get((key, *where(run)))
        ratio, held = inside(e, bench_ms)
        interval = (
            "" if e.get("distortion_low") is None else f" [{e['distortion_low']:.3f}, {e['distortion_high']:.3f}]"
        )
        rows[key].append(
            [
                s.get("profile_detail") or "full",
                _f(run.get("study", 1), "d"),
                _f(s.get("repeat"), "d"),
                uuid[:8],
                machine_of(run),
                _ms(e.get("unprofiled_before_ms", e.get("unprofiled_step_ms")), e.get("unprofiled_before_sd_ms")),
                _ms(e.get("unprofiled_after_ms"), e.get("unprofiled_after_sd_ms")),
                _f(e.get("unprofiled_drift"), ".3f"),
                _f(e.get("profiled_step_ms"), ".2f"),
                _f(e.get("profiler_distortion"), ".3f")
                + interval
                + (" uncertain" if e.get("distortion_uncertain") else ""),
                _f(bench_ms, ".2f"),
                _f(ratio, ".3f"),
                "re-derived" if run.get("rederived") else "recorded",
                {True: "yes", False: "no", None: "n/a"}[held],
            ]
        )
        flags[key].append(held)
    return rows, flags


def load_studies(roots, reevidence=None):
    """The runs of several roots, each run.json marked with its root's number ("study", from 1)."""
    runs = []
    for i, root in enumerate(roots, 1):
        for uuid, run in load(root, reevidence):
            run["study"] = i
            runs.append((uuid, run))
    return runs


def markdown(roots, runs, reevidence=None):
    rows, flags = rows_of(runs)
    if not rows:
        raise TableError(f"{' '.join(roots)} holds no finished profile run")
    devices = sorted({(run.get("environment") or {}).get("gpu") or run.get("device") or "?" for _, run in runs})
    out = [
        f"# The profiler's distortion against the bench: {' '.join(roots)}",
        "",
        f"Device: {', '.join(devices)}. Made by `python scripts/distortion_table.py {' '.join(roots)}"
        + (f" --reevidence {reevidence}" if reevidence else "")
        + "`.",
        "Studies: " + "; ".join(f"{i} = {root}" for i, root in enumerate(roots, 1)) + ".",
        "The interval covers the ratio against the unprofiled steps before and after the capture, each give or "
        "take its own sampling error (docs/EVIDENCE.md). `inside`: whether profiled/bench lies in it.",
        "",
    ]
    for key, cells in rows.items():
        held = [h for h in flags[key] if h is not None]
        out += [f"## {key}", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        out += ["| " + " | ".join(c) + " |" for c in cells]
        missing = len(flags[key]) - len(held)
        out += [
            "",
            f"{key}: inside for {sum(held)} of {len(held)}"
            + (f" ({missing} without an interval or a bench job of the same repeat and machine)" if missing else ""),
            "",
        ]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="distortion_table.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "roots",
        nargs="+",
        metavar="ROOT",
        help="an offline root (ROOT/runs/<uuid>/outputs/run.json), one study; several make one table",
    )
    p.add_argument("--out", default=None, help="the Markdown file (default: the first ROOT/distortion.md)")
    p.add_argument(
        "--reevidence",
        default=None,
        metavar="DIR",
        help="scripts/reevidence.py's output for these runs: their evidence as this checkout derives it",
    )
    args = p.parse_args(argv)
    if args.reevidence and not os.path.isdir(args.reevidence):
        print(f"distortion_table.py: error: --reevidence {args.reevidence}: no such folder", file=sys.stderr)
        return 2
    try:
        text = markdown(args.roots, load_studies(args.roots, args.reevidence), args.reevidence)
    except TableError as e:
        print(f"distortion_table.py: error: {e}", file=sys.stderr)
        return 1
    out = args.out or os.path.join(args.roots[0], "distortion.md")
    write_atomic(out, text)
    print(text)
    print(f"table written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
