"""The tutorial's decision on a change, made from its traces and its bench runs (steplens decide).

    steplens decide BEFORE AFTER (--offline ROOT | -p PROJECT) --before LABEL --after LABEL [--json] [--out DIR]

BEFORE and AFTER are the two settings' traces (files, profile runs' folders, or with -p profile runs' uuids, as
steplens diff takes them); ROOT or PROJECT holds their alternating bench runs, grouped as steplens compare groups
them; LABEL names each setting's group ("workers=0", "workers=4"). --out DIR writes decision.md and decision.json;
inside a Polyaxon run they go to the run's outputs, are logged as artifacts, and decision.md becomes its readme.
The outcomes, in the tutorial's words:
  1) throughput rose and the input gaps shortened: the evidence supports the change for this workload and CPU budget;
  2) the gaps shrank without a throughput gain: another stage may now dominate (named from the after trace);
  3) throughput fell: inspect CPU contention and the cost of transporting small batches (their figures given).
Or: the measurement cannot decide yet, with the pairs it would need."""

import argparse
import json
import os
import statistics
import sys
from typing import Any

from steplens.atomic import run_record_near, write_atomic
from steplens.polyaxonenv import is_managed, log_outputs, managed_identity, tell
from steplens.project.comparison import baseline_groups, compare_records
from steplens.project.diff import DiffError, read_sides
from steplens.project.runs import CompareError, gather_offline, gather_polyaxon
from steplens.stats import ALPHA, sign_test_p
from steplens.trace.reader import TraceError

# The input gap shrank: by at least a quarter of itself and by at least this share of the before step.
GAP_SHRINK = 0.25
GAP_STEP_SHARE = 0.05

OUTCOMES = {
    "supports": "the evidence supports the change for this workload and CPU budget",
    "another stage": "the gaps disappeared without a throughput gain: another stage may now dominate",
    "slower": "throughput fell: inspect CPU contention and the cost of transporting small batches",
    "faster, other cause": "throughput rose, but the input gaps did not shorten: the trace does not show the input as "
    "the reason",
    "no change": "neither the throughput nor the input gaps moved beyond the noise",
    "undecided": "the measurement cannot decide yet",
}


class DecideError(Exception):
    pass


# Settings a profile run and the bench runs of one setting may differ in: the label is not checked against them.
MODE_SETTINGS = frozenset(
    (
        "mode",
        "bench_steps",
        "warmup_steps",
        "repeat",
        "seed",
        "output_dir",
        "data_dir",
        "profile_detail",
        "unprofiled_steps",
        "profile_phase",
        "memory_snapshot",
        "trace_format",
    )
)


def side_record(path: str) -> tuple[str, dict[str, Any]] | None:
    """The run.json of the profile run a side is from (a run's folder, its outputs or traces folder, or one of its
    traces), and its path; None where the side is no single run's (a folder of several runs' traces, say), or no
    file here (a run's uuid: its traces come from the server)."""
    return run_record_near(path) if os.path.exists(path) else None


def check_label(path: str, group: str, flag: str) -> None:
    """DecideError where the side's own run says another value of a setting the label names (workers=0 traces
    given as --before workers=2): the traces and the bench group would be of two settings."""
    found = side_record(path)
    if found is None:
        return
    where, record = found
    for part in group.split(","):
        k, _, v = part.strip().partition("=")
        if k in record["settings"] and k not in MODE_SETTINGS and not baseline_groups(f"{k}={v}", [[record]]):
            raise DecideError(
                f"{path}: its run ({where}) has {k}={record['settings'][k]}, not {flag} {group}: the traces and "
                "the bench group must be of one setting"
            )


def more_pairs(test: dict[str, Any], alpha: float = ALPHA) -> int | None:
    """The fewest further pairs that could reach p < alpha, were every one on the majority's side; None when they
    already do."""
    n, k = test["untied"], max(test["above_1"], test["below_1"])
    if n and sign_test_p(n, k, candidates=2) < alpha:
        return None
    m = 0
    while sign_test_p(n + m, k + m, candidates=2) >= alpha:
        m += 1
    return m


def group_row(result: dict[str, Any], label: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The comparison's table (the first whose groups hold label) and label's row in it."""
    for table in result["tables"]:
        for row in table["groups"]:
            if row["group"] == label:
                return table, row
    labels = sorted({row["group"] for t in result["tables"] for row in t["groups"]})
    raise DecideError(f"no bench group {label!r} among the runs: {', '.join(labels) or 'none'}")


def transport(records: list[dict[str, Any]], uuids: list[str]) -> dict[str, Any]:
    """The bench runs' own figures on CPU contention and transport: CPUs used and the budget in words, the throttled
    share, the time a batch travels from a worker to the training process, the workers' memory and /dev/shm.
    Medians over the group's runs; a figure none logged is None."""
    by_uuid = {r["uuid"]: r for r in records}
    outs = [by_uuid[u]["outputs"] for u in uuids if u in by_uuid]

    def med(key):
        values = [o[key] for o in outs if isinstance(o.get(key), (int, float))]
        return statistics.median(values) if values else None

    sentences = [o["cpu_sentence"] for o in outs if o.get("cpu_sentence")]
    return {
        "cpus_used": med("cpus_used"),
        "cpu_throttled_share": med("cpu_throttled_share"),
        "cpu_sentence": sentences[0] if sentences else None,
        "input_transport_ms": med("input_transport_ms"),
        "input_make_ms": med("input_make_ms"),
        "workers_pss_mb": med("workers_pss_mb"),
        "shm_peak_mb": med("shm_peak_mb"),
    }


def _has_gpu(side: dict[str, Any]) -> bool:
    """Whether every trace of a side (diff.read_side's) has GPU events; True where the side does not say."""
    return all(ev.get("has_gpu", True) for ev in side.get("evidences") or [])


def decide(before: dict[str, Any], after: dict[str, Any], row: dict[str, Any], host: dict[str, Any]) -> dict[str, Any]:
    """The outcome from the two sides' traces (diff.read_side's) and the after group's comparison row against the
    before group (compare's); host: transport() of the after group."""
    test = row.get("sign_test") or {}
    sig = row.get("verdict") or ""
    gap_b = (before.get("delays_ms") or {}).get("input")
    gap_a = (after.get("delays_ms") or {}).get("input")
    out = {
        "bench": {
            "pairs": test.get("pairs", 0),
            "paired_ratio_median": (row.get("paired") or {}).get("median"),
            "ratio_of_medians": row.get("ratio"),
            "sign_test_p": test.get("p"),
            "significance": sig,
        },
        "input_gap_ms": {"before": gap_b, "after": gap_a},
        "after_stage": after["verdict"]["stage"],
        "after_share": after["verdict"]["share"],
        "host": host,
        "more_pairs": None,
    }
    if gap_b is None or gap_a is None:
        cpu_only = [n for n, side in (("before", before), ("after", after)) if not _has_gpu(side)]
        why = (
            f"the {' and '.join(cpu_only)} trace{'s are' if len(cpu_only) > 1 else ' is'} CPU-only: the input wait is "
            "the GPU's idle while the input is read, so more pairs cannot decide it; profile on a GPU"
            if cpu_only
            else "a trace has no input-wait figure (GPU records lost, or no input source in it)"
        )
        out.update(outcome="undecided", reason=why)
        return finish(out)
    step_b = before["step_ms"] or 0.0
    shrank = gap_a <= (1 - GAP_SHRINK) * gap_b and gap_b - gap_a >= GAP_STEP_SHARE * step_b
    out["gap_shrank"] = shrank
    if sig.startswith("too few"):
        out.update(outcome="undecided", reason=f"{test.get('pairs', 0)} pairs; a sign test needs {test.get('needed')}")
        out["more_pairs"] = max(0, (test.get("needed") or 0) - test.get("untied", 0))
    elif sig == "faster":
        out["outcome"] = "supports" if shrank else "faster, other cause"
    elif sig == "slower":
        out["outcome"] = "slower"
    elif shrank:
        out["outcome"] = "another stage"
        out["more_pairs"] = more_pairs(test)
    else:
        out["outcome"] = "no change"
        out["more_pairs"] = more_pairs(test)
    return finish(out)


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else fmt.format(v)


def finish(out: dict[str, Any]) -> dict[str, Any]:
    """The decision's sentence with the figures that decide it."""
    b, g = out["bench"], out["input_gap_ms"]
    figures = (
        f"bench: {b['pairs']} pairs, paired ratio after/before {_f(b['paired_ratio_median'], '{:.3f}')} "
        f"(sign test p {_f(b['sign_test_p'], '{:.3f}')}: {b['significance'] or 'n/a'}); input wait per profiled "
        f"step {_f(g['before'], '{:.2f}')} -> {_f(g['after'], '{:.2f}')} ms"
    )
    said = OUTCOMES[out["outcome"]]
    if out["outcome"] == "undecided":
        said += f" ({out['reason']})"
    if out["outcome"] in ("another stage", "no change", "faster, other cause") and out["after_stage"]:
        said += f": after the change, {out['after_stage']} holds the step ({out['after_share']:.0%})"
    if out["outcome"] in ("slower", "another stage", "no change"):
        h = out["host"]
        said += (
            f". CPU: {h['cpu_sentence'] or 'not recorded by these runs'}; CPUs used {_f(h['cpus_used'], '{:.2f}')}, "
            f"throttled {_f(h['cpu_throttled_share'], '{:.1%}')} of the window; a batch travels "
            f"{_f(h['input_transport_ms'], '{:.2f}')} ms from a worker to the training process (made in "
            f"{_f(h['input_make_ms'], '{:.2f}')} ms); workers' memory {_f(h['workers_pss_mb'], '{:.0f}')} MB PSS, "
            f"/dev/shm {_f(h['shm_peak_mb'], '{:.0f}')} MB"
        )
    if out["more_pairs"]:
        said += f". {out['more_pairs']} more pairs could settle it, if each falls on the side most do now"
    out["sentence"] = f"{said[0].upper()}{said[1:]}. {figures}."
    return out


def markdown(out: dict[str, Any]) -> str:
    """decision.md: the decision, then the two sides it was made from."""
    b, a, g = out["sides"]["before"], out["sides"]["after"], out["input_gap_ms"]
    return (
        f"# The decision on {b['group']} -> {a['group']}\n\n"
        f"**Decision:** {out['sentence']}\n\n"
        "| | before | after |\n|---|---|---|\n"
        f"| bench group | `{b['group']}` | `{a['group']}` |\n"
        f"| profile traces | {b['traces']} | {a['traces']} |\n"
        f"| input wait per profiled step (ms) | {_f(g['before'], '{:.2f}')} | {_f(g['after'], '{:.2f}')} |\n\n"
        "Made by `steplens decide`: the traces say whether the input gaps shortened; "
        "the bench runs' paired sign test says whether throughput moved.\n"
    )


def write_decision(out: dict[str, Any], folder: str) -> dict[str, str]:
    """decision.md and decision.json in folder, each written whole."""
    return {
        "markdown": write_atomic(os.path.join(folder, "decision.md"), markdown(out)),
        "json": write_atomic(os.path.join(folder, "decision.json"), json.dumps(out, indent=1, sort_keys=True) + "\n"),
    }


def record_in_run(out: dict[str, Any], folder: str | None) -> list[str]:
    """Inside a Polyaxon run: decision.md and decision.json in the run's outputs (and in folder, if given), logged as
    its artifacts in one request; decision.md as the run's readme, the outcome as its description."""
    from polyaxon import tracking

    tracking.init(**managed_identity())
    paths = write_decision(out, tracking.get_outputs_path())
    log_outputs(
        tracking, {f"decision-{kind}": path for kind, path in paths.items()}, "the decision's files as artifacts"
    )
    sides = out["sides"]
    tell(
        tracking, f"{sides['before']['group']} -> {sides['after']['group']}: {OUTCOMES[out['outcome']]}", markdown(out)
    )
    tracking.end()
    return [*paths.values(), *(write_decision(out, folder).values() if folder else [])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens decide", description=__doc__.split("\n")[0])
    p.add_argument("before", help="the before setting's trace, a folder of traces, or with -p a profile run's uuid")
    p.add_argument("after", help="the after setting's trace, a folder of traces, or with -p a profile run's uuid")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--offline", metavar="ROOT", help="offline Polyaxon runs holding the bench runs")
    where.add_argument("-p", "--project", help="a Polyaxon project holding the bench runs (and the profile runs)")
    p.add_argument(
        "--before", dest="before_group", required=True, metavar="LABEL", help="the before group, e.g. workers=0"
    )
    p.add_argument(
        "--after", dest="after_group", required=True, metavar="LABEL", help="the after group, e.g. workers=4"
    )
    p.add_argument("--input-scope", default=None, metavar="NAME", help="as for steplens summarize")
    p.add_argument("--json", action="store_true", help="print the decision as one JSON object")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write decision.md and decision.json there (default: not written, except inside a Polyaxon run: to its "
        "outputs, always)",
    )
    args = p.parse_args(argv)
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out} is a file: give a folder")
    try:  # the bench groups first: a wrong label costs no download and no trace read
        if args.offline:
            records, _ = gather_offline(args.offline)
        else:
            records, _ = gather_polyaxon(args.project)
        try:
            result = compare_records(records, baseline=args.before_group)
        except CompareError as e:  # compare's own flag is --baseline; here the same label is --before
            raise CompareError(str(e).replace("--baseline ", "--before ", 1)) from e
        _, row = group_row(result, args.after_group)
        group_row(result, args.before_group)
        check_label(args.before, args.before_group, "--before")
        check_label(args.after, args.after_group, "--after")
        sides = read_sides([args.before, args.after], args.project, args.input_scope)
    except (DiffError, TraceError, CompareError, DecideError) as e:
        print(f"steplens decide: error: {e}", file=sys.stderr)
        return 1
    out = decide(sides[0], sides[1], row, transport(records, row["uuids"]))
    out["sides"] = {
        "before": {"group": args.before_group, "traces": sides[0]["path"]},
        "after": {"group": args.after_group, "traces": sides[1]["path"]},
    }
    print(json.dumps(out, sort_keys=True) if args.json else f"decision: {out['sentence']}")
    if is_managed():
        paths = record_in_run(out, args.out)
    elif args.out:
        paths = list(write_decision(out, args.out).values())
    else:
        return 0
    print(f"written: {', '.join(paths)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
