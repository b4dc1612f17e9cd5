"""steplens summarize: the evidence of PyTorch profiler traces, and which stage holds the step.

    steplens summarize TRACE                     # per-step table, the window and the verdict
    steplens summarize A B                       # two traces side by side
    steplens summarize TRACE --json              # one JSON object per trace
    steplens summarize TRACE --roofline          # also each kernel class against the GPU's limits
    steplens summarize TRACE --input-scope NAME  # your own loop's record_function around fetching a batch

Every figure is defined once in docs/EVIDENCE.md."""

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from steplens.evidence import delays
from steplens.evidence.attribution import (
    CAVEAT,
    EPS_US,
    GRAPHS,
    NO_GPU,
    OPEN_SLOT,
    RUN_AHEAD,
    TOP_KERNELS,
    Busy,
    SliceFinder,
    attribute,
    cpu_lane,
    gpu_slots,
    idle_figures,
    input_source,
    kernel_classes,
    save_figures,
    work_figures,
)
from steplens.evidence.diagnosis import verdict
from steplens.evidence.formatting import format_brief, format_table
from steplens.evidence.roofline import device_of, format_roofline, read_with_operators, roofline
from steplens.scopes import SAVE, scope_set
from steplens.text import say, write
from steplens.trace import memory, soundness
from steplens.trace.columns import CorrIndex, Merged, merge_sorted, sorted_pairs
from steplens.trace.intervals import intersect, total, union
from steplens.trace.reader import TraceError, iter_events
from steplens.trace.timeline import MEMSET_CALLS, WORK_CALLS, Tap, Trace, bucket, read


class _Reading:
    """What every stage of summarize_events reads: the trace's timeline, its attribution and its scopes."""

    def __init__(self, t, input_scope):
        self.t = t
        (self.by_step, self.runtime_by_step, self.before, self.outside, self.by_clock, self.launch_time) = attribute(t)
        self.names = scope_set({n for n, slices in t.scopes.items() if slices})  # the phase's scopes
        self.scopes = {n: union(t.scopes.get(n, [])) for n in self.names}
        self.present = {n for n in self.names if t.scopes.get(n)}
        self.source, self.inputs = input_source(t, input_scope, self.names)
        # the input is drawn beside the scopes when it is not one of them
        self.drawn_input = None if self.source["kind"] == "scope" else self.inputs
        self.busy = Busy(t.gpu, self.launch_time)
        self.busy.compute = union([[ev[1], ev[2]] for i, ev in enumerate(t.gpu) if i not in t.comm]) if t.comm else None
        self.kernels = Merged(merge_sorted(sorted_pairs((s, e) for k, s, e, _, _, _ in t.gpu if k == "kernel")))
        self.walls = [b - a for _, a, b in t.steps]
        self.window_cpu = [[a, b] for _, a, b in t.steps]
        self.basis = None
        self.gpu_corrs = CorrIndex((ev[4], i) for i, ev in enumerate(t.gpu))  # a set of the GPU events' ids
        self.host = delays.HostCalls(t, self.gpu_corrs, self.inputs, self.kernels) if t.gpu else None

    def all_mine(self) -> Iterator[tuple[tuple, str]]:
        """Every (GPU event, scope) the steps launched, step by step: made afresh at each call, never held."""
        return (m for num, _, _ in self.t.steps for m in self.by_step.get(num, []))

    def launches(self, num):
        """(launches of GPU work in the step, those whose GPU record is not in the trace). Memsets are left out:
        cuDNN and cuBLAS issue some whose GPU record the profiler never writes, and a memset's few µs cannot
        move a figure (delay_details counts them)."""
        calls = [c for c in self.runtime_by_step.get(num, []) if c[0] in WORK_CALLS and c[0] not in MEMSET_CALLS]
        return len(calls), sum(c[3] not in self.gpu_corrs for c in calls)

    def cpu_figs(self, span):
        """CPU time of the span and of each scope in it; a scope absent from the trace is null, never 0."""
        return {
            "wall_us": sum(b - a for a, b in span),
            "scopes_cpu_us": {
                n: total(intersect(self.scopes[n], span)) if n in self.present else None for n in self.names
            },
            "input_cpu_us": total(intersect(self.inputs, span)) if self.inputs is not None else None,
        }

    def views(self, cpu_span, gpu_span, lanes=False):
        """Idle figures read on the CPU's steps and on the GPU's own timeline."""
        cpu = idle_figures(self.busy, cpu_span, self.scopes, self.inputs, lanes, self.host)
        gpu = idle_figures(self.busy, gpu_span, self.scopes, self.inputs, lanes, self.host) if gpu_span else None
        return {"cpu_steps": cpu, "gpu_timeline": gpu}

    def fill(self, out, v, reason):
        """Copy the chosen view's figures (idle_basis) into a step's or the window's figures."""
        chosen = v[self.basis]
        out["idle"] = v
        for key, src in (
            ("gpu_busy_us", "busy_us"),
            ("gpu_idle_us", "idle_us"),
            ("gpu_idle_share", "idle_share"),
            ("host_wait_us", "host_wait_us"),
            ("input_gap_us", "input_gap_us"),
            ("input_gap_share", "input_gap_share"),
            ("waits_by_scope_us", "waits_by_scope_us"),
            ("gpu_comm_only_us", "comm_only_us"),
            ("delays_us", "delays_us"),
        ):
            out[key] = chosen.get(src) if chosen else None
        out["pace_us"] = chosen["span_us"] if chosen else None
        out["gpu_null_reason"] = None if chosen else reason
        if out["launch_cpu_us"] is not None:
            out["launch_to_busy"] = (out["launch_cpu_us"] / out["gpu_busy_us"]) if out.get("gpu_busy_us") else None


def trace_header(r: _Reading, name: str) -> dict[str, Any]:
    """The figures of the trace as a whole: its input source, its scopes and what Perfetto would drop."""
    crossing = r.t.threads.counts()
    mem = memory.figures(r.t.memory, r.t.steps, r.t.scopes, r.names, r.t.damage)  # its damage first
    return {
        "trace": name,
        "has_gpu": bool(r.t.gpu),
        "damage": r.t.damage.report(),
        "damage_withheld": r.t.damage.withheld(),
        "notes": [],
        "caveat": CAVEAT,
        "input_source": r.source,
        "scope_set": list(r.names),
        "scopes_present": [n for n in r.names if n in r.present],
        "memory": mem,
        "crossing_slices": {
            "count": sum(crossing.values()),
            "by_thread": {f"{p}/{tid}": n for (p, tid), n in crossing.items()},
            "note": "slices that cross another on the same thread; Perfetto v57.1 "
            "or later shows them, older versions drop them",
        },
        "perfetto_drops": {
            "count": r.t.complete.count(),
            "note": "complete events Perfetto's JSON importer before v57.1 drops (they cross "
            "another on their pid/tid track); profile mode repairs its traces "
            "to 0",
        },
    }


def memory_lanes(r: _Reading, evidence: dict[str, Any], per_step: list[dict[str, Any]]) -> None:
    """Each step's GPU memory lane ([[ts, allocated bytes]], memory.lane), and the device drawn or why none is."""
    got = memory.lane(r.t.memory, r.t.steps)
    evidence["memory_lane"] = {"device": got["device"], "null_reason": got["null_reason"]}
    for step in per_step:
        step["lanes"]["memory"] = got["steps"].get(step["step"])


def cpu_only_evidence(r: _Reading, evidence: dict[str, Any], lanes: bool) -> dict[str, Any]:
    """A CPU-only trace: the scopes' CPU time per step; every GPU figure null with its reason."""
    t = r.t
    nulls = dict(gpu_idle_share=None, input_gap_share=None, gpu_work_us=None, gpu_span_us=None, gpu_null_reason=NO_GPU)
    per_step = [{"step": num, **r.cpu_figs([[a, b]]), "pace_us": b - a, **nulls} for num, a, b in t.steps]
    if lanes:
        for step, (_, a, b) in zip(per_step, t.steps):
            step["lanes"] = {"cpu_start": a, "cpu": cpu_lane(r.scopes, a, b, r.drawn_input), "gpu": None}
        memory_lanes(r, evidence, per_step)
    window = {
        **r.cpu_figs(r.window_cpu),
        "pace_us": sum(r.walls),
        **nulls,
        "steps": len(t.steps),
        "median_step_us": statistics.median(r.walls),
    }
    evidence.update(
        gpu_idle_share=None,
        input_gap_share=None,
        cpu_runs_ahead=False,
        idle_basis=None,
        gpu_null_reason=NO_GPU,
        window=window,
        steps=per_step,
        launched_before_trace=None,
        launched_outside_steps=None,
        attributed_by_clock=0,
    )
    if SAVE in r.names:
        evidence["saves"] = save_figures(t.steps, r.scopes[SAVE], None)
    evidence["verdict"] = verdict(evidence)
    return evidence


DROPPED_AT = 0.01  # past this share of a step's launches without their GPU record, its GPU figures are null


# Why launches have no GPU record, by the damage that explains it (steplens/trace/damage.py), else the profiler.
LOST_BECAUSE = {
    "no_correlation": "the trace's GPU events lack correlation ids, so no launch can be matched to its GPU work",
    "gpu_stops_early": "the trace's GPU events stop before its launches do: its end lost them",
}
DROPPED = "the profiler dropped them"


def lost_because(t: Trace) -> str:
    """Why the trace's launches miss their GPU records: a damage named in t.damage, else the profiler's drops."""
    return next((why for kind, why in LOST_BECAUSE.items() if kind in t.damage.counts), DROPPED)


def dropped_reason(lost: int, launched: int, whose: str, because: str = DROPPED) -> str:
    return (
        f"the trace has no GPU record for {lost} of {whose} {launched} launches ({because}): "
        f"more than {DROPPED_AT:.0%}, so its GPU figures would read the missing work as idle time"
    )


def dropped_note(steps: list[dict[str, Any]], because: str = DROPPED) -> list[str]:
    """The note on launches whose GPU work is not in the trace (Kineto drops records, most near its start)."""
    hit = [s for s in steps if s.get("launches_without_gpu_work")]
    if not hit:
        return []
    each = ", ".join(f"#{s['step']}: {s['launches_without_gpu_work']} of {s['gpu_work_launches']}" for s in hit)
    why = (
        "the profiler dropped those records (Kineto drops GPU records it sees as out of range, most just after it "
        "starts)"
        if because == DROPPED
        else because
    )
    return [
        f"launches without their GPU work in the trace ({each}): {why}; a step missing more than "
        f"{DROPPED_AT:.0%} of its launches' records has null GPU figures"
    ]


def gpu_annotations(t: Trace) -> dict[tuple[int, str], float]:
    """Each step's gpu_user_annotation time per scope, matched to the CPU scope that launched it."""
    annotations = defaultdict(float)
    in_step = SliceFinder([(a, b, n) for n, a, b in t.steps])
    for ann_name, s, e, ext in t.annotations:
        scope = t.scope_ids.get(ext)
        if scope and scope[0] == ann_name:
            num = in_step(scope[1])
            if num is not None:
                annotations[(num, ann_name)] += e - s
    return annotations


def step_evidence(
    r: _Reading,
    num: int,
    a: float,
    b: float,
    slots: dict[int, list[float] | None],
    slot_reason: str | None,
    annotations: dict[tuple[int, str], float],
    lanes: bool,
) -> dict[str, Any]:
    """One step's figures: its CPU scopes, the GPU work it launched, its GPU slot and idle time."""
    t = r.t
    mine = r.by_step.get(num, [])
    step = {"step": num, **r.cpu_figs([[a, b]]), **work_figures(mine, r.runtime_by_step.get(num, []), r.kernels)}
    step["kernel_classes"] = kernel_classes(t, [ev for ev, _ in mine])
    slot = slots.get(num)
    step["gpu_span_us"] = (slot[1] - slot[0]) if slot else None
    step["gpu_lag_us"] = max(0.0, max(ev[2] for ev, _ in mine) - b) if mine else 0.0
    step["gpu_annotation_us"] = {sc: annotations[(num, sc)] for sc in r.names if (num, sc) in annotations}
    reason = (OPEN_SLOT if num in slots else slot_reason) if slot is None else None
    launched, lost = r.launches(num)
    step["gpu_work_launches"], step["launches_without_gpu_work"] = launched, lost
    if lost > DROPPED_AT * launched:
        slot, reason = None, dropped_reason(lost, launched, "this step's", lost_because(t))
    if slot and step["gpu_work_us"] > step["gpu_span_us"] + EPS_US:  # the invariant: work fits in its slot
        reason = (
            f"the GPU work this step launched ({step['gpu_work_us']:.1f} us) exceeds its GPU span "
            f"({step['gpu_span_us']:.1f} us): steps' GPU work overlaps, the per-step GPU span is undefined"
        )
        slot, step["gpu_span_us"] = None, None
    step["gpu_span_null_reason"] = None if slot else (reason or "this step launched no GPU work")
    v = r.views([[a, b]], [slot] if slot else [], lanes)
    if lost > DROPPED_AT * launched:
        v = {"cpu_steps": None, "gpu_timeline": None}
    if lanes:
        step["lanes"] = {
            "cpu_start": a,
            "cpu": cpu_lane(r.scopes, a, b, r.drawn_input),
            "gpu": v[r.basis]["segments"] if v[r.basis] else None,
        }
        for view in v.values():
            if view:
                view.pop("segments")
    r.fill(step, v, step["gpu_span_null_reason"])
    return step


def window_evidence(
    r: _Reading,
    window_work: dict[str, Any],
    window_span: list[list[float]],
    lag: float,
    slots: dict[int, list[float] | None],
    slot_reason: str | None,
) -> dict[str, Any]:
    """The window's figures: the whole capture's GPU work, span and idle time, and its complete GPU slots."""
    t = r.t
    window = {
        **r.cpu_figs(r.window_cpu),
        **window_work,
        "gpu_lag_us": lag,
        "gpu_span_us": total(window_span) if window_span else None,
    }
    window["kernel_classes"] = kernel_classes(t, lambda: (ev for ev, _ in r.all_mine()), top=TOP_KERNELS)
    window["gpu_span_null_reason"] = None if window_span else "no GPU work was launched inside the window"
    if window_span and window["gpu_work_us"] > window["gpu_span_us"] + EPS_US:  # cannot happen unless a bug
        window["gpu_span_null_reason"] = (
            f"GPU work launched in the window ({window['gpu_work_us']:.1f} us) exceeds its GPU span "
            f"({window['gpu_span_us']:.1f} us): attribution is inconsistent"
        )
        window["gpu_span_us"] = None
    counts = [r.launches(num) for num, _, _ in t.steps]
    launched, lost = sum(c[0] for c in counts), sum(c[1] for c in counts)
    window["gpu_work_launches"], window["launches_without_gpu_work"] = launched, lost
    views = r.views(r.window_cpu, [[a, b] for a, b in window_span] if window["gpu_span_us"] else [])
    if lost > DROPPED_AT * launched:
        window["gpu_span_null_reason"] = dropped_reason(lost, launched, "the window's", lost_because(t))
        views = {"cpu_steps": None, "gpu_timeline": None}
    r.fill(window, views, window["gpu_span_null_reason"])
    complete = [num for num, slot in slots.items() if slot]
    window["gpu_slots"] = len(complete)
    window["gpu_slots_span_us"] = sum(slots[num][1] - slots[num][0] for num in complete)
    window["gpu_slots_work_us"] = total(
        merge_sorted(sorted_pairs((ev[1], ev[2]) for num in complete for ev, _ in r.by_step[num]))
    )
    window["gpu_span_per_step_us"] = window["gpu_slots_span_us"] / len(complete) if complete else None
    window["gpu_span_per_step_null_reason"] = None if complete else (slot_reason or OPEN_SLOT)
    if complete and window["gpu_slots_work_us"] > window["gpu_slots_span_us"] + EPS_US:
        window["gpu_span_per_step_us"] = None
        window["gpu_span_per_step_null_reason"] = (
            f"the GPU work of the steps with a complete GPU slot ({window['gpu_slots_work_us']:.1f} us) exceeds "
            f"their slots ({window['gpu_slots_span_us']:.1f} us): steps' GPU work overlaps"
        )
    window.update(steps=len(t.steps), median_step_us=statistics.median(r.walls))
    window["delay_details"] = delays.details(
        t,
        r.gpu_corrs,
        r.host,
        (x for num, _, _ in t.steps for x in r.runtime_by_step.get(num, [])),
        r.all_mine(),
        len(t.steps),
    )
    return window


def trace_notes(
    r: _Reading, runs_ahead: bool, window_work: dict[str, Any], pre: dict[str, Any], out: dict[str, Any]
) -> list[str]:
    """The notes that qualify the figures: the CPU running ahead, graph replays, work charged to no step."""
    notes = []
    if runs_ahead:
        notes.append(RUN_AHEAD)
    if window_work["graph_launches"]:
        notes.append(GRAPHS)
    if pre["events"]:
        notes.append(
            f"launched before the trace: {pre['kernels']} kernels and {pre['events'] - pre['kernels']} other GPU "
            f"events ({pre['gpu_work_us'] / 1e3:.2f} ms of GPU time) whose launch call is not in the trace: "
            "charged to no step (Kineto also drops such work that started before the trace began)"
        )
    if out["events"]:
        notes.append(
            f"launched between the steps: {out['kernels']} kernels, "
            f"{out['gpu_work_us'] / 1e3:.2f} ms of GPU time, charged to no step"
        )
    return notes


def summarize_events(
    events: Iterable[Any] | Callable[[], Iterable[Any]],
    name: str = "trace",
    lanes: bool = False,
    input_scope: str | None = None,
    step_scope: str | None = None,
) -> dict[str, Any]:
    """The evidence of one trace (docs/EVIDENCE.md defines every figure). lanes: each step also carries its
    lanes for a picture ({"cpu": [[scope, start, end]], "gpu": [[kind, start, end]] or None}, trace µs).
    input_scope: the name of the reader's own record_function around fetching a batch (see input_source).
    events: a list, or a function that returns a fresh stream of them (timeline.read: where the one-pass read
    gives up, the trace is read again, and a third time without the copies of events written twice).
    """
    if not callable(events):
        events = events if isinstance(events, (list, tuple)) else list(events)
        t = read(lambda: events)
    else:
        t = read(events)
    return summarize_trace(t, name, lanes, input_scope, step_scope)


def need_steps(t: Trace, name: str) -> None:
    """Raise TraceError where the trace has no ProfilerStep#N slice, naming any damage that may have cost them."""
    if not t.steps:
        damaged = "; ".join(f"{d['count']} {d['what']}" for d in t.damage.report())
        raise TraceError(
            f"{name}: no ProfilerStep#N slices: was it written by torch.profiler with a schedule?"
            + (f" (the trace is damaged: {damaged})" if damaged else "")
        )


WINDOW_ONLY = (
    "the trace has no ProfilerStep#N slices (a capture without a schedule, or a loop without prof.step()): it is "
    "read as one window, from its first to its last CPU event; name the scope around one iteration with "
    "--step-scope to read it per iteration"
)


def choose_steps(t: Trace, name: str, step_scope: str | None) -> str | None:
    """The steps to read: --step-scope's slices, else the ProfilerStep#N slices, else the whole capture as one
    window (a trace without damage only). Returns the note that says which, or None for ProfilerStep#N.
    A file that holds several captures is refused: read together, their steps would be summed."""
    merged = [d for d in t.damage.report() if d["kind"] in soundness.MERGED]
    if merged:
        found = "; ".join(f"{d['count']} {d['what']}" for d in merged)
        raise TraceError(f"{name}: the trace is damaged: {found}: split it and read each capture alone")
    if step_scope:
        slices = sorted(t.scopes.get(step_scope) or t.named.get(step_scope) or [])
        if not slices:
            raise TraceError(f"{name}: no user annotation named {step_scope!r} (--step-scope) in the trace")
        t.steps = [(i + 1, s, e) for i, (s, e) in enumerate(slices)]
        return f"each slice of {step_scope!r} (--step-scope) is read as one step: {len(slices)} in the trace"
    if t.cpu_span is None and not t.steps and not t.damage:
        raise TraceError(
            f"{name}: no ProfilerStep#N slices and no CPU events at all: not a PyTorch profiler trace, or an empty one"
        )
    if t.steps or t.damage:
        need_steps(t, name)
        return None
    t.steps = [(0, *t.cpu_span)]
    return WINDOW_ONLY


def summarize_trace(
    t: Trace, name: str = "trace", lanes: bool = False, input_scope: str | None = None, step_scope: str | None = None
) -> dict[str, Any]:
    """The evidence of a trace's timeline (timeline.read's); see summarize_events."""
    # 1) the timeline was read (checked for damage); attribute each GPU event to the step that launched it
    steps_note = choose_steps(t, name, step_scope)
    r = _Reading(t, input_scope)
    evidence = trace_header(r, name)
    evidence["window_only"] = steps_note == WINDOW_ONLY
    if steps_note:
        evidence["notes"].insert(0, steps_note)
    if not t.gpu:
        return cpu_only_evidence(r, evidence, lanes)
    # 2) does the CPU run ahead of the GPU? then idle time is read on the GPU's timeline, else on the CPU's steps
    slots, slot_reason = gpu_slots(t.steps, r.by_step)
    window_work = work_figures(
        r.all_mine(), (x for num, _, _ in t.steps for x in r.runtime_by_step.get(num, [])), r.kernels
    )
    cpu_end = max(b for _, _, b in t.steps)
    last_gpu_end = max((ev[2] for ev, _ in r.all_mine()), default=None)
    lag = max(0.0, last_gpu_end - cpu_end) if last_gpu_end is not None else 0.0
    runs_ahead = lag > statistics.median(r.walls) or window_work["gpu_work_us"] > sum(r.walls)
    r.basis = "gpu_timeline" if runs_ahead else "cpu_steps"
    # 3) each step, then the window
    annotations = gpu_annotations(t)
    per_step = [step_evidence(r, num, a, b, slots, slot_reason, annotations, lanes) for num, a, b in t.steps]
    if lanes:
        memory_lanes(r, evidence, per_step)
    first_gpu_start = min((ev[1] for ev, _ in r.all_mine()), default=None)
    window_span = [[first_gpu_start, last_gpu_end]] if first_gpu_start is not None else []
    window = window_evidence(r, window_work, window_span, lag, slots, slot_reason)
    # 4) what the figures leave out, and the verdict
    pre, out = bucket(r.before), bucket(r.outside)
    evidence["notes"] += trace_notes(r, runs_ahead, window_work, pre, out) + dropped_note(per_step, lost_because(t))
    evidence.update(
        gpu_idle_share=window["gpu_idle_share"],
        input_gap_share=window["input_gap_share"],
        cpu_runs_ahead=runs_ahead,
        idle_basis=r.basis,
        gpu_null_reason=window["gpu_null_reason"],
        window=window,
        steps=per_step,
        launched_before_trace=pre,
        launched_outside_steps=out,
        attributed_by_clock=r.by_clock,
    )
    if SAVE in r.names:  # the checkpoint phase: each save, its step, its share and the GPU's idle time in it
        evidence["saves"] = save_figures(t.steps, r.scopes[SAVE], r.busy)
    evidence["verdict"] = verdict(evidence)
    return evidence


def summarize_file(
    path: str,
    lanes: bool = False,
    input_scope: str | None = None,
    with_roofline: bool = False,
    model: Any = None,
    step_scope: str | None = None,
    tap: Callable[[], Tap] | None = None,
) -> dict[str, Any]:
    """The evidence of one trace file (summarize_events).

    with_roofline: the evidence also carries "roofline", the roofline by kernel class (see roofline.roofline,
    which takes model), made from the same read of the file: one pass, or three where events were written twice
    (timeline.read), as without it.
    tap: what else a caller keeps from the same read (timeline.read's tap: called at the start of each pass, it
    returns the function given each kept complete event); the file is still read once (three times with
    duplicates)."""
    if not with_roofline:
        return summarize_trace(read(lambda: iter_events(path), tap), path, lanes, input_scope, step_scope)
    meta = {}
    t, ops = read_with_operators(lambda: iter_events(path, meta=meta), tap)
    steps_note = choose_steps(t, path, step_scope)
    found = roofline(t, ops, device_of(meta), model, path)  # before summarize adds the memory events' damage
    evidence = summarize_trace(t, path, lanes, input_scope, step_scope)
    if steps_note == WINDOW_ONLY and WINDOW_ONLY not in evidence["notes"]:
        evidence["window_only"] = True
        evidence["notes"].insert(0, WINDOW_ONLY)
    evidence["roofline"] = found
    return evidence


def add_reading_options(p: argparse.ArgumentParser) -> None:
    """The options of every subcommand that reads a trace (summarize, picture, ranks): the same names, the same help."""
    p.add_argument(
        "--input-scope",
        default=None,
        metavar="NAME",
        help="the record_function name your loop puts around fetching a batch, read as the input "
        "stage (default: input/next_batch if the trace has it, else the DataLoader's own "
        "enumerate(DataLoader)#... annotation)",
    )
    p.add_argument(
        "--step-scope",
        default=None,
        metavar="NAME",
        help="the record_function name around one iteration of your loop, read as the steps (default: the "
        "ProfilerStep#N slices; a trace without them is read as one window)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens summarize", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="PyTorch profiler Chrome traces (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print one JSON object per trace, one per line")
    p.add_argument(
        "--full",
        action="store_true",
        help="print the figures per step, the kernel classes and every note after the verdict (default: the "
        "verdict, the delays and a few lines)",
    )
    p.add_argument(
        "--roofline",
        action="store_true",
        help="add each kernel class's work, achieved rate and share of the GPU's limit (steplens roofline), "
        "from the same read of the trace",
    )
    add_reading_options(p)
    args = p.parse_args(argv)
    folders = [t for t in args.traces if os.path.isdir(t)]
    if folders:  # before any trace is read: a folder is a common slip, and reading the others first wastes minutes
        say(
            f"steplens summarize: error: {folders[0]} is a folder: give the trace files in it "
            "(FOLDER/*.pt.trace.json.gz); steplens ranks reads a folder of rank traces",
            sys.stderr,
        )
        return 2
    try:
        evidences = [
            summarize_file(t, input_scope=args.input_scope, with_roofline=args.roofline, step_scope=args.step_scope)
            for t in args.traces
        ]
    except TraceError as e:
        say(f"steplens summarize: error: {e}", sys.stderr)
        return 1
    runs = [run_verdict(t, ev) for t, ev in zip(args.traces, evidences)]
    if args.json:
        for ev, run in zip(evidences, runs):
            print(json.dumps({**ev, "run_verdict": run} if run else ev, sort_keys=True))  # ASCII: every name escaped
    else:
        write(format_table(evidences) if args.full else format_brief(evidences))
        for run in filter(None, runs):
            say(
                f"The run's own evidence ({run['file']}) adds what profile mode measured around the capture "
                f"(the profiler's slow-down, refilled queues): {run['sentence']}"
            )
        for ev in evidences if args.roofline else []:
            write(format_roofline(ev["roofline"], damage=False))
    return 0


def run_verdict(trace: str, evidence: dict[str, Any]) -> dict[str, str] | None:
    """The verdict profile mode wrote beside a trace of its own (TRACE.evidence.json), where it differs from the
    trace's alone: it adds what the trace cannot hold (docs/EVIDENCE.md#the-verdict). None elsewhere."""
    path = trace.rsplit(".pt.trace.", 1)[0] + ".evidence.json"
    try:
        with open(path) as f:
            sentence = json.load(f)["verdict"]["sentence"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    mine = (evidence.get("verdict") or {}).get("sentence")
    if not isinstance(sentence, str) or sentence == mine:
        return None
    return {"file": os.path.basename(path), "sentence": sentence}


if __name__ == "__main__":
    raise SystemExit(main())
