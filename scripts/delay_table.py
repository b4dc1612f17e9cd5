"""The reading of each delay loop's trace beside its truth (scripts/delay_loops.py's folder), as a markdown table.

    python scripts/delay_table.py DIR [--out DIR/README-table.md]

A loop passes when steplens names its delay and reads its share within 0.15 of the truth."""

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from steplens.evidence.summarize import summarize_file  # noqa: E402

EXPECTED = {"input": "input", "copy": "copy", "launch": "launch", "sync": "sync", "gpu": "compute"}
BAR = 0.15


def rows(folder: str) -> tuple[dict, list[dict]]:
    with open(os.path.join(folder, "truths.json")) as f:
        truths = json.load(f)
    out = []
    for name, t in truths["loops"].items():
        if "error" in t:
            continue
        ev = summarize_file(os.path.join(folder, f"{name}.pt.trace.json.gz"))
        v = ev["verdict"]
        shares = v.get("delays") or {}
        read = shares.get(EXPECTED[name])
        rounds = [b / a if name == "gpu" else 1 - b / a for a, b in zip(t["loop_ms"], t["removed_ms"])]
        w = ev["window"]
        profiled = w["pace_us"] / w["steps"] / 1e3 if w.get("pace_us") else None
        out.append(
            {
                "loop": name,
                "truth_rounds": (min(rounds), max(rounds)),
                "profiled_ms": profiled,
                "unprofiled_ms": statistics.median(t["loop_ms"]),
                "named": v["part"],
                "stage": v["stage"],
                "share_read": read,
                "truth": t["truth"],
                "loop_ms": statistics.median(t["loop_ms"]),
                "removed_ms": statistics.median(t["removed_ms"]),
                "passes": v["part"] == EXPECTED[name] and read is not None and abs(read - t["truth"]) <= BAR,
                "sentence": v["sentence"],
            }
        )
    return truths, out


def table(truths: dict, found: list[dict]) -> str:
    lines = [
        f"{truths['gpu']}, torch {truths['torch']}, {truths['date']}, CPUs {truths['cpus']}, "
        f"{truths['rounds']} alternating rounds of {truths['steps_per_round']} steps",
        "",
        "| loop | verdict named | share read | truth | truth per round | difference | step ms: profiled / unprofiled / "
        "removed | passes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        read = "n/a" if r["share_read"] is None else f"{r['share_read']:.2f}"
        diff = "n/a" if r["share_read"] is None else f"{r['share_read'] - r['truth']:+.2f}"
        lo, hi = r["truth_rounds"]
        prof = "n/a" if r["profiled_ms"] is None else f"{r['profiled_ms']:.2f}"
        lines.append(
            f"| {r['loop']} | {r['stage']} | {read} | {r['truth']:.2f} | {lo:.2f}-{hi:.2f} | {diff} | "
            f"{prof} / {r['unprofiled_ms']:.2f} / {r['removed_ms']:.2f} | {'yes' if r['passes'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="scripts/delay_loops.py's --out folder")
    args = p.parse_args(argv)
    truths, found = rows(args.folder)
    sys.stdout.write(table(truths, found))
    for r in found:
        print(f"\n{r['loop']}: {r['sentence']}")
    return 0 if all(r["passes"] for r in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
