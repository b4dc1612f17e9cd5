"""Trace evidence: the four kinds of delay of the tutorial, as numbers per profiler step.

    python summarize.py TRACE                 # one trace: per-step table and the window
    python summarize.py A B                   # two traces side by side, with the ratio B/A
    python summarize.py TRACE [TRACE ...] --json
    python summarize.py TRACE --input-scope NAME   # your own loop: the record_function around fetching a batch

TRACE is a PyTorch profiler Chrome trace (.json or .json.gz), e.g. what train.py
--mode profile writes under outputs/traces. It is read as a stream: memory grows with
the compact figures kept per event, not with the file. These are hypotheses, not a
diagnostic classifier: the numbers say where the GPU waited, not why.

Definitions (all times in microseconds of the trace's own clock):
- window: the ProfilerStep#N slices of the trace (the active steps of one cycle).
- Attribution: GPU work belongs to the step whose CPU call launched it, found through the
  trace's correlation id (args.correlation on the cudaLaunchKernel/cudaGraphLaunch/cudaMemcpyAsync
  call and on the kernel, copy or memset it started), wherever and whenever the GPU ran it.
  Work whose launch is not in the trace was launched before it (Kineto records GPU work of
  earlier steps that was still running): it is reported on its own line and charged to no step.
  Only GPU events that carry no correlation id at all fall back on the clock (the step whose CPU
  time saw them start). The launching scope is the tutorial scope open when the launch call ran.
- gpu_work: GPU time (union of intervals) of the work a step launched; gpu_work_by_scope: the same
  per launching scope; gpu_annotation: the gpu_user_annotation span of each scope on the GPU track
  (it follows launches from the annotating thread only: on eager steps train/forward_backward's annotation
  spans the forward pass, gaps included, while autograd's own thread launches the backward pass; the CPU
  scope open at the launch, on any thread, misses neither).
- gpu_span: the step's slot on the GPU's own timeline, from the start of its first GPU event to
  the start of the next step's first one. The last traced step's slot has no end (no next step in
  the trace; the end of its own last event would leave out whatever idle follows it): its gpu_span is
  null with the reason. The window's gpu_span runs from the first to the last GPU event of the work
  launched inside the window (the stretch the gpu_timeline basis measures); its gpu_span_per_step_us
  is the mean over the complete slots only (N-1 of N steps; null when there are none).
  Invariant, checked here on the complete slots: a step's gpu_work never exceeds its gpu_span (a
  violation means the steps' GPU work overlaps; the step's GPU-timeline figures are then null with
  the reason), nor the work of the steps with a complete slot their slots' total.
- gpu_lag: how long after the window's CPU end the last of its GPU work finished.
- Idle figures, in one of two bases (idle_basis):
  cpu_steps: while the GPU keeps up, busy = union of all GPU intervals clipped to the CPU's steps,
    idle = step wall - busy;
  gpu_timeline: when the CPU runs ahead of the GPU (cpu_runs_ahead: the window's work ends more than
    a median step after its CPU end, or it needs more GPU time than the CPU took), clipping to the
    CPU's steps describes the CPU's pace, not the GPU's: busy and idle are measured over gpu_span.
  gpu_idle_share = idle / basis span. host wait: the idle intervals that end with work launched after
  they began (HTA's rule), split by the scope the CPU was in (waits_by_scope_us); the rest of the idle
  time had work queued. input_gap = the host wait inside the input source's slices; input_gap_share =
  input_gap / idle. profiled_step_ms is the basis span per step: the CPU's step while the GPU keeps up,
  the GPU's time per step when the CPU runs ahead.
- input source: input/next_batch when the trace has it, else the DataLoader's own annotation
  (enumerate(DataLoader)#...__next__, in every trace of a DataLoader loop), else --input-scope NAME; with
  none, the input figures are null with the reason. A scope absent from the trace is null, never 0.
- per-step counts (kernels, copies, launches, syncs) follow the launching step too.
- verdict: the stage that holds the step, in the tutorial's terms (see verdict()); a hypothesis to test
  with mode=bench, never given where its figure is null.
"""

import argparse
import bisect
import gzip
import json
import re
import statistics
import sys
from array import array
from collections import defaultdict

import kernels
import nesting
from nesting import by_start_then_longest as _by_start_then_longest
from scopes import NEXT_BATCH, SCOPES

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_SLICE_CATS = ("user_annotation", "cpu_op", "python_function", "cuda_runtime", "cuda_driver")
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch"}
GRAPH_LAUNCH_CALLS = {"cudaGraphLaunch", "cuGraphLaunch"}
SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
              "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"}
SMALL_KERNEL_US = 10.0
OPEN_SLOT = ("the last traced step has no next step to end its GPU slot (a slot runs from the step's first "
             "GPU event to the next step's first)")
EPS_US = 0.01  # exported timestamps carry ns decimals: sums of a few thousand of them stay well within this
OUTSIDE_SCOPES = "(outside the four scopes)"
LOADER_PREFIX = "enumerate(DataLoader)#"  # the DataLoader's own annotation of each __next__, in every trace
NO_INPUT = ("the trace has no input/next_batch scope, no DataLoader annotation (enumerate(DataLoader)#...) and no "
            "--input-scope: where the step waits for input cannot be told")
CAVEAT = ("the profiler adds its own cost to the profiled process (more with record_shapes, profile_memory "
          "and with_stack): the trace explains where time goes, mode=bench measures it; profile mode's "
          "profiler_distortion says how far the profiled steps moved from unprofiled ones")
NO_GPU = "no GPU events in the trace (CPU-only profile): GPU figures are not available"
RUN_AHEAD = ("the CPU runs ahead of the GPU (GPU-bound): the work a step launches runs during later steps' "
             "CPU time, so clipping GPU time to the CPU's steps would describe the CPU's pace; busy, idle and "
             "input gap are measured on the GPU's own timeline instead (idle_basis gpu_timeline)")
GRAPHS = ("CUDA-graph replays: one cudaGraphLaunch starts all of a graph's kernels, so the trace shows no "
          "per-operator CPU launches for them (launch cpu ms counts the graph launches only), and Kineto's "
          "view of graphs has known gaps (pytorch/kineto#1165): time replays with CUDA events "
          "(train.py --mode bench --cuda-graph: gpu_ms_per_step)")


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

    slices_by_thread: {thread: (starts, ends)} as two parallel sequences.
    Perfetto before v57.1 dropped such slices on import; with_stack=True makes them common.
    """
    counts = {}
    for thread, (starts, ends) in slices_by_thread.items():
        stack, n = [], 0
        for i in _by_start_then_longest(starts, ends):
            s, e = starts[i], ends[i]
            # 1 ns of slack both ways: exported timestamps are rounded to ns, and near 5e12 µs a double's
            # step is about 1 ns, so a slice that ends where the next starts may sum to just past it.
            while stack and stack[-1] <= s + 1e-3:
                stack.pop()
            if stack and e > stack[-1] + 1e-3:
                n += 1
            stack.append(e)  # a crossing slice can itself be crossed by a later one
        if n:
            counts[thread] = n
    return counts


# --------------------------------------------------------------------------- reading

_SPACE = re.compile(r"[ \t\n\r]*")


class _Stream:
    """A text stream read in chunks, decoded one JSON value at a time with json's raw_decode.

    Only the current chunk and the value being decoded are held: memory is bounded by the
    chunk size plus the largest single value (one trace event), not by the file.
    """

    def __init__(self, f, chunk=1 << 20):
        self.f, self.chunk, self.buf, self.pos, self.eof = f, chunk, "", 0, False
        self.decode = json.JSONDecoder().raw_decode

    def _more(self):
        data = self.f.read(self.chunk)
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def char(self):
        """The next non-blank character (not consumed), or '' at the end."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def take(self, expected):
        c = self.char()
        if c != expected:
            raise ValueError(f"expected {expected!r} at a JSON position, found {c or 'the end of the file'!r}")
        self.pos += 1

    def value(self):
        """The next JSON value. A value that ends exactly at the buffer's end may be cut (a number): read on."""
        self.char()
        while True:
            try:
                obj, end = self.decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return obj
            except json.JSONDecodeError:
                if self.eof:
                    raise
            if not self._more():
                obj, self.pos = self.decode(self.buf, self.pos)
                return obj

    def array(self):
        """The elements of the array that starts here, one at a time."""
        self.take("[")
        if self.char() == "]":
            self.pos += 1
            return
        while True:
            yield self.value()
            c = self.char()
            if c == "]":
                self.pos += 1
                return
            if c != ",":
                raise ValueError(f"expected ',' or ']' between trace events, found {c or 'the end of the file'!r}")
            self.pos += 1


def iter_events(path, chunk=1 << 20):
    """The trace's events one by one, from a {"traceEvents": [...], ...} object or a bare array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            stream = _Stream(f, chunk)
            first = stream.char()
            if first == "[":
                yield from stream.array()
                return
            if first != "{":
                raise ValueError(f"a Chrome trace starts with '{{' or '[', this file with {first or 'nothing'!r}")
            stream.take("{")
            found = False
            while stream.char() != "}":
                key = stream.value()
                stream.take(":")
                if key == "traceEvents" and stream.char() == "[":
                    found = True
                    yield from stream.array()
                else:
                    stream.value()  # metadata (deviceProperties, baseTimeNanoseconds, ...): not needed
                if stream.char() == ",":
                    stream.pos += 1
            if not found:
                raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise TraceError(f"{path}: not a readable Chrome trace ({type(e).__name__}: {e})") from e


def load_events(path):
    """The whole event list at once (json.load): the reference the streaming reader is checked against."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a readable Chrome trace ({type(e).__name__}: {e})") from e
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    return events


class Trace:
    """What the figures need from a trace, as compact tuples.

    steps: (num, start, end); scopes: {scope: [[start, end], ...]}; scope_ids: {External id: (scope, start)};
    gpu: (kind, start, end, stream, correlation, bytes) with kind kernel, h2d, memcpy or memset;
    runtime: (name, start, end, correlation); annotations: (name, start, end, External id) on GPU tracks;
    threads: {(pid, tid): (starts, ends)} of CPU slices, as arrays of doubles;
    complete: every complete event's track and times, for Perfetto's nesting rule (nesting.Tracks).
    """

    def __init__(self):
        self.steps, self.scopes, self.scope_ids = [], defaultdict(list), {}
        self.loader, self.named = [], defaultdict(list)  # DataLoader annotations; every other user annotation
        self.gpu, self.runtime, self.annotations = [], [], []
        self.gpu_names = {}  # each gpu tuple: its event's name (kernel classes, kernels.py)
        self.comm = set()  # indices into gpu of the communication kernels (NCCL): GPU time, but no compute
        self.threads = defaultdict(lambda: (array("d"), array("d")))
        self.complete = nesting.Tracks()


def extract(events):
    """One pass over the events (a list or a stream), keeping only compact tuples."""
    t = Trace()
    names = {}  # one string object per distinct name
    scopes = set(SCOPES)
    for index, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        t.complete.add_event(index, ev)
        cat = ev.get("cat", "")
        try:
            s = float(ev["ts"])
            e = s + float(ev.get("dur", 0))
        except (KeyError, TypeError, ValueError):
            continue
        if cat in CPU_SLICE_CATS:
            starts, ends = t.threads[(ev.get("pid"), ev.get("tid"))]
            starts.append(s)
            ends.append(e)
            if cat == "python_function" or cat == "cpu_op":
                continue
        name = ev.get("name", "")
        args = ev.get("args") or {}
        if cat == "user_annotation":
            if name.startswith("ProfilerStep#"):
                try:
                    t.steps.append((int(name.split("#", 1)[1]), s, e))
                except ValueError:
                    pass
            elif name in scopes:
                t.scopes[name].append([s, e])
                if args.get("External id") is not None:
                    t.scope_ids[args["External id"]] = (name, s)
            elif name.startswith(LOADER_PREFIX):
                t.loader.append([s, e])
            else:
                t.named[names.setdefault(name, name)].append([s, e])
        elif cat in GPU_CATS:
            if cat == "kernel":
                kind = "kernel"
            elif cat == "gpu_memset":
                kind = "memset"
            else:
                kind = "h2d" if "HtoD" in name else "memcpy"
            stream = args.get("stream", args.get(nesting.OVERLAP_ARG))  # a sibling track's event: its own stream
            t.gpu.append((kind, s, e, stream, args.get("correlation"), args.get("bytes", 0) or 0))
            t.gpu_names[t.gpu[-1]] = names.setdefault(name, name)
            if kind == "kernel" and "nccl" in name.lower():
                t.comm.add(len(t.gpu) - 1)
        elif cat in ("cuda_runtime", "cuda_driver"):
            t.runtime.append((names.setdefault(name, name), s, e, args.get("correlation")))
        elif cat == "gpu_user_annotation":
            t.annotations.append((names.setdefault(name, name), s, e, args.get("External id")))
    t.steps.sort()
    return t


# --------------------------------------------------------------------------- attribution

class _Finder:
    """Which of a set of disjoint [start, end) slices holds a time (steps, or the four scopes of the main thread)."""

    def __init__(self, slices):  # slices: (start, end, label)
        self.slices = sorted(slices)
        self.starts = [s for s, _, _ in self.slices]

    def __call__(self, t):
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and t < self.slices[i][1]:
            return self.slices[i][2]
        return None


def attribute(t):
    """Each GPU event to the step (and scope) that launched it; the leftovers to their own buckets.

    Returns ({step: [(event, scope)]}, {step: [runtime calls]}, before_trace_events, outside_step_events,
    by_clock_count, launch_time) where launch_time(event) is when its launch call started: -inf when it
    was launched before the trace, +inf when unknown (no correlation id).
    """
    in_step = _Finder([(a, b, num) for num, a, b in t.steps])
    in_scope = _Finder([(s, e, name) for name, slices in t.scopes.items() for s, e in slices])
    launched = {}
    runtime_by_step = defaultdict(list)
    for call in t.runtime:
        name, s, e, corr = call
        num = in_step(s)
        if num is not None:
            runtime_by_step[num].append(call)
        if corr is not None:
            launched[corr] = (num, in_scope(s) or OUTSIDE_SCOPES, s)
    by_step, before, outside, by_clock = defaultdict(list), [], [], 0
    for ev in t.gpu:
        corr = ev[4]
        if corr is None:  # no correlation id at all: the only case for the clock
            num, scope = in_step(ev[1]), in_scope(ev[1]) or OUTSIDE_SCOPES
            by_clock += 1
        elif corr in launched:
            num, scope, _ = launched[corr]
        else:
            before.append(ev)
            continue
        if num is None:
            outside.append(ev)
        else:
            by_step[num].append((ev, scope))

    def launch_time(ev):
        if ev[4] is None:
            return float("inf")
        found = launched.get(ev[4])
        return found[2] if found else float("-inf")

    return by_step, runtime_by_step, before, outside, by_clock, launch_time


# --------------------------------------------------------------------------- figures

class Busy:
    """The GPU's merged busy intervals, each with the launch time of the event that opens it."""

    def __init__(self, gpu, launch_time):
        self.merged, self.opened_by = [], []
        self.compute = None  # the merged intervals of all but communication kernels, where the trace has those
        for ev in sorted(gpu, key=lambda ev: ev[1]):
            s, e = ev[1], ev[2]
            if self.merged and s <= self.merged[-1][1]:
                if e > self.merged[-1][1]:
                    self.merged[-1][1] = e
            else:
                self.merged.append([s, e])
                self.opened_by.append(launch_time(ev))
        self.starts = [s for s, _ in self.merged]

    def host_wait(self, idle):
        """The idle intervals during which the GPU waited for the host, whole, as HTA counts them: the work
        that ends the interval was launched after the interval began (its launch latency included). After the
        last GPU event: all of it. An interval ended by work launched before it began is GPU-side (queued)."""
        out = []
        for a, b in idle:
            i = bisect.bisect_left(self.starts, b)
            launch = self.opened_by[i] if i < len(self.starts) else float("inf")
            if launch > a:
                out.append([a, b])
        return out


def idle_figures(busy, span, scopes, inputs, lanes=False):
    """busy, idle, input gap over span (a merged list of [start, end)); scopes: {scope: merged slices};
    inputs: the merged slices of the input source (input_source), or None when the trace has none.

    host wait: idle time while the GPU waited for the host (nothing was queued), split by the scope the
    host was in (waits_by_scope_us; OUTSIDE_SCOPES for the rest). input gap: the host wait inside the input
    source's slices (null without a source). GPU-side gaps between queued kernels are idle, but no wait for
    the host.
    lanes: also the GPU lane as [kind, start, end] segments (busy, input gap, other idle), sorted.
    """
    if not span:
        return None
    length = total(span)
    busy_on = intersect(busy.merged, span)
    idle = union([iv for a, b in span for iv in complement(busy.merged, a, b)])
    idle_us = total(idle)
    waiting = busy.host_wait(idle)
    waits = {n: total(intersect(waiting, scopes[n])) for n in SCOPES}
    waits[OUTSIDE_SCOPES] = max(0.0, total(waiting) - sum(waits.values()))
    gaps = intersect(waiting, inputs) if inputs is not None else []
    gap_us = total(gaps) if inputs is not None else None
    # Communication alone (NCCL kernels with no other GPU work beside them): busy, but waiting on other ranks.
    comm_us = total(busy_on) - total(intersect(busy.compute, span)) if busy.compute is not None else 0.0
    out = {"span_us": length, "busy_us": total(busy_on), "idle_us": idle_us, "comm_only_us": comm_us,
           "idle_share": idle_us / length if length else None, "host_wait_us": total(waiting),
           "waits_by_scope_us": waits, "input_gap_us": gap_us,
           "input_gap_share": None if gap_us is None else (gap_us / idle_us if idle_us else 0.0)}
    if lanes:  # idle drawn as the input gap, the other waits for the host, and idle with work queued
        host = [iv for a, b in waiting for iv in complement(gaps, a, b)]
        queued = [iv for a, b in idle for iv in complement(union(waiting), a, b)]
        out["segments"] = sorted([["busy", a, b] for a, b in busy_on] + [["input gap", a, b] for a, b in gaps] +
                                 [["waiting for the host", a, b] for a, b in host] +
                                 [["other idle", a, b] for a, b in queued], key=lambda seg: seg[1])
    return out


def input_source(t, input_scope=None):
    """Where the step waits for input: --input-scope when given, else the input/next_batch scope, else the
    DataLoader's own annotation. Returns ({"name", "kind", "null_reason"}, merged slices or None)."""
    if input_scope:
        if t.scopes.get(input_scope) or t.named.get(input_scope):
            return ({"name": input_scope, "kind": "--input-scope", "null_reason": None},
                    union(t.scopes.get(input_scope) or t.named[input_scope]))
        return ({"name": input_scope, "kind": "--input-scope",
                 "null_reason": f"no user annotation named {input_scope!r} in the trace"}, None)
    if t.scopes.get(NEXT_BATCH):
        return {"name": NEXT_BATCH, "kind": "scope", "null_reason": None}, union(t.scopes[NEXT_BATCH])
    if t.loader:
        return ({"name": LOADER_PREFIX + "...__next__", "kind": "DataLoader annotation", "null_reason": None},
                union(t.loader))
    return {"name": None, "kind": None, "null_reason": NO_INPUT}, None


def work_figures(mine, runtime, kernels_all):
    """Counts and GPU time of a set of (event, scope) the same launch made: kernels, copies, launches, syncs."""
    events = [ev for ev, _ in mine]
    kernels = [e - s for k, s, e, _, _, _ in events if k == "kernel"]
    h2d = [(s, e, b) for k, s, e, _, _, b in events if k == "h2d"]
    h2d_intervals = union([[s, e] for s, e, _ in h2d])
    by_scope = defaultdict(list)
    for (_, s, e, _, _, _), scope in mine:
        by_scope[scope].append([s, e])
    launches = [(n, e - s) for n, s, e, _ in runtime if n in LAUNCH_CALLS]
    syncs = [e - s for n, s, e, _ in runtime if n in SYNC_CALLS]
    return {
        "gpu_work_us": total(union([[s, e] for _, s, e, _, _, _ in events])),
        "gpu_work_by_scope_us": {scope: total(union(iv)) for scope, iv in sorted(by_scope.items())},
        "h2d": {"count": len(h2d), "bytes": int(sum(b for _, _, b in h2d)), "us": sum(e - s for s, e, _ in h2d),
                "overlapped_with_kernels_us": total(intersect(h2d_intervals, kernels_all))},
        "kernels": {"count": len(kernels),
                    "median_us": statistics.median(kernels) if kernels else None,
                    "share_under_10us": (sum(k < SMALL_KERNEL_US for k in kernels) / len(kernels)
                                         if kernels else None)},
        "other_gpu_events": len(events) - len(kernels) - len(h2d),
        "launch_cpu_us": sum(d for _, d in launches),
        "graph_launches": sum(n in GRAPH_LAUNCH_CALLS for n, _ in launches),
        "sync": {"count": len(syncs), "cpu_us": sum(syncs)},
    }


def bucket(events):
    """A line's worth about GPU events charged to no step (launched before the trace, or between steps)."""
    if not events:
        return {"events": 0, "kernels": 0, "gpu_work_us": 0.0, "first_us": None, "last_us": None}
    return {"events": len(events), "kernels": sum(ev[0] == "kernel" for ev in events),
            "gpu_work_us": total(union([[s, e] for _, s, e, _, _, _ in events])),
            "first_us": min(ev[1] for ev in events), "last_us": max(ev[2] for ev in events)}


TOP_KERNELS = 8  # the window's kernels by summed duration, shown with their class


def kernel_classes(t, events, top=0):
    """The GPU time of events (gpu tuples) by kernel class (kernels.breakdown). Its busy_us is the union of
    the events' intervals, as gpu_work_us counts it: the classes' times sum to the step's GPU work."""
    return kernels.breakdown([(t.gpu_names.get(ev, ""), "kernel" if ev[0] == "kernel" else "gpu_memcpy",
                               ev[1], ev[2]) for ev in events], top=top)


def gpu_slots(steps, by_step):
    """Each step's slot of the GPU timeline: [its first GPU start, the next step's first GPU start).

    Returns {step: [start, end] or None}, and the reason when the slots are undefined. The last step
    with GPU work maps to None: nothing in the trace ends its slot (OPEN_SLOT).
    """
    firsts = [(num, min(ev[1] for ev, _ in by_step[num])) for num, _, _ in steps if by_step.get(num)]
    if not firsts:
        return {}, "no GPU work was launched inside the window"
    if any(b[1] < a[1] for a, b in zip(firsts, firsts[1:])):
        return {}, "a later step's GPU work starts before an earlier step's: the steps' GPU stretches are undefined"
    slots = {num: [f, firsts[i + 1][1]] for i, (num, f) in enumerate(firsts[:-1])}
    slots[firsts[-1][0]] = None
    return slots, None


def summarize_events(events, name="trace", lanes=False, input_scope=None):
    """The evidence of one trace (see the module's docstring). lanes: each step also carries its lanes for a
    picture ({"cpu": [[scope, start, end]], "gpu": [[kind, start, end]] or None}, trace microseconds).
    input_scope: the name of the reader's own record_function around fetching a batch (see input_source).
    """
    t = extract(events)
    if not t.steps:
        raise TraceError(f"{name}: no ProfilerStep#N slices: was it written by torch.profiler with a schedule?")
    has_gpu = bool(t.gpu)
    by_step, runtime_by_step, before, outside, by_clock, launch_time = attribute(t)
    scopes = {n: union(t.scopes.get(n, [])) for n in SCOPES}
    present = {n for n in SCOPES if t.scopes.get(n)}
    source, inputs = input_source(t, input_scope)
    drawn_input = None if source["kind"] == "scope" else inputs  # drawn beside the scopes when not one of them
    busy_all = Busy(t.gpu, launch_time)
    busy_all.compute = union([[ev[1], ev[2]] for i, ev in enumerate(t.gpu) if i not in t.comm]) if t.comm else None
    kernels_all = union([[s, e] for k, s, e, _, _, _ in t.gpu if k == "kernel"])
    walls = [b - a for _, a, b in t.steps]
    window_cpu = [[a, b] for _, a, b in t.steps]
    crossing = crossing_slices(t.threads)
    evidence = {"trace": name, "has_gpu": has_gpu, "notes": [], "caveat": CAVEAT, "input_source": source,
                "scopes_present": [n for n in SCOPES if n in present],
                "crossing_slices": {"count": sum(crossing.values()),
                                    "by_thread": {f"{p}/{tid}": n for (p, tid), n in crossing.items()},
                                    "note": "slices that cross another on the same thread; Perfetto v57.1 "
                                            "or later shows them, older versions drop them"},
                "perfetto_drops": {"count": len(t.complete.dropped()),
                                   "note": "complete events Perfetto's JSON importer before v57.1 drops (they cross "
                                           "another on their pid/tid track); profile mode repairs its traces "
                                           "to 0 (docs/PERFETTO.md)"}}
    cpu_figs = lambda span: {  # noqa: E731  a scope absent from the trace is null, never 0
        "wall_us": sum(b - a for a, b in span),
        "scopes_cpu_us": {n: total(intersect(scopes[n], span)) if n in present else None for n in SCOPES},
        "input_cpu_us": total(intersect(inputs, span)) if inputs is not None else None}
    if not has_gpu:
        nulls = dict(gpu_idle_share=None, input_gap_share=None, gpu_work_us=None, gpu_span_us=None,
                     gpu_null_reason=NO_GPU)
        per_step = [{"step": num, **cpu_figs([[a, b]]), "pace_us": b - a, **nulls} for num, a, b in t.steps]
        if lanes:
            for step, (_, a, b) in zip(per_step, t.steps):
                step["lanes"] = {"cpu_start": a, "cpu": cpu_lane(scopes, a, b, drawn_input), "gpu": None}
        window = {**cpu_figs(window_cpu), "pace_us": sum(walls), **nulls,
                  "steps": len(t.steps), "median_step_us": statistics.median(walls)}
        evidence.update(gpu_idle_share=None, input_gap_share=None, cpu_runs_ahead=False, idle_basis=None,
                        gpu_null_reason=NO_GPU, window=window, steps=per_step,
                        launched_before_trace=None, launched_outside_steps=None, attributed_by_clock=0)
        evidence["verdict"] = verdict(evidence)
        return evidence

    slots, slot_reason = gpu_slots(t.steps, by_step)
    all_mine = [m for num, _, _ in t.steps for m in by_step.get(num, [])]
    window_work = work_figures(all_mine, [r for num, _, _ in t.steps for r in runtime_by_step.get(num, [])],
                               kernels_all)
    cpu_end = max(b for _, _, b in t.steps)
    last_gpu_end = max((ev[2] for ev, _ in all_mine), default=None)
    lag = max(0.0, last_gpu_end - cpu_end) if last_gpu_end is not None else 0.0
    runs_ahead = lag > statistics.median(walls) or window_work["gpu_work_us"] > sum(walls)
    basis = "gpu_timeline" if runs_ahead else "cpu_steps"

    window_span = [[min(ev[1] for ev, _ in all_mine), last_gpu_end]] if all_mine else []
    annotations = defaultdict(float)
    in_step = _Finder([(a, b, n) for n, a, b in t.steps])
    for ann_name, s, e, ext in t.annotations:
        scope = t.scope_ids.get(ext)
        if scope and scope[0] == ann_name:
            num = in_step(scope[1])
            if num is not None:
                annotations[(num, ann_name)] += e - s

    def views(cpu_span, gpu_span, lanes=False):
        cpu = idle_figures(busy_all, cpu_span, scopes, inputs, lanes)
        gpu = idle_figures(busy_all, gpu_span, scopes, inputs, lanes) if gpu_span else None
        return {"cpu_steps": cpu, "gpu_timeline": gpu}

    def fill(out, v, reason):
        chosen = v[basis]
        out["idle"] = v
        for key, src in (("gpu_busy_us", "busy_us"), ("gpu_idle_us", "idle_us"), ("gpu_idle_share", "idle_share"),
                         ("host_wait_us", "host_wait_us"), ("input_gap_us", "input_gap_us"),
                         ("input_gap_share", "input_gap_share"), ("waits_by_scope_us", "waits_by_scope_us"),
                         ("gpu_comm_only_us", "comm_only_us")):
            out[key] = chosen[src] if chosen else None
        out["pace_us"] = chosen["span_us"] if chosen else None
        out["gpu_null_reason"] = None if chosen else reason
        if out["launch_cpu_us"] is not None:
            out["launch_to_busy"] = (out["launch_cpu_us"] / out["gpu_busy_us"]) if out.get("gpu_busy_us") else None

    per_step = []
    for num, a, b in t.steps:
        mine = by_step.get(num, [])
        step = {"step": num, **cpu_figs([[a, b]]), **work_figures(mine, runtime_by_step.get(num, []), kernels_all)}
        step["kernel_classes"] = kernel_classes(t, [ev for ev, _ in mine])
        slot = slots.get(num)
        step["gpu_span_us"] = (slot[1] - slot[0]) if slot else None
        step["gpu_lag_us"] = max(0.0, max(ev[2] for ev, _ in mine) - b) if mine else 0.0
        step["gpu_annotation_us"] = {sc: annotations[(num, sc)] for sc in SCOPES if (num, sc) in annotations}
        reason = (OPEN_SLOT if num in slots else slot_reason) if slot is None else None
        if slot and step["gpu_work_us"] > step["gpu_span_us"] + EPS_US:
            reason = (f"the GPU work this step launched ({step['gpu_work_us']:.1f} us) exceeds its GPU span "
                      f"({step['gpu_span_us']:.1f} us): steps' GPU work overlaps, the per-step GPU span is undefined")
            slot, step["gpu_span_us"] = None, None
        step["gpu_span_null_reason"] = None if slot else (reason or "this step launched no GPU work")
        v = views([[a, b]], [slot] if slot else [], lanes)
        if lanes:
            step["lanes"] = {"cpu_start": a, "cpu": cpu_lane(scopes, a, b, drawn_input),
                             "gpu": v[basis]["segments"] if v[basis] else None}
            for view in v.values():
                if view:
                    view.pop("segments")
        fill(step, v, step["gpu_span_null_reason"])
        per_step.append(step)

    window = {**cpu_figs(window_cpu), **window_work, "gpu_lag_us": lag,
              "gpu_span_us": total(window_span) if window_span else None}
    window["kernel_classes"] = kernel_classes(t, [ev for ev, _ in all_mine], top=TOP_KERNELS)
    window["gpu_span_null_reason"] = None if window_span else "no GPU work was launched inside the window"
    if window_span and window["gpu_work_us"] > window["gpu_span_us"] + EPS_US:  # cannot happen unless a bug
        window["gpu_span_null_reason"] = (
            f"GPU work launched in the window ({window['gpu_work_us']:.1f} us) exceeds its GPU span "
            f"({window['gpu_span_us']:.1f} us): attribution is inconsistent")
        window["gpu_span_us"] = None
    fill(window, views(window_cpu, [[a, b] for a, b in window_span] if window["gpu_span_us"] else []),
         window["gpu_span_null_reason"])
    complete = [num for num, slot in slots.items() if slot]
    window["gpu_slots"] = len(complete)
    window["gpu_slots_span_us"] = sum(slots[num][1] - slots[num][0] for num in complete)
    window["gpu_slots_work_us"] = total(union([[ev[1], ev[2]] for num in complete for ev, _ in by_step[num]]))
    window["gpu_span_per_step_us"] = window["gpu_slots_span_us"] / len(complete) if complete else None
    window["gpu_span_per_step_null_reason"] = None if complete else (slot_reason or OPEN_SLOT)
    if complete and window["gpu_slots_work_us"] > window["gpu_slots_span_us"] + EPS_US:
        window["gpu_span_per_step_us"] = None
        window["gpu_span_per_step_null_reason"] = (
            f"the GPU work of the steps with a complete GPU slot ({window['gpu_slots_work_us']:.1f} us) exceeds "
            f"their slots ({window['gpu_slots_span_us']:.1f} us): steps' GPU work overlaps")
    window.update(steps=len(t.steps), median_step_us=statistics.median(walls))

    pre, out = bucket(before), bucket(outside)
    if runs_ahead:
        evidence["notes"].append(RUN_AHEAD)
    if window_work["graph_launches"]:
        evidence["notes"].append(GRAPHS)
    if pre["events"]:
        evidence["notes"].append(
            f"launched before the trace: {pre['kernels']} kernels and {pre['events'] - pre['kernels']} other GPU "
            f"events ({pre['gpu_work_us'] / 1e3:.2f} ms of GPU time) whose launch call is not in the trace: "
            "charged to no step (Kineto also drops such work that started before the trace began)")
    if out["events"]:
        evidence["notes"].append(f"launched between the steps: {out['kernels']} kernels, "
                                 f"{out['gpu_work_us'] / 1e3:.2f} ms of GPU time, charged to no step")
    evidence.update(
        gpu_idle_share=window["gpu_idle_share"], input_gap_share=window["input_gap_share"],
        cpu_runs_ahead=runs_ahead, idle_basis=basis, gpu_null_reason=window["gpu_null_reason"],
        window=window, steps=per_step, launched_before_trace=pre, launched_outside_steps=out,
        attributed_by_clock=by_clock)
    evidence["verdict"] = verdict(evidence)
    return evidence


def summarize_file(path, lanes=False, input_scope=None):
    return summarize_events(iter_events(path), name=path, lanes=lanes, input_scope=input_scope)


def cpu_lane(scopes, a, b, inputs=None):
    """The four scopes' slices inside one step [a, b), as [scope, start, end], sorted; inputs: an input
    source that is not one of them (the DataLoader's annotation, --input-scope), drawn as "input"."""
    lane = [[n, s, e] for n in SCOPES for s, e in intersect(scopes[n], [[a, b]])]
    lane += [["input", s, e] for s, e in intersect(inputs or [], [[a, b]])]
    return sorted(lane, key=lambda x: x[1])


def pooled_classes(windows, steps):
    """The windows' GPU time by kernel class, pooled: {"kernel_classes": {class: {"ms_per_step", "share"}},
    "gpu_top_classes": the three largest in words}; both null on a CPU-only trace. Shares are of the GPU work
    launched in the windows (the union of its intervals), so they sum to 1."""
    found = [w.get("kernel_classes") for w in windows]
    busy = sum(f["busy_us"] for f in found) if all(found) else 0.0
    if not busy:
        return {"kernel_classes": None, "gpu_top_classes": None}
    pooled = {cls: {"ms_per_step": sum(f["classes"][cls]["us"] for f in found if cls in f["classes"]) / steps / 1e3}
              for cls in kernels.CLASSES if any(cls in f["classes"] for f in found)}
    for c in pooled.values():
        c["share"] = c["ms_per_step"] * steps * 1e3 / busy
    return {"kernel_classes": pooled, "gpu_top_classes": kernels.top_classes(pooled)}


def headline(evidences):
    """The figures logged as Polyaxon outputs, pooled over one or several traces' windows.

    profiled_step_ms is the basis span per step (the CPU's step, or the GPU's when the CPU runs
    ahead); the idle shares come from each window's own basis. gpu_span_ms_per_step is the mean of the
    complete GPU slots (each window's last step has none), null when no window has one;
    gpu_work_ms_per_step is over all steps. Invariant, on the complete slots: the work of the steps that
    have one never exceeds their span; were it to, gpu_work_ms_per_step is null and the reason given.
    """
    if isinstance(evidences, dict):
        evidences = [evidences]
    windows = [ev["window"] for ev in evidences]
    steps = sum(w["steps"] for w in windows)
    out = {"profiled_step_ms": None, "gpu_idle_share": None, "input_gap_share": None,
           "gpu_work_ms_per_step": None, "gpu_span_ms_per_step": None, "cpu_step_ms": None,
           "cpu_runs_ahead": any(ev.get("cpu_runs_ahead") for ev in evidences), "null_reasons": {}}
    out["cpu_step_ms"] = sum(w["wall_us"] for w in windows) / steps / 1e3
    out.update(pooled_classes(windows, steps))
    bases = {ev.get("idle_basis") for ev in evidences}
    out["idle_basis"] = bases.pop() if len(bases) == 1 else "mixed"
    if all(w.get("pace_us") is not None for w in windows):
        out["profiled_step_ms"] = sum(w["pace_us"] for w in windows) / steps / 1e3
    if not all(ev["has_gpu"] for ev in evidences):
        out["null_reasons"]["gpu"] = NO_GPU
        return out
    missing = [w["gpu_null_reason"] for w in windows if w["gpu_null_reason"]]
    if missing:
        out["null_reasons"]["gpu"] = "; ".join(dict.fromkeys(missing))
        return out
    pace = sum(w["pace_us"] for w in windows)
    idle = sum(w["gpu_idle_us"] for w in windows)
    out["gpu_idle_share"] = idle / pace if pace else None
    gap = sum_known(windows, lambda w: w["input_gap_us"])
    if gap is None:
        out["null_reasons"]["input_gap_share"] = "; ".join(dict.fromkeys(
            (ev.get("input_source") or {}).get("null_reason") or NO_INPUT for ev in evidences))
    out["input_gap_share"] = None if gap is None else (gap / idle if idle else 0.0)
    spans = [w["gpu_span_null_reason"] for w in windows if w["gpu_span_null_reason"]]
    if spans:
        out["null_reasons"]["gpu_span_ms_per_step"] = out["null_reasons"]["gpu_work_ms_per_step"] = \
            "; ".join(dict.fromkeys(spans))
        return out
    n_slots = sum(w["gpu_slots"] for w in windows)
    work = sum(w["gpu_work_us"] for w in windows) / steps / 1e3
    overlap = [w["gpu_span_per_step_null_reason"] for w in windows
               if w["gpu_slots"] and w["gpu_span_per_step_us"] is None]
    if overlap:
        out["null_reasons"]["gpu_span_ms_per_step"] = out["null_reasons"]["gpu_work_ms_per_step"] = \
            "; ".join(dict.fromkeys(overlap))
        return out
    if not n_slots:
        out["null_reasons"]["gpu_span_ms_per_step"] = "; ".join(
            dict.fromkeys(w["gpu_span_per_step_null_reason"] for w in windows))
        out["gpu_work_ms_per_step"] = work
        return out
    out["gpu_span_ms_per_step"] = sum(w["gpu_slots_span_us"] for w in windows) / n_slots / 1e3
    slot_work = sum(w["gpu_slots_work_us"] for w in windows) / n_slots / 1e3
    if slot_work > out["gpu_span_ms_per_step"] + EPS_US / 1e3:
        out["null_reasons"]["gpu_work_ms_per_step"] = (
            f"GPU work per complete slot ({slot_work:.3f} ms) exceeds the GPU span per complete slot "
            f"({out['gpu_span_ms_per_step']:.3f} ms)")
    else:
        out["gpu_work_ms_per_step"] = work
    return out


# --------------------------------------------------------------------------- the verdict

# The tutorial's decision rule: the stage that holds the largest part of the step, and what to try next.
# On a GPU trace the parts are the GPU's busy time and its waits for the host, split by the scope the host
# was in (the input gap is the wait inside input/next_batch); on a CPU-only trace, the four scopes' CPU time.
STAGES = {  # part: (stage in the tutorial's words, what shows it with {p} for its share, what to try next)
    "busy": ("GPU compute", "the GPU is busy for {p} of the step",
             "make the GPU's work cheaper or larger (bf16 autocast, channels-last, torch.compile, a larger "
             "batch: see the candidate fixes), then measure with mode=bench"),
    "input": ("waiting for input", "the GPU sits idle while {source} runs for {p} of the step (the input gap)",
              "more DataLoader workers within the job's CPUs (--workers 4; -P workers=4 on Polyaxon), then measure "
              "with mode=bench"),
    "input/to_device": ("copying input to the GPU", "the GPU sits idle while input/to_device runs for {p} of the step",
                        "a side-stream copy (--prefetch-stream) or --gpu-input, then measure with mode=bench"),
    "train/forward_backward": ("host-side launch overhead",
                               "the GPU sits idle waiting for train/forward_backward's kernel launches for {p} of "
                               "the step",
                               "fewer, larger launches (--cuda-graph with --gpu-input, --compile default, a "
                               "larger batch), then measure with mode=bench"),
    "train/optimizer": ("the optimizer", "the GPU sits idle waiting for train/optimizer's launches for {p} of the "
                                         "step",
                        "one fused update kernel (--fused-sgd), then measure with mode=bench"),
    OUTSIDE_SCOPES: ("host work outside the four scopes",
                     "the GPU sits idle waiting for the host outside the four scopes for {p} of the step",
                     "look in the trace at what the CPU runs between the scopes"),
    "queued": ("GPU-side gaps", "the GPU sits idle with work queued for {p} of the step",
               "look for synchronizations in the trace (the sync calls row)"),
    "communication": ("communication between ranks",
                      "the GPU runs nothing but communication kernels (NCCL) for {p} of the step",
                      "find the rank the others wait for (ranks.py OUTPUTS/traces), then overlap communication "
                      "with compute"),
}
CPU_STAGES = {"input": ("waiting for input", STAGES["input"][2]),
              "input/to_device": ("copying input", "look at the copy's CPU cost in the trace"),
              "train/forward_backward": ("CPU compute (forward and backward)",
                                         "profile on a GPU to see what the GPU would do"),
              "train/optimizer": ("the optimizer", "--fused-sgd, or profile on a GPU"),
              OUTSIDE_SCOPES: ("CPU work outside the input", "add the four scopes to the loop to tell it apart")}
HOST_SCOPES = SCOPES[1:]  # the scopes after the input: a GPU wait inside them is no input wait
GPU_BOUND_AT = 0.5  # busy for at least this share of the step: GPU compute holds it; else what the GPU waits for
CLOSE = 0.10  # a runner-up within this share of the step is named beside the stage


def _pct(x):
    return f"{100 * x:.0f}%"


def sum_known(parts, get):
    """The parts' total of a figure, or None when any part lacks it."""
    values = [get(p) for p in parts]
    return None if None in values else sum(values)


def _source(evidences):
    names = {(ev.get("input_source") or {}).get("name") for ev in evidences}
    return names.pop() if len(names) == 1 else None


def verdict(evidences, parts=None):
    """The stage that holds the step, with its share of the step and the figure that shows it.

    evidences: one trace's evidence or several; parts: the figure dicts to pool (default: each trace's
    window; profile mode passes the headline's steps). Returns {"stage", "part", "share", "runner_up",
    "sentence", "next"}; stage is None, and the sentence says why, where the figures cannot tell.
    The input part comes from the trace's input source (input_source): the input/next_batch scope, the
    DataLoader's own annotation, or --input-scope; without one, no input verdict is given.
    """
    if isinstance(evidences, dict):
        evidences = [evidences]
    parts = parts if parts is not None else [ev["window"] for ev in evidences]
    out = {"stage": None, "part": None, "share": None, "runner_up": None, "next": None}
    steps = sum(p.get("steps", 1) for p in parts)
    if steps < 2:
        out["sentence"] = (f"Too short to tell: {steps} profiled step; a verdict needs two or more, so that one "
                           "slow step is not read as the pattern.")
        return out
    source = _source(evidences)
    named = f"the input ({source})" if source and source != NEXT_BATCH else NEXT_BATCH
    has_scopes = all(set(SCOPES) <= set(ev.get("scopes_present", SCOPES)) for ev in evidences)
    wall = sum(p["wall_us"] for p in parts)
    cpu = {"input": sum_known(parts, lambda p: p.get("input_cpu_us", p["scopes_cpu_us"].get(NEXT_BATCH)))}
    if has_scopes:
        cpu.update({n: sum_known(parts, lambda p: p["scopes_cpu_us"][n]) for n in HOST_SCOPES})
    elif cpu["input"] is not None:
        cpu[OUTSIDE_SCOPES] = wall - cpu["input"]
    cpu = {k: v for k, v in cpu.items() if v is not None}
    if not all(ev["has_gpu"] for ev in evidences):
        if not cpu:
            out["sentence"] = (f"Cannot tell: a CPU-only trace without the four scopes or an input source shows "
                               f"neither GPU tracks nor where the CPU's time goes ({NO_INPUT}).")
            return out
        part = max(cpu, key=cpu.get)
        stage, nxt = CPU_STAGES[part]
        out.update(stage=stage, part=part, share=cpu[part] / wall, next=nxt)
        what = named if part == "input" else ("the rest of the step" if part == OUTSIDE_SCOPES else part)
        out["sentence"] = (f"{stage[0].upper()}{stage[1:]} holds the step: {what} takes {_pct(out['share'])} "
                           "of the step's CPU time (a CPU-only trace has no GPU tracks: it cannot tell whether a "
                           f"GPU would wait). Next: {nxt}.")
        return out
    missing = [p.get("gpu_null_reason") for p in parts if p.get("gpu_idle_us") is None or not p.get("pace_us")]
    if missing:
        out["sentence"] = f"Cannot tell which stage holds the step: {'; '.join(dict.fromkeys(map(str, missing)))}."
        return out
    pace = sum(p["pace_us"] for p in parts)
    gap = sum_known(parts, lambda p: p.get("input_gap_us"))
    comm = sum(p.get("gpu_comm_only_us") or 0.0 for p in parts)
    shares = {"busy": sum(p["gpu_busy_us"] for p in parts) / pace - comm / pace}
    if comm:
        shares["communication"] = comm / pace
    waited = sum(p["host_wait_us"] for p in parts)
    host = {n: sum(p["waits_by_scope_us"].get(n, 0.0) for p in parts) for n in HOST_SCOPES} if has_scopes else {}
    if gap is not None:
        shares["input"] = gap / pace
    shares.update({n: v / pace for n, v in host.items()})
    shares[OUTSIDE_SCOPES] = max(0.0, waited - (gap or 0.0) - sum(host.values())) / pace
    shares["queued"] = max(0.0, sum(p["gpu_idle_us"] - p["host_wait_us"] for p in parts) / pace)
    idle_parts = [k for k in shares if k != "busy"]
    part = "busy" if shares["busy"] >= GPU_BOUND_AT else max(idle_parts, key=shares.get)
    if part == OUTSIDE_SCOPES and not has_scopes:
        out["sentence"] = (f"Cannot tell which stage holds the step: the GPU sits idle waiting for the host for "
                           f"{_pct(shares[part])} of it outside the input, and the trace carries none of the four "
                           "scopes, so it cannot say for what (add them to the loop: docs/EVIDENCE.md)."
                           + ("" if gap is not None else f" No input figure: {NO_INPUT}."))
        return out
    stage, shows, nxt = STAGES[part]
    out.update(stage=stage, part=part, share=shares[part], next=nxt)
    second = max((k for k in idle_parts if k != part), key=shares.get)
    close = part != "busy" and shares[part] - shares[second] <= CLOSE and shares[second] > 0
    if close:
        out["runner_up"] = {"stage": STAGES[second][0], "part": second, "share": shares[second]}
    detail = shows.format(p=_pct(shares[part]), source=named)
    if close:
        detail += f", closely followed by {STAGES[second][0]} ({_pct(shares[second])})"
    if part == "busy":
        if shares[second] >= CLOSE:
            detail += f"; its largest wait is {STAGES[second][0]} ({_pct(shares[second])})"
        out["sentence"] = f"GPU compute holds the step: {detail}. Next: {nxt}."
    else:  # the GPU idles for more than half the step: the stage is what it waits for most
        idle = 1 - shares["busy"] - shares.get("communication", 0.0)
        out["sentence"] = (f"The GPU idles for {_pct(idle)} of the step, and {stage} is its largest "
                           f"wait: {detail}. Next: {nxt}.")
    if gap is None:
        out["sentence"] += f" No input figure: {NO_INPUT}."
    elif source and source != NEXT_BATCH:
        out["sentence"] += f" The input is read from {source}."
    return out


# --------------------------------------------------------------------------- printing

def _scope_ms(scope):
    return lambda f: f["gpu_work_by_scope_us"].get(scope, 0.0) / 1e3


ROWS = [  # label, getter, format
    ("step wall ms", lambda f: f["wall_us"] / 1e3, "{:.2f}"),
    *[(f"cpu {n} ms", (lambda n: lambda f: f["scopes_cpu_us"][n] / 1e3)(n), "{:.2f}") for n in SCOPES],
    ("cpu input ms (input source)", lambda f: f["input_cpu_us"] / 1e3, "{:.2f}"),
    ("gpu busy ms", lambda f: f["gpu_busy_us"] / 1e3, "{:.2f}"),
    ("gpu idle ms", lambda f: f["gpu_idle_us"] / 1e3, "{:.2f}"),
    ("gpu idle share", lambda f: f["gpu_idle_share"], "{:.3f}"),
    ("input gap ms", lambda f: f["input_gap_us"] / 1e3, "{:.2f}"),
    ("input gap / idle", lambda f: f["input_gap_share"], "{:.3f}"),
    ("gpu span ms", lambda f: f["gpu_span_us"] / 1e3, "{:.2f}"),
    ("gpu work launched ms", lambda f: f["gpu_work_us"] / 1e3, "{:.2f}"),
    *[(f"  launched in {n} ms", _scope_ms(n), "{:.2f}") for n in SCOPES],
    ("gpu lag after step ms", lambda f: f["gpu_lag_us"] / 1e3, "{:.2f}"),
    ("h2d copies", lambda f: f["h2d"]["count"], "{:d}"),
    ("h2d MB", lambda f: f["h2d"]["bytes"] / 1e6, "{:.2f}"),
    ("h2d ms", lambda f: f["h2d"]["us"] / 1e3, "{:.3f}"),
    ("h2d overlapped ms", lambda f: f["h2d"]["overlapped_with_kernels_us"] / 1e3, "{:.3f}"),
    ("kernels", lambda f: f["kernels"]["count"], "{:d}"),
    ("kernel median us", lambda f: f["kernels"]["median_us"], "{:.1f}"),
    ("kernels < 10us", lambda f: f["kernels"]["share_under_10us"], "{:.3f}"),
    ("launch cpu ms", lambda f: f["launch_cpu_us"] / 1e3, "{:.2f}"),
    ("graph launches", lambda f: f["graph_launches"], "{:d}"),
    ("launch / gpu busy", lambda f: f["launch_to_busy"], "{:.3f}"),
    ("sync calls", lambda f: f["sync"]["count"], "{:d}"),
    ("sync cpu ms", lambda f: f["sync"]["cpu_us"] / 1e3, "{:.2f}"),
]


# The share-of-step column: the CPU scopes over the step's wall time, the GPU's parts over the step's basis span.
SHARES = {**{f"cpu {n} ms": (lambda n: lambda f: f["scopes_cpu_us"][n] / f["wall_us"])(n) for n in SCOPES},
          "cpu input ms (input source)": lambda f: f["input_cpu_us"] / f["wall_us"],
          "gpu busy ms": lambda f: f["gpu_busy_us"] / f["pace_us"],
          "gpu idle ms": lambda f: f["gpu_idle_us"] / f["pace_us"],
          "input gap ms": lambda f: f["input_gap_us"] / f["pace_us"]}


def mean_per_step(window):
    """The window's additive figures divided by its step count (shares and medians stay)."""
    n = window["steps"]
    m = dict(window)
    for k in ("wall_us", "gpu_busy_us", "gpu_idle_us", "input_gap_us", "gpu_work_us", "launch_cpu_us",
              "graph_launches"):
        if m.get(k) is not None:
            m[k] = m[k] / n
    m["gpu_span_us"] = window.get("gpu_span_per_step_us")  # the mean complete slot: the last step has none
    m["scopes_cpu_us"] = {k: None if v is None else v / n for k, v in window["scopes_cpu_us"].items()}
    if m.get("input_cpu_us") is not None:
        m["input_cpu_us"] = m["input_cpu_us"] / n
    if m.get("gpu_work_by_scope_us") is not None:
        m["gpu_work_by_scope_us"] = {k: v / n for k, v in window["gpu_work_by_scope_us"].items()}
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


CLASSES_TITLE = ("GPU time by kernel class (kernels.py) of the GPU work each step launched; "
                 "where kernels overlap, the one that started first keeps the time, so the classes sum to the "
                 "GPU work launched")


def format_classes(evidences):
    """The kernel-class table of GPU traces: one trace, a column per step (ms) and the window's count, median and
    share; several, each window's ms per step and share. Then the top kernels and the names no rule knows."""
    shown = [ev for ev in evidences if ev["has_gpu"] and (ev["window"].get("kernel_classes") or {}).get("busy_us")]
    if not shown:
        return []
    parts = [CLASSES_TITLE]
    present = [c for c in kernels.CLASSES if any(c in ev["window"]["kernel_classes"]["classes"] for ev in shown)]
    if len(evidences) == 1:
        ev = shown[0]
        w, n = ev["window"]["kernel_classes"], ev["window"]["steps"]
        steps = [(s["step"], (s.get("kernel_classes") or {}).get("classes", {})) for s in ev["steps"]]
        header = ["class"] + [f"#{num} ms" for num, _ in steps] + ["mean/step ms", "kernels/step", "median us", "share"]
        rows = [[cls] + [_fmt(c[cls]["us"] / 1e3 if cls in c else 0.0, "{:.3f}") for _, c in steps]
                + ([_fmt(w["classes"][cls]["us"] / n / 1e3, "{:.3f}"), _fmt(w["classes"][cls]["count"] / n, "{:.1f}"),
                    _fmt(w["classes"][cls]["median_us"], "{:.1f}"), _fmt(w["classes"][cls]["share"], "{:.1%}")]
                   if cls in w["classes"] else ["0.000", "0.0", "n/a", "0.0%"]) for cls in present]
        rows.append(["total = gpu work launched"] + [_fmt(s.get("gpu_work_us", 0.0) / 1e3, "{:.3f}") for s in ev["steps"]]
                    + [_fmt(w["busy_us"] / n / 1e3, "{:.3f}"), _fmt(sum(c["count"] for c in w["classes"].values()) / n,
                                                                   "{:.1f}"), "", "100.0%"])
        parts.append(_table(header, rows))
    else:
        header = ["class (ms/step, share)"] + [chr(ord("A") + i) for i, ev in enumerate(evidences) if ev in shown]
        rows = [[cls] + [f"{c['us'] / ev['window']['steps'] / 1e3:.3f} ({c['share']:.1%})" if c else "0"
                         for ev in shown for c in [ev["window"]["kernel_classes"]["classes"].get(cls)]]
                for cls in present]
        parts.append(_table(header, rows))
    for ev in shown:
        w, n = ev["window"]["kernel_classes"], ev["window"]["steps"]
        parts.append(f"{ev['trace']}: kernel time summed {w['kernel_us'] / n / 1e3:.3f} ms/step, of which "
                     f"{w['overlap_us'] / n / 1e3:.3f} ms/step ran beside other GPU work (counted once above)")
        parts.append(f"{ev['trace']}: top kernels (summed duration per step, count per step, class):")
        parts += [f"  {k['us'] / n / 1e3:7.3f} ms  {k['count'] / n:5.1f}  {kernels.SHORT[k['class']]:<15} "
                  f"{k['name'][:100]}" for k in w.get("top", [])]
        if w["other_names"]:
            parts.append(f"{ev['trace']}: no class rule knows {len(w['other_names'])} names (other): "
                         + "; ".join(name[:80] for name in w["other_names"][:5]))
    return parts


def format_table(evidences):
    """One trace: a column per step plus the window. Several: one window column each (B/A for two)."""
    parts = []
    rows_used = ROWS if any(ev["has_gpu"] for ev in evidences) else ROWS[:2 + len(SCOPES)]
    if len(evidences) == 1:
        ev = evidences[0]
        cols = [(f"#{s['step']}", s) for s in ev["steps"]] + [("mean/step", mean_per_step(ev["window"]))]
        header = ["figure"] + [c for c, _ in cols] + ["share of step"]
        rows = [[label] + [_fmt(_value(g, f), fmt) for _, f in cols]
                + ([_fmt(_value(SHARES[label], ev["window"]), "{:.1%}")] if label in SHARES else [""])
                for label, g, fmt in rows_used]
        parts.append(f"verdict: {ev['verdict']['sentence']}")
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
        parts += [f"{chr(ord('A') + i)}: {ev['trace']}\n   verdict: {ev['verdict']['sentence']}"
                  for i, ev in enumerate(evidences)]
    parts.append(_table(header, rows))
    parts += format_classes(evidences)
    for ev in evidences:
        src = ev["input_source"]
        parts.append(f"{ev['trace']}: " + (f"input read from {src['name']} ({src['kind']})" if src["name"] and
                                           not src["null_reason"] else f"no input figures: {src['null_reason']}"))
        absent = [n for n in SCOPES if n not in ev["scopes_present"]]
        if absent:
            parts.append(f"{ev['trace']}: not in the trace, so n/a: {', '.join(absent)}")
        drops = ev.get("perfetto_drops", {}).get("count")
        parts.append(f"{ev['trace']}: " + (f"Perfetto before v57.1 would drop {drops} complete events that cross "
                                           "others on their track (docs/PERFETTO.md)" if drops else
                                           "every complete event nests: every Perfetto version shows them all"))
        if not ev["has_gpu"]:
            parts.append(f"{ev['trace']}: {NO_GPU}")
            continue
        parts.append(f"{ev['trace']}: " + (
            "idle time is read on the GPU's own timeline: the CPU runs ahead of the GPU (idle_basis gpu_timeline)"
            if ev["idle_basis"] == "gpu_timeline" else
            "idle time is read on the CPU's steps: the GPU keeps up with the CPU (idle_basis cpu_steps)"))
        for note in ev["notes"]:
            parts.append(f"{ev['trace']}: {note}")
        for s in ev["steps"]:
            if s["gpu_span_null_reason"] and s["gpu_work_us"]:
                parts.append(f"{ev['trace']}: step #{s['step']}: {s['gpu_span_null_reason']}")
        if ev["crossing_slices"]["count"]:
            parts.append(f"{ev['trace']}: {ev['crossing_slices']['count']} slices overlap others on their thread "
                         "without nesting (with_stack's Python slices): Perfetto before v57.1 drops them; profile mode's "
                         "traces are repaired (docs/PERFETTO.md)")
    parts.append(f"note: {CAVEAT}")
    return "\n".join(parts) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="summarize.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="PyTorch profiler Chrome traces (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print one JSON object per trace, one per line")
    p.add_argument("--input-scope", default=None, metavar="NAME",
                   help="the record_function name your loop puts around fetching a batch, read as the input "
                        "stage (default: input/next_batch if the trace has it, else the DataLoader's own "
                        "enumerate(DataLoader)#... annotation)")
    args = p.parse_args(argv)
    try:
        evidences = [summarize_file(t, input_scope=args.input_scope) for t in args.traces]
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
