"""Trace evidence: the four kinds of delay of the tutorial, as numbers per profiler step.

    python summarize.py TRACE                 # one trace: per-step table and the window
    python summarize.py A B                   # two traces side by side, with the ratio B/A
    python summarize.py TRACE [TRACE ...] --json

TRACE is a PyTorch profiler Chrome trace (.json or .json.gz), e.g. what train.py
--mode profile writes under outputs/traces. These are hypotheses, not a
diagnostic classifier: the numbers say where the GPU waited, not why.

Definitions (all times in microseconds of the trace's own clock):
- window: the active ProfilerStep#N slices; GPU intervals are clipped to each step.
- gpu_busy: union of kernel, memcpy and memset intervals over all streams.
- gpu_idle = step wall - gpu_busy; gpu_idle_share = gpu_idle / wall.
- input_gap: GPU idle time that overlaps an input/next_batch slice.
- per-step counts (kernels, copies, launches, syncs) follow the CPU call that
  launched the GPU work (the trace's correlation id), not where the GPU ran it.
- gpu_work: GPU time (union of intervals) of the work a step launched, wherever it ran;
  gpu_lag: how long after the step's CPU end the last of that work finished. When the
  CPU runs ahead of the GPU (CUDA graphs, GPU-bound steps), gpu_work exceeds the step's
  wall and the clipped busy/idle figures describe the CPU's pace, not the GPU's: the
  evidence then says cpu_runs_ahead.
"""

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict

from scopes import NEXT_BATCH, SCOPES

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_SLICE_CATS = ("user_annotation", "cpu_op", "python_function", "cuda_runtime", "cuda_driver")
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch"}
SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
              "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"}
SMALL_KERNEL_US = 10.0
CAVEAT = ("profiled steps run slower than unprofiled ones (record_shapes, profile_memory and "
          "with_stack inflate CPU time): the trace explains where time goes, mode=bench measures it")
NO_GPU = "no GPU events in the trace (CPU-only profile): GPU figures are not available"


class TraceError(Exception):
    pass


# --------------------------------------------------------------------------- intervals

def union(intervals):
    """Sorted, merged [start, end) pairs."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def total(merged):
    return sum(e - s for s, e in merged)


def intersect(a, b):
    """Intersection of two merged interval lists (two pointers)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(merged, start, end):
    return intersect(merged, [[start, end]])


def complement(merged, start, end):
    out, cur = [], start
    for s, e in clip(merged, start, end):
        if s > cur:
            out.append([cur, s])
        cur = max(cur, e)
    if cur < end:
        out.append([cur, end])
    return out


def crossing_slices(slices_by_thread):
    """Per thread, slices that start inside another slice and end after it (they cross).

    Perfetto before v57.1 dropped such slices on import; with_stack=True makes them common.
    """
    counts = {}
    for thread, slices in slices_by_thread.items():
        stack, n = [], 0
        for s, e in sorted(slices, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            # 1 ns of slack: exported timestamps are rounded to ns.
            if stack and e > stack[-1] + 1e-3:
                n += 1
            stack.append(e)  # a crossing slice can itself be crossed by a later one
        if n:
            counts[thread] = n
    return counts


# --------------------------------------------------------------------------- reading

def load_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a readable Chrome trace ({type(e).__name__}: {e})") from e
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    return events


def extract(events):
    """One pass over the events, keeping only compact tuples."""
    steps, scopes, gpu, runtime, threads = [], defaultdict(list), [], [], defaultdict(list)
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat, name = ev.get("cat", ""), ev.get("name", "")
        try:
            s = float(ev["ts"])
            e = s + float(ev.get("dur", 0))
        except (KeyError, TypeError, ValueError):
            continue
        args = ev.get("args") or {}
        if cat in CPU_SLICE_CATS:
            threads[(ev.get("pid"), ev.get("tid"))].append((s, e))
        if cat == "user_annotation":
            if name.startswith("ProfilerStep#"):
                steps.append((int(name.split("#", 1)[1]), s, e))
            elif name in SCOPES:
                scopes[name].append([s, e])
        elif cat in GPU_CATS:
            gpu.append((cat, name, s, e, args.get("stream"), args.get("correlation"),
                        args.get("bytes", 0) or 0))
        elif cat in ("cuda_runtime", "cuda_driver"):
            runtime.append((name, s, e, args.get("correlation")))
    return sorted(steps), scopes, gpu, runtime, threads


# --------------------------------------------------------------------------- figures

def figures(wall, span, timeline, mine, runtime, has_gpu):
    """The figures of one stretch of time: span is a list of [start, end) step intervals.

    timeline: the whole trace's merged intervals (scopes, GPU busy, kernels), built once;
    mine: the GPU events launched by this stretch's CPU calls; runtime: its CUDA API calls.
    """
    scopes = timeline["scopes"]
    out = {"wall_us": wall,
           "scopes_cpu_us": {n: total(intersect(scopes[n], span)) for n in SCOPES}}
    if not has_gpu:
        out.update(gpu_busy_us=None, gpu_idle_us=None, gpu_idle_share=None, input_gap_us=None,
                   input_gap_share=None, gpu_work_us=None, gpu_lag_us=None, h2d=None, kernels=None,
                   launch_cpu_us=None, launch_to_busy=None, sync=None, gpu_null_reason=NO_GPU)
        return out
    busy_all = timeline["busy"]
    busy = intersect(busy_all, span)
    idle = [iv for a, b in span for iv in complement(busy_all, a, b)]
    busy_us, idle_us = total(busy), total(idle)
    gap_us = total(intersect(union(idle), scopes[NEXT_BATCH]))
    kernels_all = timeline["kernels"]

    kernels = [e - s for c, _, s, e, _, _, _ in mine if c == "kernel"]
    h2d = [(s, e, b) for c, n, s, e, _, _, b in mine if c == "gpu_memcpy" and "HtoD" in n]
    h2d_intervals = union([[s, e] for s, e, _ in h2d])
    mine_intervals = union([[s, e] for _, _, s, e, _, _, _ in mine])
    gpu_work_us = total(mine_intervals)
    gpu_lag_us = max(0.0, mine_intervals[-1][1] - max(b for _, b in span)) if mine_intervals else 0.0
    launches = [e - s for n, s, e, _ in runtime if n in LAUNCH_CALLS]
    syncs = [e - s for n, s, e, _ in runtime if n in SYNC_CALLS]
    out.update(
        gpu_busy_us=busy_us, gpu_idle_us=idle_us,
        gpu_idle_share=idle_us / wall if wall else None,
        input_gap_us=gap_us, input_gap_share=gap_us / idle_us if idle_us else 0.0,
        gpu_work_us=gpu_work_us, gpu_lag_us=gpu_lag_us,
        h2d={"count": len(h2d), "bytes": int(sum(b for _, _, b in h2d)),
             "us": sum(e - s for s, e, _ in h2d),
             "overlapped_with_kernels_us": total(intersect(h2d_intervals, kernels_all))},
        kernels={"count": len(kernels),
                 "median_us": statistics.median(kernels) if kernels else None,
                 "share_under_10us": (sum(k < SMALL_KERNEL_US for k in kernels) / len(kernels)
                                      if kernels else None)},
        launch_cpu_us=sum(launches),
        launch_to_busy=sum(launches) / busy_us if busy_us else None,
        sync={"count": len(syncs), "cpu_us": sum(syncs)},
        gpu_null_reason=None,
    )
    return out


def summarize_events(events, name="trace"):
    steps, scopes, gpu, runtime, threads = extract(events)
    if not steps:
        raise TraceError(f"{name}: no ProfilerStep#N slices: was it written by torch.profiler with a schedule?")
    has_gpu = bool(gpu)
    corr_step = {}
    runtime_by_step = defaultdict(list)
    for n, s, e, corr in runtime:
        for num, a, b in steps:
            if a <= s < b:
                runtime_by_step[num].append((n, s, e, corr))
                if corr is not None:
                    corr_step[corr] = num
                break
    gpu_by_step = defaultdict(list)
    for ev in gpu:
        num = corr_step.get(ev[5])
        if num is None:  # no correlation: fall back on where it ran
            num = next((k for k, a, b in steps if a <= ev[2] < b), None)
        if num is not None:
            gpu_by_step[num].append(ev)
    timeline = {"scopes": {n: union(scopes.get(n, [])) for n in SCOPES},
                "busy": union([[s, e] for _, _, s, e, _, _, _ in gpu]),
                "kernels": union([[s, e] for c, _, s, e, _, _, _ in gpu if c == "kernel"])}
    per_step = [{"step": num, **figures(b - a, [[a, b]], timeline, gpu_by_step[num], runtime_by_step[num], has_gpu)}
                for num, a, b in steps]
    window = figures(sum(b - a for _, a, b in steps), [[a, b] for _, a, b in steps], timeline,
                     [ev for k in gpu_by_step for ev in gpu_by_step[k]],
                     [r for k in runtime_by_step for r in runtime_by_step[k]], has_gpu)
    window["steps"] = len(steps)
    window["median_step_us"] = statistics.median(b - a for _, a, b in steps)
    crossing = crossing_slices(threads)
    return {
        "trace": name,
        "has_gpu": has_gpu,
        "gpu_idle_share": window["gpu_idle_share"],
        "input_gap_share": window["input_gap_share"],
        # The GPU still works on this window's steps after their CPU side ended: GPU-bound.
        "cpu_runs_ahead": has_gpu and window["gpu_work_us"] > window["wall_us"],
        "gpu_null_reason": None if has_gpu else NO_GPU,
        "window": window,
        "steps": per_step,
        "crossing_slices": {"count": sum(crossing.values()),
                            "by_thread": {f"{p}/{t}": n for (p, t), n in crossing.items()},
                            "note": "slices that cross another on the same thread; Perfetto v57.1 "
                                    "or later shows them, older versions drop them"},
        "caveat": CAVEAT,
    }


def summarize_file(path):
    return summarize_events(load_events(path), name=path)


def headline(evidences):
    """The figures logged as Polyaxon outputs, pooled over one or several traces' windows."""
    if isinstance(evidences, dict):
        evidences = [evidences]
    windows = [ev["window"] for ev in evidences]
    wall = sum(w["wall_us"] for w in windows)
    steps = sum(w["steps"] for w in windows)
    out = {"profiled_step_ms": wall / steps / 1000.0, "gpu_idle_share": None, "input_gap_share": None,
           "gpu_work_ms_per_step": None}
    if all(ev["has_gpu"] for ev in evidences):
        idle = sum(w["gpu_idle_us"] for w in windows)
        out["gpu_idle_share"] = idle / wall if wall else None
        out["input_gap_share"] = sum(w["input_gap_us"] for w in windows) / idle if idle else 0.0
        out["gpu_work_ms_per_step"] = sum(w["gpu_work_us"] for w in windows) / steps / 1000.0
    return out


# --------------------------------------------------------------------------- printing

ROWS = [  # label, getter, format
    ("step wall ms", lambda f: f["wall_us"] / 1e3, "{:.2f}"),
    *[(f"cpu {n} ms", (lambda n: lambda f: f["scopes_cpu_us"][n] / 1e3)(n), "{:.2f}") for n in SCOPES],
    ("gpu busy ms", lambda f: f["gpu_busy_us"] / 1e3, "{:.2f}"),
    ("gpu idle ms", lambda f: f["gpu_idle_us"] / 1e3, "{:.2f}"),
    ("gpu idle share", lambda f: f["gpu_idle_share"], "{:.3f}"),
    ("input gap ms", lambda f: f["input_gap_us"] / 1e3, "{:.2f}"),
    ("input gap / idle", lambda f: f["input_gap_share"], "{:.3f}"),
    ("gpu work launched ms", lambda f: f["gpu_work_us"] / 1e3, "{:.2f}"),
    ("gpu lag after step ms", lambda f: f["gpu_lag_us"] / 1e3, "{:.2f}"),
    ("h2d copies", lambda f: f["h2d"]["count"], "{:d}"),
    ("h2d MB", lambda f: f["h2d"]["bytes"] / 1e6, "{:.2f}"),
    ("h2d ms", lambda f: f["h2d"]["us"] / 1e3, "{:.3f}"),
    ("h2d overlapped ms", lambda f: f["h2d"]["overlapped_with_kernels_us"] / 1e3, "{:.3f}"),
    ("kernels", lambda f: f["kernels"]["count"], "{:d}"),
    ("kernel median us", lambda f: f["kernels"]["median_us"], "{:.1f}"),
    ("kernels < 10us", lambda f: f["kernels"]["share_under_10us"], "{:.3f}"),
    ("launch cpu ms", lambda f: f["launch_cpu_us"] / 1e3, "{:.2f}"),
    ("launch / gpu busy", lambda f: f["launch_to_busy"], "{:.3f}"),
    ("sync calls", lambda f: f["sync"]["count"], "{:d}"),
    ("sync cpu ms", lambda f: f["sync"]["cpu_us"] / 1e3, "{:.2f}"),
]


def mean_per_step(window):
    """The window's additive figures divided by its step count (shares and medians stay)."""
    n = window["steps"]
    m = dict(window)
    for k in ("wall_us", "gpu_busy_us", "gpu_idle_us", "input_gap_us", "gpu_work_us", "launch_cpu_us"):
        if m.get(k) is not None:
            m[k] = m[k] / n
    m["scopes_cpu_us"] = {k: v / n for k, v in window["scopes_cpu_us"].items()}
    for group, keys in (("h2d", ("count", "bytes", "us", "overlapped_with_kernels_us")),
                        ("kernels", ("count",)), ("sync", ("count", "cpu_us"))):
        if m.get(group) is not None:
            m[group] = {**m[group], **{k: m[group][k] / n for k in keys}}
    return m


def _value(getter, fig):
    try:
        return getter(fig)
    except (TypeError, KeyError):
        return None


def _fmt(value, fmt):
    if value is None:
        return "n/a"
    if fmt == "{:d}" and value != int(value):
        return f"{value:.1f}"
    return fmt.format(int(value) if fmt == "{:d}" else value)


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_table(evidences):
    """One trace: a column per step plus the window. Several: one window column each (B/A for two)."""
    parts = []
    rows_used = ROWS if any(ev["has_gpu"] for ev in evidences) else ROWS[:1 + len(SCOPES)]
    if len(evidences) == 1:
        ev = evidences[0]
        cols = [(f"#{s['step']}", s) for s in ev["steps"]] + [("mean/step", mean_per_step(ev["window"]))]
        header = ["figure"] + [c for c, _ in cols]
        rows = [[label] + [_fmt(_value(g, f), fmt) for _, f in cols] for label, g, fmt in rows_used]
        parts.append(f"trace: {ev['trace']}")
    else:
        header = ["figure (mean/step)"] + [chr(ord("A") + i) for i in range(len(evidences))]
        if len(evidences) == 2:
            header.append("B/A")
        rows = []
        for label, g, fmt in rows_used:
            vals = [_value(g, mean_per_step(ev["window"])) for ev in evidences]
            row = [label] + [_fmt(v, fmt) for v in vals]
            if len(evidences) == 2:
                a, b = vals
                row.append("n/a" if a in (None, 0) or b is None else f"{b / a:.2f}")
            rows.append(row)
        parts += [f"{chr(ord('A') + i)}: {ev['trace']}" for i, ev in enumerate(evidences)]
    parts.append(_table(header, rows))
    for ev in evidences:
        if not ev["has_gpu"]:
            parts.append(f"{ev['trace']}: {NO_GPU}")
        if ev.get("cpu_runs_ahead"):
            parts.append(f"{ev['trace']}: the CPU runs ahead of the GPU (gpu work launched > step wall): "
                         "GPU-bound; busy and idle are clipped to the CPU's steps, read gpu work instead")
        if ev["crossing_slices"]["count"]:
            parts.append(f"{ev['trace']}: {ev['crossing_slices']['count']} crossing slices "
                         "(open in Perfetto v57.1 or later, older versions drop them)")
    parts.append(f"note: {CAVEAT}")
    return "\n".join(parts) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="summarize.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="PyTorch profiler Chrome traces (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print one JSON object per trace, one per line")
    args = p.parse_args(argv)
    try:
        evidences = [summarize_file(t) for t in args.traces]
    except TraceError as e:
        print(f"summarize.py: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        for ev in evidences:
            print(json.dumps(ev, sort_keys=True))
    else:
        sys.stdout.write(format_table(evidences))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
