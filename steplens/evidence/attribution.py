"""Per-step attribution: each GPU event to the step and scope that launched it; idle time, input gaps, work.

The definitions: docs/EVIDENCE.md#how-gpu-work-is-attributed and docs/EVIDENCE.md#per-step."""

import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from steplens.scopes import SCOPES
from steplens.trace import kernels
from steplens.trace.intervals import complement, intersect, total, union
from steplens.trace.timeline import GRAPH_LAUNCH_CALLS, LAUNCH_CALLS, LOADER_PREFIX, SYNC_CALLS, Trace

SMALL_KERNEL_US = 10.0


OPEN_SLOT = (
    "the last traced step has no next step to end its GPU slot (a slot runs from the step's first "
    "GPU event to the next step's first)"
)


EPS_US = 0.01  # exported timestamps carry ns decimals: sums of a few thousand of them stay well within this


OUTSIDE_SCOPES = "(outside the four scopes)"


NO_INPUT = (
    "the trace has no input/next_batch scope, no DataLoader annotation (enumerate(DataLoader)#...) and no "
    "--input-scope: where the step waits for input cannot be told"
)


CAVEAT = (
    "the profiler adds its own cost to the profiled process (more with record_shapes, profile_memory "
    "and with_stack): the trace explains where time goes, mode=bench measures it; profile mode's "
    "profiler_distortion says how far the profiled steps moved from unprofiled ones"
)


NO_GPU = "no GPU events in the trace (CPU-only profile): GPU figures are not available"


RUN_AHEAD = (
    "the CPU runs ahead of the GPU (GPU-bound): the work a step launches runs during later steps' "
    "CPU time, so clipping GPU time to the CPU's steps would describe the CPU's pace; busy, idle and "
    "input gap are measured on the GPU's own timeline instead (idle_basis gpu_timeline)"
)


GRAPHS = (
    "CUDA-graph replays: one cudaGraphLaunch starts all of a graph's kernels, so the trace shows no "
    "per-operator CPU launches for them (launch cpu ms counts the graph launches only), and Kineto's "
    "view of graphs has known gaps (pytorch/kineto#1165): time replays with CUDA events "
    "(train.py --mode bench --cuda-graph: gpu_ms_per_step)"
)


class SliceFinder:
    """Which of a set of disjoint [start, end) slices holds a time (steps, or the four scopes of the main thread)."""

    def __init__(self, slices: Iterable[tuple[float, float, Any]]):  # slices: (start, end, label)
        self.slices = sorted(slices)
        self.starts = [s for s, _, _ in self.slices]

    def __call__(self, t):
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and t < self.slices[i][1]:
            return self.slices[i][2]
        return None


def attribute(
    t: Trace,
) -> tuple[
    dict[int, list[tuple[tuple, str]]], dict[int, list[tuple]], list[tuple], list[tuple], int, Callable[[tuple], float]
]:
    """Each GPU event to the step (and scope) that launched it; the leftovers to their own buckets.

    Returns ({step: [(event, scope)]}, {step: [runtime calls]}, before_trace_events, outside_step_events,
    by_clock_count, launch_time) where launch_time(event) is when its launch call started: -inf when it
    was launched before the trace, +inf when unknown (no correlation id).
    """
    in_step = SliceFinder([(a, b, num) for num, a, b in t.steps])
    in_scope = SliceFinder([(s, e, name) for name, slices in t.scopes.items() for s, e in slices])
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


class Busy:
    """The GPU's merged busy intervals, each with the launch time of the event that opens it."""

    def __init__(self, gpu: Iterable[tuple], launch_time: Callable[[tuple], float]):
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

    def host_wait(self, idle: Iterable[Sequence[float]]) -> list[list[float]]:
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


def idle_figures(
    busy: Busy,
    span: list[list[float]],
    scopes: dict[str, list[list[float]]],
    inputs: list[list[float]] | None,
    lanes: bool = False,
) -> dict[str, Any] | None:
    """busy, idle, input gap over span (a merged list of [start, end)); scopes: {scope: merged slices};
    inputs: the merged slices of the input source (input_source), or None when the trace has none.

    host wait: idle time while the GPU waited for the host (nothing was queued), split by the scope the
    host was in (waits_by_scope_us, over the scopes given; OUTSIDE_SCOPES for the rest). input gap: the host
    wait inside the input source's slices (null without a source). GPU-side gaps between queued kernels are
    idle, but no wait for the host.
    lanes: also the GPU lane as [kind, start, end] segments (busy, input gap, other idle), sorted.
    """
    if not span:
        return None
    length = total(span)
    busy_on = intersect(busy.merged, span)
    idle = union([iv for a, b in span for iv in complement(busy.merged, a, b)])
    idle_us = total(idle)
    waiting = busy.host_wait(idle)
    waits = {n: total(intersect(waiting, scopes[n])) for n in scopes}
    waits[OUTSIDE_SCOPES] = max(0.0, total(waiting) - sum(waits.values()))
    gaps = intersect(waiting, inputs) if inputs is not None else []
    gap_us = total(gaps) if inputs is not None else None
    # Communication alone (NCCL kernels with no other GPU work beside them): busy, but waiting on other ranks.
    comm_us = total(busy_on) - total(intersect(busy.compute, span)) if busy.compute is not None else 0.0
    out = {
        "span_us": length,
        "busy_us": total(busy_on),
        "idle_us": idle_us,
        "comm_only_us": comm_us,
        "idle_share": idle_us / length if length else None,
        "host_wait_us": total(waiting),
        "waits_by_scope_us": waits,
        "input_gap_us": gap_us,
        "input_gap_share": None if gap_us is None else (gap_us / idle_us if idle_us else 0.0),
    }
    if lanes:  # idle drawn as the input gap, the other waits for the host, and idle with work queued
        host = [iv for a, b in waiting for iv in complement(gaps, a, b)]
        queued = [iv for a, b in idle for iv in complement(union(waiting), a, b)]
        out["segments"] = sorted(
            [["busy", a, b] for a, b in busy_on]
            + [["input gap", a, b] for a, b in gaps]
            + [["waiting for the host", a, b] for a, b in host]
            + [["other idle", a, b] for a, b in queued],
            key=lambda seg: seg[1],
        )
    return out


def input_source(
    t: Trace, input_scope: str | None = None, names: tuple[str, ...] = SCOPES
) -> tuple[dict[str, Any], list[list[float]] | None]:
    """Where the step waits for input: --input-scope when given, else the input scope of the trace's scope set
    (names[0]: input/next_batch, or eval/next_batch in a validation capture), else the DataLoader's own
    annotation. Returns ({"name", "kind", "null_reason"}, merged slices or None)."""
    if input_scope:
        if t.scopes.get(input_scope) or t.named.get(input_scope):
            return (
                {"name": input_scope, "kind": "--input-scope", "null_reason": None},
                union(t.scopes.get(input_scope) or t.named[input_scope]),
            )
        return (
            {
                "name": input_scope,
                "kind": "--input-scope",
                "null_reason": f"no user annotation named {input_scope!r} in the trace",
            },
            None,
        )
    if t.scopes.get(names[0]):
        return {"name": names[0], "kind": "scope", "null_reason": None}, union(t.scopes[names[0]])
    if t.loader:
        return (
            {"name": LOADER_PREFIX + "...__next__", "kind": "DataLoader annotation", "null_reason": None},
            union(t.loader),
        )
    return {"name": None, "kind": None, "null_reason": NO_INPUT}, None


def work_figures(mine: list[tuple[tuple, str]], runtime: list[tuple], kernels_all: list[list[float]]) -> dict[str, Any]:
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
        "h2d": {
            "count": len(h2d),
            "bytes": int(sum(b for _, _, b in h2d)),
            "us": sum(e - s for s, e, _ in h2d),
            "overlapped_with_kernels_us": total(intersect(h2d_intervals, kernels_all)),
        },
        "kernels": {
            "count": len(kernels),
            "median_us": statistics.median(kernels) if kernels else None,
            "share_under_10us": (sum(k < SMALL_KERNEL_US for k in kernels) / len(kernels) if kernels else None),
        },
        "other_gpu_events": len(events) - len(kernels) - len(h2d),
        "launch_cpu_us": sum(d for _, d in launches),
        "graph_launches": sum(n in GRAPH_LAUNCH_CALLS for n, _ in launches),
        "sync": {"count": len(syncs), "cpu_us": sum(syncs)},
    }


TOP_KERNELS = 8  # the window's kernels by summed duration, shown with their class


def kernel_classes(t: Trace, events: Iterable[tuple], top: int = 0) -> dict[str, Any]:
    """The GPU time of events (gpu tuples) by kernel class (kernels.breakdown). Its busy_us is the union of
    the events' intervals, as gpu_work_us counts it: the classes' times sum to the step's GPU work."""
    return kernels.breakdown(
        [(t.gpu_names.get(ev, ""), "kernel" if ev[0] == "kernel" else "gpu_memcpy", ev[1], ev[2]) for ev in events],
        top=top,
    )


def gpu_slots(
    steps: list[tuple[int, float, float]], by_step: dict[int, list[tuple[tuple, str]]]
) -> tuple[dict[int, list[float] | None], str | None]:
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


def cpu_lane(
    scopes: dict[str, list[list[float]]], a: float, b: float, inputs: list[list[float]] | None = None
) -> list[list[Any]]:
    """The scopes' slices inside one step [a, b), as [scope, start, end], sorted; inputs: an input source
    that is not one of them (the DataLoader's annotation, --input-scope), drawn as "input"."""
    lane = [[n, s, e] for n in scopes for s, e in intersect(scopes[n], [[a, b]])]
    lane += [["input", s, e] for s, e in intersect(inputs or [], [[a, b]])]
    return sorted(lane, key=lambda x: x[1])


def pooled_classes(windows: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The windows' GPU time by kernel class, pooled: {"kernel_classes": {class: {"ms_per_step", "share"}},
    "gpu_top_classes": the three largest in words}; both null on a CPU-only trace. Shares are of the GPU work
    launched in the windows (the union of its intervals), so they sum to 1."""
    found = [w.get("kernel_classes") for w in windows]
    busy = sum(f["busy_us"] for f in found) if all(found) else 0.0
    if not busy:
        return {"kernel_classes": None, "gpu_top_classes": None}
    pooled = {
        cls: {"ms_per_step": sum(f["classes"][cls]["us"] for f in found if cls in f["classes"]) / steps / 1e3}
        for cls in kernels.CLASSES
        if any(cls in f["classes"] for f in found)
    }
    for c in pooled.values():
        c["share"] = c["ms_per_step"] * steps * 1e3 / busy
    return {"kernel_classes": pooled, "gpu_top_classes": kernels.top_classes(pooled)}


def save_figures(
    steps: list[tuple[int, float, float]], saves: list[list[float]], busy: Busy | None
) -> list[dict[str, Any]]:
    """Each checkpoint/save slice: the step that holds it, its length, its share of that step, and the GPU's
    idle time during it (busy: the GPU's merged busy time; None on a CPU-only trace, where the idle is null).
    Invariant: idle_us <= save_us <= the step's wall time."""
    in_step = SliceFinder([(a, b, (num, b - a)) for num, a, b in steps])
    out = []
    for s, e in sorted(saves):
        held = in_step(s)
        idle = None if busy is None else total(complement(busy.merged, s, e))
        out.append(
            {
                "step": held[0] if held else None,
                "save_us": e - s,
                "share_of_step": (e - s) / held[1] if held and held[1] else None,
                "gpu_idle_us": idle,
                "gpu_idle_null_reason": NO_GPU if busy is None else None,
            }
        )
    return out
