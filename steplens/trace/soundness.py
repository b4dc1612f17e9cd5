"""What a sound capture holds, checked after the read: passes over the timeline's columns, never per event.

Each check counts one kind of damage in t.damage (steplens/trace/damage.py says what each kind is and what was
done); docs/DAMAGE.md gives the rules."""

import bisect
from typing import Any

from steplens.trace import calls, columns


def check_steps(t: Any) -> None:
    """The checks that change which steps are read: before timeline.step_damage and coverage_damage read them."""
    steps_in_ns(t)


def check(t: Any) -> None:
    """Every other check below, on a timeline just read."""
    several_captures(t)
    no_correlation(t)
    gpu_stops_early(t)
    repeated_gpu_records(t)
    window_past_capture(t)


# The kinds that mean a file holds more than one capture: read together, their steps and GPU work would be summed.
MERGED = ("several_captures", "several_processes")


def several_captures(t: Any) -> None:
    """One file, one capture: the profiler writes one capture span, and its CPU events come from one process
    (DataLoader workers never appear: docs/EVIDENCE.md). A second span, or CPU events of a second process, is a
    second capture merged in."""
    for s, e in sorted(set(t.captures))[1:]:
        t.damage.add("several_captures", {"name": "PyTorch Profiler", "ts": s, "dur": e - s}, True)
    pids = list(dict.fromkeys(pid for pid, _ in t.threads.threads() if pid is not None))  # none: no process named
    for pid in pids[1:]:
        t.damage.add("several_processes", {"pid": pid, "first_pid": pids[0]}, True)


def no_correlation(t: Any) -> None:
    """GPU events without a correlation id: the profiler writes one on each, the id of its launch. The clock then
    places them (attribution.attribute). Where launches are left without a GPU record, the ids would have matched
    them, and those launches would read as dropped by the profiler: the events touch the figures there."""
    missing = [i for i, corr in enumerate(t.gpu.corr) if corr is None]
    if not missing:
        return
    ids = columns.CorrIndex((corr, i) for i, corr in enumerate(t.gpu.corr))
    work = calls.WORK_CALLS - calls.MEMSET_CALLS
    unmatched = any(name in work and corr not in ids for name, _, _, corr in t.runtime)
    for i in missing:
        ev = {"name": t.gpu.name(i), "ts": t.gpu.start[i], "dur": t.gpu.end[i] - t.gpu.start[i]}
        t.damage.add("no_correlation", ev, unmatched)


def gpu_stops_early(t: Any) -> None:
    """Kernel launches that start after the GPU's last event ends, with no GPU record: the GPU's events stop
    before the launches do. A kernel runs after its launch starts, so a sound trace has none. Launch calls are
    recorded by the same GPU tracer (CUPTI, roctracer) as the GPU's events: a trace with them had the GPU traced,
    even where no GPU event is left."""
    last_gpu = max(t.gpu.end, default=float("-inf"))
    ids = columns.CorrIndex((corr, i) for i, corr in enumerate(t.gpu.corr))
    for name, s, e, corr in t.runtime:
        if name in calls.LAUNCH_CALLS and s > last_gpu and corr not in ids:
            ev = {"name": name, "ts": s, "dur": e - s, "correlation": corr, "last_gpu_event_end": last_gpu}
            t.damage.add("gpu_stops_early", ev, True)


def window_past_capture(t: Any) -> None:
    """A trace without steps is read as one window, the span of its CPU events: every one of them must lie inside
    the profiler's capture, as steps must (timeline.coverage_damage checks the GPU's events). A CPU event past it
    (a cpu_op 10^9 us long) would stretch the window and thin every share. Without a capture span nothing bounds
    the window but the events themselves: no check."""
    if t.steps or not t.captures or t.cpu_span is None:
        return
    s, e = t.cpu_span
    slack = calls.STEP_SLACK_US
    if not any(a - slack <= s and e <= b + slack for a, b in t.captures):
        ev = {"name": "the window", "ts": s, "dur": e - s, "captures": sorted(t.captures)}
        t.damage.add("window_past_capture", ev, True)


NS_RATIO = (300, 3000)  # a step this many times its siblings' median length: 1000x, a length in ns read as µs
NS_CONTENT = 10  # ...while what starts in it ends within this many median steps: its own events are in µs


def steps_in_ns(t: Any) -> None:
    """A step about 1000 times as long as its siblings' median, whose own events (scopes, annotations, launch calls
    that start in it, up to the next step) end within a few median steps: its length was written in ns. Its length
    is unknown, so the step is left out of the steps; its events then read as outside every step."""
    if len(t.steps) < 2:
        return
    walls = sorted(e - s for _, s, e in t.steps)
    starts = sorted(s for _, s, _ in t.steps)
    middle = (len(walls) - 1) // 2  # the median's place among the others, the step's own length left out
    lost = set()
    for i, (num, s, e) in enumerate(t.steps):
        median = walls[middle] if middle < bisect.bisect_left(walls, e - s) else walls[middle + 1]
        if not NS_RATIO[0] * median <= e - s <= NS_RATIO[1] * median:
            continue
        k = bisect.bisect_right(starts, s)
        until = min(e, starts[k]) if k < len(starts) else e
        # A length in ns runs into the next step, or (the last step) past the capture's end: a long stall of the
        # host's own (a save, a sleep) ends before both, and is a step to read, not a unit error.
        overruns = e > starts[k] if k < len(starts) else not t.captures or e > max(b for _, b in t.captures)
        ends = [b for a, b in _content(t) if s <= a < until]
        if overruns and ends and max(ends) <= s + NS_CONTENT * median:
            t.damage.add(
                "step_in_ns", {"name": f"ProfilerStep#{num}", "ts": s, "dur": e - s, "siblings": median}, False
            )
            lost.add(i)
    t.steps = [step for i, step in enumerate(t.steps) if i not in lost]


def _content(t: Any):
    """(start, end) of the CPU-side events the timeline keeps: scopes, other annotations, launch calls."""
    for slices in (*t.scopes.values(), *t.named.values(), t.loader):
        yield from slices
    yield from zip(t.runtime.start, t.runtime.end)


def repeated_gpu_records(t: Any) -> None:
    """GPU events that share one launch's correlation id, where that launch is no graph launch: a kernel launch, a
    copy or a memset puts one record on the GPU, so the second is a copy (with a shifted start, else the reader
    removed it as a duplicate). A graph launch's id is on every kernel of its graph."""
    seen, repeated = set(), {}
    for i, corr in enumerate(t.gpu.corr):
        if corr is None:
            continue
        if corr in seen:
            repeated.setdefault(corr, []).append(i)
        seen.add(corr)
    if not repeated:
        return
    launches = {corr: name for name, _, _, corr in t.runtime if corr in repeated}
    for corr, extra in repeated.items():
        if corr not in launches or launches[corr] in calls.GRAPH_LAUNCH_CALLS:
            continue  # launched before the trace (a graph's, maybe), or a graph launch
        for i in extra:
            ev = {
                "name": t.gpu.name(i),
                "ts": t.gpu.start[i],
                "dur": t.gpu.end[i] - t.gpu.start[i],
                "correlation": corr,
            }
            t.damage.add("repeated_gpu_record", ev, True)
