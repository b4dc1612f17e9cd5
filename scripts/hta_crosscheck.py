"""Cross-check summarize.py's GPU idle share against Holistic Trace Analysis (HTA).

    pip install holistictraceanalysis==0.5.0 'pandas<3'   # a separate venv: HTA needs pandas < 3
    HTA_DISABLE_NS_ROUNDING=1 python scripts/hta_crosscheck.py TRACE [TRACE ...]

HTA keeps one rank-less trace per folder, so each trace is copied into a folder of its own.
HTA's idle time is per stream: gaps between consecutive GPU events over the span from the first
to the last GPU event, which is not quite summarize.py's window (the ProfilerStep slices):
expect agreement within a few percentage points, not to the digit.
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
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


def main(argv=None):
    p = argparse.ArgumentParser(prog="hta_crosscheck.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    args = p.parse_args(argv)
    print("| trace | HTA idle share | summarize.py gpu_idle_share | difference (points) |")
    print("|---|---|---|---|")
    for t in args.traces:
        ours = summarize.summarize_file(t)["gpu_idle_share"]
        theirs = hta_idle_share(t)
        print(f"| {t} | {theirs:.3f} | {ours:.3f} | {100 * (ours - theirs):+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
