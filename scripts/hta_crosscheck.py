"""Cross-check steplens summarize's idle and launch figures against Holistic Trace Analysis (HTA).

    pip install --target /tmp/hta holistictraceanalysis==0.5.0 plotly networkx pydot   # or traceinsight
    PYTHONPATH=/tmp/hta python scripts/hta_crosscheck.py TRACE [TRACE ...] > crosscheck.md
    PYTHONPATH=/tmp/hta python scripts/hta_crosscheck.py --ranks OUTPUTS/traces   # a DDP run's per-rank traces
    PYTHONPATH=/tmp/hta python scripts/hta_crosscheck.py --kernels TRACE [TRACE ...]   # per-kernel time and count

One markdown row per trace: steplens summarize's idle share (and its basis), the host-wait part of its idle
time and its input gap, beside HTA's temporal breakdown (idle share), its idle-time breakdown (host wait,
kernel wait, other: get_idle_time_breakdown, summed over streams) and its kernel launch statistics
(get_cuda_kernel_launch_stats: one row per launch whose CPU call and GPU event share a correlation id),
against the same launch statistics computed here from steplens summarize's reading of the trace.

The definitions differ, so expect agreement in kind, not to the digit: HTA's idle time is per stream
over the span from the trace's first to its last GPU event (work launched before the trace included);
steplens summarize's is the union over streams, over the CPU's steps or, when the CPU runs ahead, over the
GPU span of the work the window launched. HTA's launch statistics skip cudaGraphLaunch (its kernels
share one correlation id), so for graph replays they cover only the few eager launches left.

--kernels: HTA's get_gpu_kernel_breakdown (every kernel and memory event, all of them listed) beside the
same sums from steplens summarize's reading of the trace under HTA's rule (the events whose launch call is in the
trace and starts before the last ProfilerStep ends): per kernel name, the summed duration and the count, and
the largest difference; then our kernel classes (steplens/trace/kernels.py) with HTA's figures summed
by our class of each name. HTA's count is its sum over its mean (it reports no count).

--ranks: for each profiling cycle, TraceAnalysis(trace_files={rank: trace}) over that cycle's
per-rank traces; HTA's temporal breakdown (idle share per rank), its communication/computation
overlap (1 - overlap = the exposed share of NCCL time, steplens ranks's exposed_comm / comm) and its
potential stragglers (ranks whose significant communication kernels start late: they arrive last
at the collective, steplens ranks's slowest rank). HTA reads GPU traces only: CPU (gloo) traces fail.
"""

import argparse
import os
import re
import statistics
import sys
import warnings

from steplens.evidence import summarize
from steplens.project import ranks
from steplens.trace import kernels, reader, timeline

MEMORY_CALLS = {"cudaMemcpyAsync", "cudaMemsetAsync"}


def our_launch_stats(trace):
    """HTA's definition from steplens summarize's reading: per launch call (kernel, memcpy, memset; not graphs)
    with GPU work of its correlation id in the trace: CPU duration and delay from the call's end to the
    GPU work's start."""
    t = timeline.extract(reader.iter_events(trace))
    first_gpu = {}
    for _, s, _, _, corr, _ in t.gpu:
        if corr is not None and (corr not in first_gpu or s < first_gpu[corr]):
            first_gpu[corr] = s
    calls = (timeline.LAUNCH_CALLS - timeline.GRAPH_LAUNCH_CALLS) | MEMORY_CALLS
    rows = [(e - s, first_gpu[corr] - e) for name, s, e, corr in t.runtime if name in calls and corr in first_gpu]
    return {
        "launches": len(rows),
        "median_cpu_us": statistics.median(r[0] for r in rows) if rows else None,
        "median_delay_us": statistics.median(r[1] for r in rows) if rows else None,
    }


def hta_figures(trace):
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    # trace_files avoids HTA's one-trace-per-folder rule; an absolute path survives its join with trace_dir.
    analysis = TraceAnalysis(trace_files={0: os.path.abspath(trace)}, include_last_profiler_step=True)
    temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    idle, _ = analysis.get_idle_time_breakdown(visualize=False)
    by_category = idle.groupby("idle_category")["idle_time"].sum()
    idle_total = float(by_category.sum())
    launches = analysis.get_cuda_kernel_launch_stats(visualize=False)[0]
    return {
        "idle_share": float(temporal["idle_time_pctg"]) / 100.0,
        "breakdown": {
            c: (float(by_category.get(c, 0.0)) / idle_total if idle_total else None)
            for c in ("host_wait", "kernel_wait", "other")
        },
        "launches": len(launches),
        "median_cpu_us": float(launches["cpu_duration"].median()) if len(launches) else None,
        "median_delay_us": float(launches["launch_delay"].median()) if len(launches) else None,
    }


def label(trace):
    """The run's settings that matter here, from run.json beside the trace (when it is there)."""
    import json

    path = os.path.join(trace.split(os.sep + "traces" + os.sep)[0], "run.json")
    try:
        with open(path) as f:
            s = json.load(f)["settings"]
    except (OSError, ValueError, KeyError):
        return ""
    shown = [f"workers={s.get('workers')}"] + [
        k.replace("_", "-")
        for k in ("gpu_input", "cuda_graph", "channels_last", "fused_sgd", "prefetch_stream", "cudnn_benchmark")
        if s.get(k)
    ]
    shown += [f"{k}={s[k]}" for k in ("amp", "compile") if s.get(k) not in (None, "off")]
    shown += ["lean"] if s.get("profile_detail") == "lean" else []
    return " ".join(shown)


def versions():
    from importlib import metadata

    import pandas

    found = []
    for dist in ("holistictraceanalysis", "traceinsight"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    import hta

    return (
        f"{', '.join(found) or 'hta (no distribution metadata)'} from {os.path.dirname(hta.__file__)}; "
        f"pandas {pandas.__version__}; Python {sys.version.split()[0]}"
    )


def f(v, fmt="{:.3f}"):
    return "n/a" if v is None else fmt.format(v)


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
        stragglers = list(
            analysis.get_potential_stragglers(num_candidates=max(1, len(trace_files) // 4), visualize=False)
        )
    except ValueError as e:
        # HTA 0.5.0 looks for kernels named ncclKernel*; NCCL 2.19 and later name them ncclDevKernel_*.
        stragglers = f"not computed ({type(e).__name__}: {e}; HTA 0.5.0 only counts kernels named ncclKernel*)"
    return (
        {
            r: {
                "idle_share": float(temporal.loc[r, "idle_time_pctg"]) / 100.0,
                "exposed_comm_share": 1.0 - float(overlap.loc[r, "comp_comm_overlap_pctg"]) / 100.0,
            }
            for r in trace_files
        },
        stragglers,
    )


def ours(trace_files):
    """steplens ranks's figures over the same traces: idle share and exposed share of communication, per rank."""
    out = {}
    figures = [ranks.rank_figures([path], rank) for rank, path in sorted(trace_files.items())]
    for f in figures:
        wall = sum(s["wall_us"] for s in f["steps"])
        idle = [s["gpu_idle_us"] for s in f["steps"]]
        comm = [s["comm_us"] for s in f["steps"]]
        exposed = [s["exposed_comm_us"] for s in f["steps"]]
        out[f["rank"]] = {
            "idle_share": sum(idle) / wall if None not in idle else None,
            "exposed_comm_share": sum(exposed) / sum(comm) if None not in comm and sum(comm) else None,
        }
    result = ranks.across(figures)  # one cycle's steps: often too few for steplens ranks to name a straggler
    named = result["slowest_rank"]
    return out, named if named is not None else f"none named ({result['straggler_reason']})"


def hta_kernels(trace):
    """HTA's per-kernel breakdown, all kernels and memory events: {name: (summed us, count)}."""
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_files={0: os.path.abspath(trace)}, include_last_profiler_step=True)
    _, per_kernel = analysis.get_gpu_kernel_breakdown(
        visualize=False, duration_ratio=1.0, num_kernels=10**6, include_memory_kernels=True
    )
    return {
        r["name"]: (
            float(r["sum (us)"]),
            round(float(r["sum (us)"]) / float(r["mean (us)"])) if float(r["mean (us)"]) else 0,
        )
        for _, r in per_kernel.iterrows()
    }


def our_kernels(trace):
    """The same from steplens summarize's reading, under HTA's rule: the GPU events whose launch call (same
    correlation id) is in the trace and starts before the last ProfilerStep ends, whichever step it is in."""
    t = timeline.extract(reader.iter_events(trace))
    last_end = max(e for _, _, e in t.steps)
    launched = {corr for _, s, _, corr in t.runtime if corr is not None and s <= last_end}
    out = {}
    for ev in (ev for ev in t.gpu if ev[4] in launched):
        us, n = out.get(t.gpu_names[ev], (0.0, 0))
        out[t.gpu_names[ev]] = (us + ev[2] - ev[1], n + 1)
    return out


def main_kernels(traces):
    for trace in traces:
        mine, theirs = our_kernels(trace), hta_kernels(trace)
        names = set(mine) | set(theirs)
        diff = sorted(((abs(mine.get(n, (0.0, 0))[0] - theirs.get(n, (0.0, 0))[0]), n) for n in names), reverse=True)
        counts = sum(mine.get(n, (0, 0))[1] != theirs.get(n, (0, 0))[1] for n in names)
        print(f"\n{os.path.relpath(trace)} ({label(trace)})\n")
        print(f"- names: ours {len(mine)}, HTA {len(theirs)}, in one only: {len(set(mine) ^ set(theirs))}")
        print(
            f"- summed duration: ours {sum(v[0] for v in mine.values()):.1f} us, HTA "
            f"{sum(v[0] for v in theirs.values()):.1f} us; events: ours {sum(v[1] for v in mine.values())}, HTA "
            f"{sum(v[1] for v in theirs.values())}; names whose counts differ: {counts}"
        )
        print(f"- largest per-name difference: {diff[0][0]:.1f} us ({diff[0][1][:80]})")
        w = summarize.summarize_file(trace)["window"]
        kc = w["kernel_classes"]
        print(
            f"- steplens summarize's window (the work the steps launched): "
            f"kernel time summed {kc['kernel_us']:.1f} us, "
            f"GPU work (union) {w['gpu_work_us']:.1f} us = the classes' sum "
            f"{sum(c['us'] for c in kc['classes'].values()):.1f}"
            f" us, overlap {kc['overlap_us']:.1f} us; top classes {kernels.top_classes(kc['classes'])}\n"
        )
        by_class = {}
        for source, col in ((mine, 0), (theirs, 1)):
            for name, (us, n) in source.items():
                cls = kernels.classify(name, "gpu_memcpy" if name.startswith(("Memcpy", "Memset")) else "kernel")
                row = by_class.setdefault(cls, [[0.0, 0], [0.0, 0]])
                row[col][0] += us
                row[col][1] += n
        print(
            "| class (steplens/trace/kernels.py) | summed us: ours | HTA | count: ours | HTA |\n|---|---|---|---|---|"
        )
        for cls in kernels.CLASSES:
            if cls in by_class:
                (a, m), (b, n) = by_class[cls]
                print(f"| {cls} | {a:.1f} | {b:.1f} | {m} | {n} |")
    return 0


def fmt(v):
    return "n/a" if v is None else f"{v:.3f}"


def main_ranks(directory):
    for cycle, trace_files in sorted(cycles_by_rank(directory).items()):
        theirs, stragglers = hta_ranks(trace_files)
        mine, slowest = ours(trace_files)
        print(f"\ncycle {cycle}: HTA potential stragglers {stragglers}; steplens ranks slowest rank {slowest}\n")
        print(
            "| rank | HTA idle share | steplens ranks gpu idle share | HTA exposed comm share (1 - overlap) "
            "| steplens ranks exposed / comm |"
        )
        print("|---|---|---|---|---|")
        for r in sorted(trace_files):
            print(
                f"| {r} | {fmt(theirs[r]['idle_share'])} | {fmt(mine[r]['idle_share'])} | "
                f"{fmt(theirs[r]['exposed_comm_share'])} | {fmt(mine[r]['exposed_comm_share'])} |"
            )
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="hta_crosscheck.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="*")
    p.add_argument("--ranks", metavar="DIR", help="a folder of a DDP run's per-rank traces (traces/rank{R}/...)")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="per-kernel summed time and count against HTA's get_gpu_kernel_breakdown, by class",
    )
    args = p.parse_args(argv)
    if not args.traces and not args.ranks:
        p.error("give traces, or --ranks DIR")
    warnings.filterwarnings("ignore")
    try:
        import hta  # noqa: F401
    except ImportError as e:
        print(f"hta_crosscheck.py: error: HTA is not importable ({e}): see the install line in --help", file=sys.stderr)
        return 1
    print(f"HTA: {versions()}\n")
    if args.ranks:
        return main_ranks(args.ranks)
    if args.kernels:
        return main_kernels(args.traces)
    print(
        "| trace | settings | basis | idle share: ours | HTA | ours: host wait / idle | HTA: host wait / "
        "kernel wait / other | ours: input gap / idle | launches: ours | HTA | median launch call us: ours "
        "| HTA | median launch delay us: ours | HTA | graph launches per step (ours) |"
    )
    print("|---" * 15 + "|")
    for t in args.traces:
        ours = summarize.summarize_file(t)
        w = ours["window"]
        host = w["host_wait_us"] / w["gpu_idle_us"] if w.get("gpu_idle_us") else None
        mine, theirs = our_launch_stats(t), hta_figures(t)
        b = theirs["breakdown"]
        name = (
            os.path.relpath(t).split(os.sep + "runs" + os.sep)[-1].replace(os.sep + "outputs" + os.sep + "traces", "")
        )
        print(
            f"| {name} | {label(t)} | {ours['idle_basis']} | {f(ours['gpu_idle_share'])} | "
            f"{f(theirs['idle_share'])} | {f(host)} | {f(b['host_wait'], '{:.2f}')} / "
            f"{f(b['kernel_wait'], '{:.2f}')} / {f(b['other'], '{:.2f}')} | {f(ours['input_gap_share'])} | "
            f"{mine['launches']} | {theirs['launches']} | {f(mine['median_cpu_us'], '{:.1f}')} | "
            f"{f(theirs['median_cpu_us'], '{:.1f}')} | {f(mine['median_delay_us'], '{:.1f}')} | "
            f"{f(theirs['median_delay_us'], '{:.1f}')} | {w['graph_launches'] / w['steps']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
