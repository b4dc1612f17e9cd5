"""steplens decide on each neighbouring pair of worker counts of a sweep (scripts/workers_sweep.sh), as a table.

    python scripts/decide_pairs.py ROOT 0 1 2 4 8 12

Writes ROOT/decisions.md and ROOT/decisions.json and prints the table: each pair's outcome, the bench's paired ratio
and sign test, the input wait per profiled step before and after, and the after group's CPU and transport figures."""

import json
import os
import sys

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT_DIR)

from steplens.project import decide  # noqa: E402
from steplens.project.comparison import IGNORED, compare_records, setting  # noqa: E402
from steplens.project.diff import DiffError, read_side  # noqa: E402
from steplens.project.runs import CompareError, gather_offline  # noqa: E402
from steplens.trace.reader import TraceError  # noqa: E402


def profile_traces(root, records, workers):
    """The traces folder of the latest succeeded profile run with this worker count."""
    runs = [
        r
        for r in records
        if r["mode"] == "profile" and r["status"] == "succeeded" and r["settings"].get("workers") == workers
    ]
    if not runs:
        raise SystemExit(f"decide_pairs.py: error: no succeeded profile run with --workers {workers}")
    return os.path.join(root, "runs", sorted(runs, key=lambda r: r["created_at"])[-1]["uuid"], "outputs", "traces")


def _differ(r, ref, skip):
    """The settings outside skip in which run r differs from ref, each read as compare groups by it (off, False,
    absent: one value)."""
    return {k for k in (set(r["settings"]) | set(ref["settings"])) - skip if setting(r, k) != setting(ref, k)}


def same_study(records, counts):
    """The runs of the sweep's own settings, as compare will group them: those like the latest succeeded profile
    run with the first worker count, apart from the workers and what a profile run and its bench runs may differ
    in (decide.MODE_SETTINGS); bench runs also like the latest such bench run in those (bench_steps, seed...).
    Other local runs (another batch, data or window) would split the bench groups, and no group would be the
    baseline. Runs without settings (failed before logging them) are kept: compare says what it does with them."""
    ref = [r for r in records if r["mode"] == "profile" and r["status"] == "succeeded" and r["settings"]]
    ref = [r for r in ref if r["settings"].get("workers") == counts[0]]
    if not ref:
        return records
    ref = max(ref, key=lambda r: r["created_at"])
    why = {id(r): _differ(r, ref, decide.MODE_SETTINGS | IGNORED | {"workers"}) for r in records if r["settings"]}
    bench = [r for r in records if r["mode"] == "bench" and r["settings"] and not why[id(r)]]
    if bench:  # the bench groups split on what compare does not ignore: the latest bench run's window sets it
        last = max(bench, key=lambda r: r["created_at"])
        for r in bench:
            why[id(r)] |= _differ(r, last, IGNORED | {"workers"})
    kept = [r for r in records if not why.get(id(r))]
    if len(kept) < len(records):
        differ = ", ".join(sorted(set().union(*why.values())))
        print(f"({len(records) - len(kept)} local runs of other settings left out ({differ}): the decision reads")
        print(f" the runs like the latest --workers {counts[0]} profile run and the latest bench run)")
    return kept


def fmt(v, f):
    return "n/a" if v is None else f.format(v)


def main(root, counts):
    records, _ = gather_offline(root)
    records = same_study(records, counts)
    sides = {w: read_side(profile_traces(root, records, w)) for w in counts}
    rows = []
    pairs = list(zip(counts, counts[1:]))
    if 4 in counts and (counts[0], 4) not in pairs:  # the tutorial's own pair too
        pairs.append((counts[0], 4))
    for a, b in pairs:
        result = compare_records(records, baseline=f"workers={a}")
        _, row = decide.group_row(result, f"workers={b}")
        d = decide.decide(sides[a], sides[b], row, decide.transport(records, row["uuids"]))
        rows.append({"before": a, "after": b, **d})
    lines = [
        "| workers | outcome | paired ratio (n) | sign test p | input wait ms/step | after: stage | CPUs used | "
        "transport ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, g, h = r["bench"], r["input_gap_ms"], r["host"]
        lines.append(
            f"| {r['before']} -> {r['after']} | {r['outcome']} | {fmt(b['paired_ratio_median'], '{:.3f}')} "
            f"({b['pairs']}) | {fmt(b['sign_test_p'], '{:.3f}')} | {fmt(g['before'], '{:.1f}')} -> "
            f"{fmt(g['after'], '{:.1f}')} | {r['after_stage']} | {fmt(h['cpus_used'], '{:.2f}')} | "
            f"{fmt(h['input_transport_ms'], '{:.2f}')} |"
        )
    text = (
        "\n".join(lines) + "\n\n" + "\n".join(f"- {r['before']} -> {r['after']}: {r['sentence']}" for r in rows) + "\n"
    )
    for name, body in (("decisions.md", text), ("decisions.json", json.dumps(rows, indent=1, default=str))):
        tmp = os.path.join(root, name + ".partial")
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, os.path.join(root, name))
    sys.stdout.write(text)


if __name__ == "__main__":
    if len(sys.argv) < 4 or not all(w.isdigit() for w in sys.argv[2:]):
        raise SystemExit("usage: python scripts/decide_pairs.py ROOT W1 W2 [W3 ...] (worker counts)")
    try:
        main(sys.argv[1], [int(w) for w in sys.argv[2:]])
    except (CompareError, decide.DecideError, DiffError, TraceError) as e:
        raise SystemExit(f"decide_pairs.py: error: {e}") from None
