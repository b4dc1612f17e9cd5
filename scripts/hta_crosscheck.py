"""Cross-check summarize.py's and ranks.py's figures against Holistic Trace Analysis (HTA).

    pip install holistictraceanalysis==0.5.0 'pandas<3'   # a separate venv: HTA needs pandas < 3
    HTA_DISABLE_NS_ROUNDING=1 python scripts/hta_crosscheck.py TRACE [TRACE ...]
    HTA_DISABLE_NS_ROUNDING=1 python scripts/hta_crosscheck.py --ranks OUTPUTS/traces    # a DDP run's per-rank traces

HTA keeps one rank-less trace per folder, so each trace is copied into a folder of its own.
HTA's idle time is per stream: gaps between consecutive GPU events over the span from the first
to the last GPU event, which is not quite summarize.py's window (the ProfilerStep slices):
expect agreement within a few percentage points, not to the digit.

--ranks: for each profiling cycle, TraceAnalysis(trace_files={rank: trace}) over that cycle's
per-rank traces; HTA's temporal breakdown (idle share per rank), its communication/computation
overlap (1 - overlap = the exposed share of NCCL time, ranks.py's exposed_comm / comm) and its
potential stragglers (ranks whose significant communication kernels start late: they arrive last
at the collective, ranks.py's slowest rank). HTA reads GPU traces only: CPU (gloo) traces fail.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import ranks  # noqa: E402
import summarize  # noqa: E402


def hta_idle_share(trace):
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(trace, os.path.join(d, os.path.basename(trace)))
        analysis = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
        breakdown = analysis.get_temporal_breakdown(visualize=False)
    row = breakdown.iloc[0]
    return float(row["idle_time_pctg"]) / 100.0


def cycles_by_rank(directory):
    """{cycle: {rank: trace}} from a folder of per-rank traces (trace-cycleN-... names, as train.py writes)."""
    out = {}
    for rank, paths in ranks.find_traces([directory]).items():
        for path in paths:
            m = re.search(r"cycle(\d+)", os.path.basename(path))
            out.setdefault(int(m.group(1)) if m else 1, {})[rank] = path
    return out


def hta_ranks(trace_files):
    """HTA's multi-rank analyses over {rank: trace}."""
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis
    analysis = TraceAnalysis(trace_files=trace_files, include_last_profiler_step=True)
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    try:
        stragglers = list(analysis.get_potential_stragglers(num_candidates=max(1, len(trace_files) // 4),
                                                            visualize=False))
    except ValueError as e:
        # HTA 0.5.0 looks for kernels named ncclKernel*; NCCL 2.19 and later name them ncclDevKernel_*.
        stragglers = f"not computed ({type(e).__name__}: {e}; HTA 0.5.0 only counts kernels named ncclKernel*)"
    return ({r: {"idle_share": float(temporal.loc[r, "idle_time_pctg"]) / 100.0,
                 "exposed_comm_share": 1.0 - float(overlap.loc[r, "comp_comm_overlap_pctg"]) / 100.0}
             for r in trace_files}, stragglers)


def ours(trace_files):
    """ranks.py's figures over the same traces: idle share and exposed share of communication, per rank."""
    out = {}
    figures = [ranks.rank_figures([path], rank) for rank, path in sorted(trace_files.items())]
    for f in figures:
        wall = sum(s["wall_us"] for s in f["steps"])
        idle = [s["gpu_idle_us"] for s in f["steps"]]
        comm = [s["comm_us"] for s in f["steps"]]
        exposed = [s["exposed_comm_us"] for s in f["steps"]]
        out[f["rank"]] = {"idle_share": sum(idle) / wall if None not in idle else None,
                          "exposed_comm_share": sum(exposed) / sum(comm) if None not in comm and sum(comm) else None}
    return out, ranks.across(figures)["slowest_rank"]


def fmt(v):
    return "n/a" if v is None else f"{v:.3f}"


def main_ranks(directory):
    for cycle, trace_files in sorted(cycles_by_rank(directory).items()):
        theirs, stragglers = hta_ranks(trace_files)
        mine, slowest = ours(trace_files)
        print(f"\ncycle {cycle}: HTA potential stragglers {stragglers}; ranks.py slowest rank {slowest}\n")
        print("| rank | HTA idle share | ranks.py gpu idle share | HTA exposed comm share (1 - overlap) "
              "| ranks.py exposed / comm |")
        print("|---|---|---|---|---|")
        for r in sorted(trace_files):
            print(f"| {r} | {fmt(theirs[r]['idle_share'])} | {fmt(mine[r]['idle_share'])} | "
                  f"{fmt(theirs[r]['exposed_comm_share'])} | {fmt(mine[r]['exposed_comm_share'])} |")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="hta_crosscheck.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="*")
    p.add_argument("--ranks", metavar="DIR", help="a folder of a DDP run's per-rank traces (traces/rank{R}/...)")
    args = p.parse_args(argv)
    if args.ranks:
        return main_ranks(args.ranks)
    if not args.traces:
        p.error("give traces, or --ranks DIR")
    print("| trace | HTA idle share | summarize.py gpu_idle_share | difference (points) |")
    print("|---|---|---|---|")
    for t in args.traces:
        ours_idle = summarize.summarize_file(t)["gpu_idle_share"]
        theirs = hta_idle_share(t)
        print(f"| {t} | {theirs:.3f} | {ours_idle:.3f} | {100 * (ours_idle - theirs):+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
