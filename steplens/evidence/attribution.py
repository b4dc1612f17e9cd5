"""Per-step attribution: each GPU event to the step and scope that launched it; idle time, input gaps, work.

The definitions: docs/EVIDENCE.md#how-gpu-work-is-attributed and docs/EVIDENCE.md#per-step."""

import bisect
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from steplens.evidence import delays
from steplens.scopes import SCOPES
from steplens.trace import kernels
from steplens.trace.columns import CorrIndex, Merged, merge_sorted, sorted_pairs
from steplens.trace.intervals import Total, complement, gaps, iintersect, intersect, total, union
from steplens.trace.spill import SortedRecords, median
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
    "and with_stack): the trace explains where time goes; the same steps timed without the profiler "
    "measure it"
)


NO_GPU = "no GPU events in the trace (CPU-only profile): GPU figures are not available"


RUN_AHEAD = (
    "the CPU runs ahead of the GPU (GPU-bound): the work a step launches runs during later steps' "
    "CPU time, so clipping GPU time to the CPU's steps would describe the CPU's pace; busy, idle and "
    "input gap are measured on the GPU's own timeline instead"
)


GRAPHS = (
    "CUDA-graph replays: one cudaGraphLaunch starts all of a graph's kernels, so the trace shows no "
    "per-operator CPU launches for them (launch cpu ms counts the graph launches only), and Kineto's "
    "view of graphs has known gaps (pytorch/kineto#1165): time the replays with CUDA events "
    "(torch.cuda.Event around them, outside the profiler)"
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


class ByStep(Mapping):
    """{step: [items]} kept as each step's places in a sequence (and a tag each, from a small table): the items
    are made when a step is read, so the mapping holds 4 bytes an item (6 with a tag), not the items."""

    def __init__(self, seq: Sequence[Any], tagged: bool = False):
        self.seq, self.tagged = seq, tagged
        self.places: dict[int, array] = {}
        self.codes: dict[int, array] = {}
        self.tags: list[Any] = []
        self.tag_codes: dict[Any, int] = {}

    def add(self, num: int, place: int, tag: Any = None) -> None:
        if num not in self.places:
            self.places[num], self.codes[num] = array("i"), array("H")
        self.places[num].append(place)
        if self.tagged:
            code = self.tag_codes.get(tag)
            if code is None:
                code = self.tag_codes[tag] = len(self.tags)
                self.tags.append(tag)
            self.codes[num].append(code)

    def __getitem__(self, num: int) -> list[Any]:
        places, take = self.places[num], getattr(self.seq, "take", None)  # take: the columns' own, in one pass
        items = take(places) if take is not None else [self.seq[i] for i in places]
        if self.tagged:
            tags = self.tags
            return [(item, tags[c]) for item, c in zip(items, self.codes[num])]
        return items

    def __iter__(self) -> Iterator[int]:
        return iter(self.places)

    def __len__(self) -> int:
        return len(self.places)


def attribute(
    t: Trace,
) -> tuple[ByStep, ByStep, list[tuple], list[tuple], int, Callable[[tuple], float]]:
    """Each GPU event to the step (and scope) that launched it; the leftovers to their own buckets.

    Returns ({step: [(event, scope)]}, {step: [runtime calls]}, before_trace_events, outside_step_events,
    by_clock_count, launch_time) where launch_time(event) is when its launch call started: -inf when it
    was launched before the trace, +inf when unknown (no correlation id). The two mappings (ByStep) make
    a step's list when it is read.
    """
    in_step = SliceFinder([(a, b, num) for num, a, b in t.steps])
    in_scope = SliceFinder([(s, e, name) for name, slices in t.scopes.items() for s, e in slices])
    runtime_by_step = ByStep(t.runtime)

    def calls():
        for i, (_, s, _, corr) in enumerate(t.runtime):
            num = in_step(s)
            if num is not None:
                runtime_by_step.add(num, i)
            yield corr, i

    launched = CorrIndex(calls())  # correlation id -> the last call that carries it

    def launch(corr):  # (step, scope, start) of the call that launched corr, or None
        i = launched.get(corr)
        if i is None:
            return None
        s = t.runtime[i][1]
        return in_step(s), in_scope(s) or OUTSIDE_SCOPES, s

    by_step, before, outside, by_clock = ByStep(t.gpu, tagged=True), [], [], 0
    for i, ev in enumerate(t.gpu):
        corr = ev[4]
        if corr is None:  # no correlation id at all: the only case for the clock
            num, scope = in_step(ev[1]), in_scope(ev[1]) or OUTSIDE_SCOPES
            by_clock += 1
        else:
            found = launch(corr)
            if found is None:
                before.append(ev)
                continue
            num, scope, _ = found
        if num is None:
            outside.append(ev)
        else:
            by_step.add(num, i, scope)

    def launch_time(ev):
        if ev[4] is None:
            return float("inf")
        found = launch(ev[4])
        return found[2] if found else float("-inf")

    def launch_end(ev):  # when the launch call returned: the host was still submitting the work until then
        if ev[4] is None:
            return float("inf")
        i = launched.get(ev[4])
        return t.runtime[i][2] if i is not None else float("-inf")

    launch_time.end = launch_end  # read by Busy, for the delays (steplens/evidence/delays.py)
    return by_step, runtime_by_step, before, outside, by_clock, launch_time


class Busy(Merged):
    """The GPU's merged busy intervals (as arrays), each with the launch time of the event that opens it, and when
    that launch call returned (opened_end: launch_time.end where it has one, else the call's start)."""

    def __init__(self, gpu: Sequence[tuple], launch_time: Callable[[tuple], float]):
        super().__init__()
        self.opened_by, self.opened_end = array("d"), array("d")
        launch_end = getattr(launch_time, "end", launch_time)
        self.compute = None  # the merged intervals of all but communication kernels, where the trace has those
        for _, i in sorted_pairs((ev[1], i) for i, ev in enumerate(gpu)):  # by start, file order among equal ones
            ev = gpu[int(i)]
            s, e = ev[1], ev[2]
            if self.ends and s <= self.ends[-1]:
                if e > self.ends[-1]:
                    self.ends[-1] = e
            else:
                self.starts.append(s)
                self.ends.append(e)
                self.opened_by.append(launch_time(ev))
                self.opened_end.append(launch_end(ev))

    @property
    def merged(self) -> list[list[float]]:
        """The merged intervals as a list of [start, end], made when read."""
        return list(self.pairs())

    def host_wait(self, idle: Iterable[Sequence[float]]) -> list[list[float]]:
        """host_waits, as a list."""
        return list(self.host_waits(idle))

    def host_waits(self, idle: Iterable[Sequence[float]]) -> Iterator[list[float]]:
        """The idle intervals during which the GPU waited for the host, whole, as HTA counts them: the work
        that ends the interval was launched after the interval began (its launch latency included). After the
        last GPU event: all of it. An interval ended by work launched before it began is GPU-side (queued)."""
        for a, b in idle:
            if self.waits_for_host(a, b):
                yield [a, b]

    def waits_for_host(self, a: float, b: float) -> bool:
        """Whether the idle interval [a, b) is a wait for the host (host_waits)."""
        i = bisect.bisect_left(self.starts, b)
        return (self.opened_by[i] if i < len(self.starts) else float("inf")) > a


def idle_figures(
    busy: Busy,
    span: list[list[float]],
    scopes: dict[str, list[list[float]]],
    inputs: list[list[float]] | None,
    lanes: bool = False,
    host: Any = None,
) -> dict[str, Any] | None:
    """busy, idle, input gap over span (a merged list of [start, end)); scopes: {scope: merged slices};
    inputs: the merged slices of the input source (input_source), or None when the trace has none.

    host wait: idle time while the GPU waited for the host (nothing was queued), split by the scope the
    host was in (waits_by_scope_us, over the scopes given; OUTSIDE_SCOPES for the rest). input gap: the host
    wait inside the input source's slices (null without a source). GPU-side gaps between queued kernels are
    idle, but no wait for the host.
    lanes: also the GPU lane as [kind, start, end] segments (busy, input gap, other idle), sorted.
    host: delays.HostCalls, for delays_us: the span's time by delay class (steplens/evidence/delays.py).
    """
    if not span:
        return None
    runs = SortedRecords("d", 2)  # the idle intervals, for union's sort; read again for the sums, delays, lanes
    for a, b in span:
        for s, e in gaps(busy.clip(a, b), a, b):
            runs.add((s, e))

    def idle():
        return merge_sorted(runs.read(keep=True))

    def busy_on():  # intersect(busy, span); one interval is a clip, which reads only what reaches into it
        return busy.clip(*span[0]) if len(span) == 1 else iintersect(busy.pairs(), span)

    try:
        out = _idle_out(busy, span, scopes, inputs, busy_on, idle)
        if host is not None:
            causes = delays.idle_causes(busy, idle(), host)
            out["delays_us"] = delays.delays_us(out, causes, delays.copy_alone(host, span))
        if lanes:
            out["segments"] = _segments(list(busy_on()), list(idle()), busy.host_wait(idle()), inputs)
    finally:
        runs.close()
    return out


def _idle_out(busy, span, scopes, inputs, busy_on, idle) -> dict[str, Any]:
    """idle_figures' figures, each summed over the intervals in order as they are made (busy_on, idle: functions
    that give them afresh)."""
    length = total(span)
    others = list(scopes.values()) + ([inputs] if inputs is not None else [])
    idle_us, host_us, overlaps = _idle_sums(busy, idle(), others)
    waits = dict(zip(scopes, overlaps))
    waits[OUTSIDE_SCOPES] = max(0.0, host_us - sum(waits.values()))
    gap_us = overlaps[-1] if inputs is not None else None
    busy_us = total(busy_on())
    # Communication alone (NCCL kernels with no other GPU work beside them): busy, but waiting on other ranks.
    comm_us = busy_us - total(intersect(busy.compute, span)) if busy.compute is not None else 0.0
    return {
        "span_us": length,
        "busy_us": busy_us,
        "idle_us": idle_us,
        "comm_only_us": comm_us,
        "idle_share": idle_us / length if length else None,
        "host_wait_us": host_us,
        "waits_by_scope_us": waits,
        "input_gap_us": gap_us,
        "input_gap_share": None if gap_us is None else (gap_us / idle_us if idle_us else 0.0),
    }


def _idle_sums(busy: Busy, idle: Iterable[Sequence[float]], others: list[Iterable[Sequence[float]]]):
    """(total(idle), total(busy.host_waits(idle)), [total(iintersect(busy.host_waits(idle), o)) for o in others])
    in one pass over idle: each sum adds the same numbers in the same order as those, as sum() adds them
    (intervals.Total), and each intersection steps through its list as iintersect does."""
    idle_us, host_us, sums = Total(), Total(), [Total() for _ in others]
    its = [iter(o) for o in others]
    heads = [next(it, None) for it in its]
    for a, b in idle:
        idle_us.add(b - a)
        if not busy.waits_for_host(a, b):
            continue
        host_us.add(b - a)
        for k, y in enumerate(heads):
            while y is not None:  # iintersect's step, for this interval of host waits
                s, e = max(a, y[0]), min(b, y[1])
                if s < e:
                    sums[k].add(e - s)
                if b < y[1]:
                    break  # the next interval of host waits
                y = next(its[k], None)
            heads[k] = y
    return idle_us.value(), host_us.value(), [t.value() for t in sums]


def _segments(busy_on, idle, waiting, inputs) -> list[list[Any]]:
    """A lane's segments: busy, idle drawn as the input gap, the other waits for the host, and idle with work
    queued, sorted."""
    gaps_ = intersect(waiting, inputs) if inputs is not None else []
    host = [iv for a, b in waiting for iv in complement(gaps_, a, b)]
    queued = [iv for a, b in idle for iv in complement(union(waiting), a, b)]
    return sorted(
        [["busy", a, b] for a, b in busy_on]
        + [["input gap", a, b] for a, b in gaps_]
        + [["waiting for the host", a, b] for a, b in host]
        + [["other idle", a, b] for a, b in queued],
        key=lambda seg: seg[1],
    )


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


def work_figures(
    mine: Iterable[tuple[tuple, str]], runtime: Iterable[tuple], kernels_all: Merged | list[list[float]]
) -> dict[str, Any]:
    """Counts and GPU time of a set of (event, scope) the same launch made: kernels, copies, launches, syncs.
    One pass over each; what needs sorting (unions, the median) goes through spill.SortedRecords, so a whole
    window's events are never held at once. kernels_all: the merged kernel intervals (Merged, or a list)."""
    every, h2d_runs, durations = SortedRecords("d", 2), SortedRecords("d", 2), SortedRecords("d", 1)
    by_scope: dict[str, SortedRecords] = {}
    events = small = h2d_count = h2d_bytes = h2d_us = 0
    for (k, s, e, _, _, b), scope in mine:
        events += 1
        every.add((s, e))
        if scope not in by_scope:
            by_scope[scope] = SortedRecords("d", 2)
        by_scope[scope].add((s, e))
        if k == "kernel":
            durations.add(e - s)
            small += e - s < SMALL_KERNEL_US
        elif k == "h2d":
            h2d_count, h2d_bytes, h2d_us = h2d_count + 1, h2d_bytes + b, h2d_us + (e - s)
            h2d_runs.add((s, e))
    h2d_intervals = merge_sorted(h2d_runs)
    overlap = kernels_all.clip_all(h2d_intervals) if isinstance(kernels_all, Merged) else None
    launches = graph = syncs = 0
    launch_us = sync_us = 0
    for n, s, e, _ in runtime:
        if n in LAUNCH_CALLS:
            launches, launch_us, graph = launches + 1, launch_us + (e - s), graph + (n in GRAPH_LAUNCH_CALLS)
        if n in SYNC_CALLS:
            syncs, sync_us = syncs + 1, sync_us + (e - s)
    kernels = len(durations)
    return {
        "gpu_work_us": total(merge_sorted(every)),
        "gpu_work_by_scope_us": {scope: total(merge_sorted(by_scope[scope])) for scope in sorted(by_scope)},
        "h2d": {
            "count": h2d_count,
            "bytes": int(h2d_bytes),
            "us": h2d_us,
            "overlapped_with_kernels_us": total(
                overlap if overlap is not None else intersect(list(h2d_intervals), kernels_all)
            ),
        },
        "kernels": {
            "count": kernels,
            "median_us": median(durations),
            "share_under_10us": (small / kernels if kernels else None),
        },
        "other_gpu_events": events - kernels - h2d_count,
        "launch_cpu_us": launch_us,
        "graph_launches": graph,
        "sync": {"count": syncs, "cpu_us": sync_us},
    }


TOP_KERNELS = 8  # the window's kernels by summed duration, shown with their class


def kernel_classes(t: Trace, events: Iterable[tuple] | Callable[[], Iterable[tuple]], top: int = 0) -> dict[str, Any]:
    """The GPU time of events (gpu tuples) by kernel class (kernels.breakdown). Its busy_us is the union of
    the events' intervals, as gpu_work_us counts it: the classes' times sum to the step's GPU work.
    events: a list, or a function that gives them afresh (a window's: read twice, never held at once)."""
    fresh = events if callable(events) else (lambda: events)
    return kernels.breakdown(
        lambda: (
            (t.gpu_names.get(ev, ""), "kernel" if ev[0] == "kernel" else "gpu_memcpy", ev[1], ev[2]) for ev in fresh()
        ),
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
        idle = None if busy is None else total(gaps(busy.clip(s, e), s, e))
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
