"""Damaged copies of a real trace, one function per kind of damage: the corpus of tests/test_damage.py.

Each function takes the trace's document ({"traceEvents": [...], ...}) and returns a damaged copy."""

import copy
import math

STEP = "ProfilerStep#"


def _doc(doc, events):
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    out["traceEvents"] = events
    return out


def _complete(doc, keep):
    return [i for i, ev in enumerate(doc["traceEvents"]) if isinstance(ev, dict) and ev.get("ph") == "X" and keep(ev)]


def _edit(doc, keep, change, limit=None):
    """A copy of doc with change(event) applied to the complete events keep() selects (the first limit)."""
    events = copy.deepcopy(doc["traceEvents"])
    picked = _complete(doc, keep)[:limit]
    assert picked, "the damage found nothing to damage: the trace changed"
    for i in picked:
        change(events[i])
    return _doc(doc, events)


def cat(*cats):
    return lambda ev: ev.get("cat") in cats


def named(name):
    return lambda ev: ev.get("name") == name


def written_twice(doc):
    """The trace concatenated with itself: every event appears twice."""
    return _doc(doc, doc["traceEvents"] + copy.deepcopy(doc["traceEvents"]))


def some_written_twice(doc):
    """The GPU's events and the scopes written twice, at the end."""
    extra = [copy.deepcopy(ev) for ev in doc["traceEvents"] if isinstance(ev, dict) and ev.get("ph") == "X"]
    return _doc(doc, doc["traceEvents"] + extra[::3])


def nameless(keep, limit=500):
    return lambda doc: _edit(doc, keep, lambda ev: ev.pop("name"), limit)


def no_ts(keep, limit=None):
    return lambda doc: _edit(doc, keep, lambda ev: ev.pop("ts"), limit)


def negative_dur(keep):
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(dur=-ev["dur"]))


def ts_as_strings(keep, limit=200):
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(ts=repr(ev["ts"])), limit)


def nan_ts(keep, limit=None):
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(ts=math.nan), limit)


def infinite_dur(keep, limit=None):
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(dur=math.inf), limit)


def ts_as_list(keep, limit=None):
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(ts=[ev["ts"]]), limit)


def args_as_list(keep, limit=None):
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(args=[1, 2]), limit)


def moved_far(keep, limit=50):
    """Events moved to ts 0, days before the rest of a trace whose clock reads about 5e12 µs."""
    return lambda doc: _edit(doc, keep, lambda ev: ev.update(ts=0), limit)


def non_objects(doc):
    """1, "x" and null among the events."""
    events = list(doc["traceEvents"])
    for at in (0, len(events) // 2, len(events)):
        events[at:at] = [1, "x", None]
    return _doc(doc, events)


def repeated_step(doc):
    """A second slice named like the first step, one step later."""
    steps = sorted((ev for ev in doc["traceEvents"] if str(ev.get("name", "")).startswith(STEP)), key=lambda e: e["ts"])
    extra = dict(steps[0], ts=steps[-1]["ts"] + steps[-1]["dur"] + 1.0)
    return _doc(doc, doc["traceEvents"] + [extra])


def overlapping_steps(doc):
    """The first step's slice stretched halfway into the next."""
    steps = sorted((ev for ev in doc["traceEvents"] if str(ev.get("name", "")).startswith(STEP)), key=lambda e: e["ts"])
    first, second = steps[0]["name"], steps[1]
    return _edit(doc, named(first), lambda ev: ev.update(dur=second["ts"] - ev["ts"] + second["dur"] / 2))


def dropped_gpu_records(share):
    """The profiler's own damage: the GPU records of the first step's kernels, a share of them, missing."""

    def damage(doc):
        steps = sorted(
            (ev for ev in doc["traceEvents"] if str(ev.get("name", "")).startswith(STEP)), key=lambda e: e["ts"]
        )
        a, b = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
        launched = {
            ev["args"]["correlation"]
            for ev in doc["traceEvents"]
            if isinstance(ev, dict) and ev.get("cat") == "cuda_runtime" and a <= ev["ts"] < b and "args" in ev
        }
        kernels = [
            i
            for i, ev in enumerate(doc["traceEvents"])
            if isinstance(ev, dict) and ev.get("cat") == "kernel" and ev.get("args", {}).get("correlation") in launched
        ]
        drop = set(kernels[: max(1, int(len(kernels) * share))])
        return _doc(doc, [ev for i, ev in enumerate(doc["traceEvents"]) if i not in drop])

    return damage


def _steps(doc):
    return sorted((ev for ev in doc["traceEvents"] if str(ev.get("name", "")).startswith(STEP)), key=lambda e: e["ts"])


def tail_lost(share):
    """The last share of the events gone, the rest still valid JSON (an export cut short, then repaired)."""
    return lambda doc: _doc(doc, doc["traceEvents"][: int(len(doc["traceEvents"]) * (1 - share))])


def zero_length_step(doc):
    """The second step's slice with no length."""
    return _edit(doc, named(_steps(doc)[1]["name"]), lambda ev: ev.update(dur=0))


def step_name_with(text):
    """The second step's name with text in it: "ProfilerStep#\\x003"."""
    return lambda doc: _edit(doc, named(_steps(doc)[1]["name"]), lambda ev: ev.update(name=STEP + text))


def kernel_lasting(dur):
    return lambda doc: _edit(doc, cat("kernel"), lambda ev: ev.update(dur=dur), 1)


def kernels_named(prefix):
    """Every kernel's name with prefix in front (control characters, a lone surrogate)."""
    return lambda doc: _edit(doc, cat("kernel"), lambda ev: ev.update(name=prefix + ev["name"]))


def capture_ends_mid_step(doc):
    """The profiler's capture span ending halfway through the last step."""
    last = _steps(doc)[-1]
    return _edit(doc, cat("Trace"), lambda ev: ev.update(dur=last["ts"] + last["dur"] / 2 - ev["ts"]))


def launches_lost_in_step(index, keep=0.3):
    """Of one step's launch calls, all but the first share gone, with their GPU work."""

    def damage(doc):
        s = _steps(doc)[index]
        a, b = s["ts"], s["ts"] + s["dur"]
        calls = [
            ev for ev in doc["traceEvents"] if ev.get("cat") in ("cuda_runtime", "cuda_driver") and a <= ev["ts"] < b
        ]
        lost = calls[int(len(calls) * keep) :]
        ids = {ev["args"].get("correlation") for ev in lost}
        gone = {id(ev) for ev in lost}
        return _doc(
            doc,
            [
                ev
                for ev in doc["traceEvents"]
                if id(ev) not in gone
                and not (
                    ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and ev["args"].get("correlation") in ids
                )
            ],
        )

    return damage


def launches_lost_from_middle_of_last_step(doc):
    """Every launch call from the middle of the last step on (the profiler's closing synchronize too), with its GPU
    work: a capture whose end lost its launches."""
    last = _steps(doc)[-1]
    middle = last["ts"] + last["dur"] / 2
    lost = {
        ev["args"].get("correlation")
        for ev in doc["traceEvents"]
        if ev.get("cat") in ("cuda_runtime", "cuda_driver") and ev["ts"] >= middle
    }
    runtime_or_gpu = ("cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset")
    return _doc(
        doc,
        [
            ev
            for ev in doc["traceEvents"]
            if not (ev.get("cat") in runtime_or_gpu and (ev.get("args") or {}).get("correlation") in lost)
        ],
    )


GPU_TRACK = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")


def gpu_events_lost_from_middle_of_last_step(doc):
    """Every GPU event that starts after the middle of the last step gone; the launch calls, the CPU's events and
    the capture span kept (a tail cut that kept the capture's bounds)."""
    last = _steps(doc)[-1]
    middle = last["ts"] + last["dur"] / 2
    return _doc(doc, [ev for ev in doc["traceEvents"] if not (ev.get("cat") in GPU_TRACK and ev["ts"] >= middle)])


def gpu_events_all_lost(doc):
    """Every GPU event gone, the launch calls kept: read as is, a CPU-only trace."""
    return _doc(doc, [ev for ev in doc["traceEvents"] if ev.get("cat") not in GPU_TRACK])


def without_steps(then=None):
    """The ProfilerStep slices gone (read as one window), then the damage then (if any)."""

    def damage(doc):
        out = _doc(doc, [ev for ev in doc["traceEvents"] if not str(ev.get("name", "")).startswith(STEP)])
        return then(out) if then else out

    return damage


def op_lasting(dur):
    return lambda doc: _edit(doc, cat("cpu_op"), lambda ev: ev.update(dur=dur), 1)


def _second(doc, dt=0.0, pid=None, span=True):
    """A copy of the trace's events, dt µs later, its steps numbered 100 higher, its correlation ids 10^7 higher;
    its CPU events on pid (where given); its capture span kept or not."""
    cpu_pids = {ev.get("pid") for ev in doc["traceEvents"] if ev.get("cat") in ("cpu_op", "user_annotation")}
    out = []
    for ev in copy.deepcopy(doc["traceEvents"]):
        if not isinstance(ev, dict) or (ev.get("cat") == "Trace" and not span):
            continue
        if isinstance(ev.get("ts"), (int, float)):
            ev["ts"] += dt
        if str(ev.get("name", "")).startswith(STEP):
            ev["name"] = f"{STEP}{int(ev['name'][len(STEP) :]) + 100}"
        if isinstance(ev.get("args"), dict) and "correlation" in ev["args"]:
            ev["args"]["correlation"] += 10**7
        if pid is not None and ev.get("pid") in cpu_pids:
            ev["pid"] = pid
        out.append(ev)
    return out


def second_capture(doc):
    """A second capture appended: the trace again, starting 1 ms after its capture span ends, steps renumbered."""
    span = next(ev for ev in doc["traceEvents"] if ev.get("cat") == "Trace")
    return _doc(doc, doc["traceEvents"] + _second(doc, dt=span["dur"] + 1000.0))


def second_process(doc):
    """A second process's events merged in: the trace again at the same times on another pid, steps renumbered,
    without a capture span of its own."""
    return _doc(doc, doc["traceEvents"] + _second(doc, pid=424242, span=False))


def step_in_ns(index):
    """One step's length written in ns: 1000 times as long, its events untouched."""
    return lambda doc: _edit(doc, named(_steps(doc)[index]["name"]), lambda ev: ev.update(dur=ev["dur"] * 1000))


def kernels_again_shifted(share, shift=1.0):
    """A share of the kernels written a second time, shift µs later (so no exact duplicate), same correlation id."""

    def damage(doc):
        kernels = [ev for ev in doc["traceEvents"] if ev.get("cat") == "kernel"]
        again = [dict(ev, ts=ev["ts"] + shift) for ev in kernels[:: int(1 / share)]]
        return _doc(doc, doc["traceEvents"] + again)

    return damage


def without_correlation(keep):
    """The correlation id gone from the args of the events keep() selects."""
    return lambda doc: _edit(doc, keep, lambda ev: ev["args"].pop("correlation"))
