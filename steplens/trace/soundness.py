"""What a sound capture holds, checked after the read: passes over the timeline's columns, never per event.

Each check counts one kind of damage in t.damage (steplens/trace/damage.py says what each kind is and what was
done); docs/EVIDENCE.md#damaged-traces gives the rules."""

from steplens.trace import columns, timeline


def check(t: "timeline.Trace") -> None:
    """Every check below, on a timeline just read."""
    several_captures(t)
    gpu_stops_early(t)
    window_past_capture(t)


# The kinds that mean a file holds more than one capture: read together, their steps and GPU work would be summed.
MERGED = ("several_captures", "several_processes")


def several_captures(t: "timeline.Trace") -> None:
    """One file, one capture: the profiler writes one capture span, and its CPU events come from one process
    (DataLoader workers never appear: docs/EVIDENCE.md). A second span, or CPU events of a second process, is a
    second capture merged in."""
    for s, e in sorted(set(t.captures))[1:]:
        t.damage.add("several_captures", {"name": "PyTorch Profiler", "ts": s, "dur": e - s}, True)
    pids = list(dict.fromkeys(pid for pid, _ in t.threads.threads()))
    for pid in pids[1:]:
        t.damage.add("several_processes", {"pid": pid, "first_pid": pids[0]}, True)


def gpu_stops_early(t: "timeline.Trace") -> None:
    """Kernel launches that start after the GPU's last event ends, with no GPU record: the GPU's events stop
    before the launches do. A kernel runs after its launch starts, so a sound trace has none. Launch calls are
    recorded by the same GPU tracer (CUPTI, roctracer) as the GPU's events: a trace with them had the GPU traced,
    even where no GPU event is left."""
    last_gpu = max(t.gpu.end, default=float("-inf"))
    ids = columns.CorrIndex((corr, i) for i, corr in enumerate(t.gpu.corr))
    for name, s, e, corr in t.runtime:
        if name in timeline.LAUNCH_CALLS and s > last_gpu and corr not in ids:
            ev = {"name": name, "ts": s, "dur": e - s, "correlation": corr, "last_gpu_event_end": last_gpu}
            t.damage.add("gpu_stops_early", ev, True)


def window_past_capture(t: "timeline.Trace") -> None:
    """A trace without steps is read as one window, the span of its CPU events: every one of them must lie inside
    the profiler's capture, as steps must (timeline.coverage_damage checks the GPU's events). A CPU event past it
    (a cpu_op 10^9 us long) would stretch the window and thin every share. Without a capture span nothing bounds
    the window but the events themselves: no check."""
    if t.steps or not t.captures or t.cpu_span is None:
        return
    s, e = t.cpu_span
    slack = timeline.STEP_SLACK_US
    if not any(a - slack <= s and e <= b + slack for a, b in t.captures):
        ev = {"name": "the window", "ts": s, "dur": e - s, "captures": sorted(t.captures)}
        t.damage.add("window_past_capture", ev, True)
