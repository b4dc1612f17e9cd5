"""The delays of a step on any trace, labelled or not: input wait, copy, launch, sync, GPU compute.

Each moment the GPU idles gets one cause, in this order:
  1) the host is inside a call that copies to the GPU: copy;
  2) the launch call of the work that ends the gap had returned before the gap began: GPU-side (queued);
  3) the host is inside the input source (the DataLoader's __next__, or --input-scope): input wait;
  4) a sync was in progress when the GPU went idle: sync (copy, where it waited for a copy the host had just made),
     charged over the idle after it, never more than the time the host waited in it;
  5) the rest: launch where the work that ends the gap came at most LAUNCH_GAP_US after the previous launch (the
     host issues work slower than the GPU runs it), else host work between launches.
The GPU's own time splits into compute (kernels) and copy (host-to-device copies with no kernel beside them).
The rule, its thresholds and what it cannot see: docs/DELAYS.md"""

import bisect
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from steplens.trace.columns import CorrIndex, Merged, merge_sorted, sorted_pairs
from steplens.trace.intervals import total
from steplens.trace.spill import SortedRecords, median
from steplens.trace.timeline import COPY_CALLS, LAUNCH_CALLS, MEMSET_CALLS, WORK_CALLS, Trace

# A host stretch without a launch up to this long is part of issuing the step's work. On NVIDIA H200 traces of
# the companion with every profiler option on, 99% of launch-to-launch intervals are under 0.43 ms and the
# longest inside a step (the optimizer's set-up after backward) 1.5 ms; a longer stretch is other host work.
LAUNCH_GAP_US = 2000.0

# A sync that starts this soon after a host-to-device copy call waits for that copy (with the copy ending the GPU's
# work): its idle is the copy's.
COPY_SYNC_US = 50.0

# A sync is taken to have drained the GPU when the GPU went idle while the sync was in progress; CPU and GPU
# clocks in a trace may disagree by a few µs, so a sync that ended this little before the GPU went idle counts.
SYNC_SLACK_US = 20.0

CLASSES = ("compute", "communication", "input", "copy", "launch", "sync", "host", "queued")


class HostCalls:
    """What the host did that the delays read, from a trace: the starts of every launch (sorted, 8 bytes each),
    the host-to-device copy calls and the syncs (few a step)."""

    def __init__(self, t: Trace, gpu_corrs: CorrIndex, inputs: list[list[float]] | None, kernels: Merged):
        self.kernels = kernels
        self.h2d = Merged(merge_sorted(sorted_pairs((ev[1], ev[2]) for ev in t.gpu if ev[0] == "h2d")))
        starts = SortedRecords("d", 1)
        copies = []
        for name, s, e, corr in t.runtime:
            if name in WORK_CALLS:
                starts.add(s)
            if name in COPY_CALLS:
                i = gpu_corrs.get(corr)
                if i is not None and t.gpu[i][0] == "h2d":
                    copies.append((s, e))
        self.launches = array("d", starts)
        self.copies = Merged(merge_sorted(sorted(copies)))
        self.inputs = Merged(inputs or [])
        syncs = sorted((s, e) for _, s, e, _ in t.sync_calls if not self.is_copy(s, e))
        self.sync_starts = array("d", (s for s, _ in syncs))
        self.syncs = syncs
        # the latest-ending sync among those that started by each place, for sync_at's search
        self.reach: list[int] = []
        best = -1
        for i, (_, e) in enumerate(syncs):
            if best < 0 or e > syncs[best][1]:
                best = i
            self.reach.append(best)

    def is_copy(self, s: float, e: float) -> bool:
        """A blocking copy call that is itself a host-to-device copy (cudaMemcpy): a copy, not a sync."""
        return any(a <= s and e <= b for a, b in self.copies.clip(s, e))

    def copy_ends_at(self, a: float) -> bool:
        """Whether a host-to-device copy on the GPU ends at a (to the ns the trace keeps)."""
        i = bisect.bisect_left(self.h2d.ends, a - 1e-3)
        return i < len(self.h2d.ends) and self.h2d.ends[i] <= a + 1e-3

    def sync_at(self, a: float) -> tuple[str, int, float] | None:
        """The sync that was in progress when the GPU went idle at a, as (class, its index, how long the host
        waited in it): class "copy" where it waits for a host-to-device copy the host just made (PyTorch syncs after
        a copy from pageable memory: the copy call ends right before the sync and the copy ends the GPU's work),
        else "sync"; None when no sync was."""
        i = bisect.bisect_right(self.sync_starts, a) - 1
        if i < 0:
            return None
        k = self.reach[i]
        s, e = self.syncs[k]
        if e < a - SYNC_SLACK_US:
            return None
        return ("copy" if self.copy_ends_at(a) and self.copy_call_before(s) else "sync"), k, e - s

    def copy_call_before(self, s: float) -> bool:
        """Whether a host-to-device copy call ended at most COPY_SYNC_US before s."""
        i = bisect.bisect_right(self.copies.ends, s) - 1
        return i >= 0 and s - self.copies.ends[i] <= COPY_SYNC_US

    def previous_launch(self, at: float) -> float:
        """The start of the last launch before at, -inf when none."""
        i = bisect.bisect_left(self.launches, at) - 1
        return self.launches[i] if i >= 0 else float("-inf")


def _minus(pieces: list[list[float]], cut: Merged) -> tuple[list[list[float]], float]:
    """The parts of pieces outside cut, and how much cut took."""
    out, taken = [], 0.0
    for s, e in pieces:
        cur = s
        for cs, ce in cut.clip(s, e):
            if cs > cur:
                out.append([cur, cs])
            taken += ce - cs
            cur = max(cur, ce)
        if cur < e:
            out.append([cur, e])
    return out, taken


def idle_causes(busy: Any, idle: Iterable[Sequence[float]], host: HostCalls) -> dict[str, float]:
    """The idle intervals' time by cause (input, copy, sync, launch, host, queued), in µs; busy: attribution.Busy
    (its merged intervals, each with the launch call of the work that opens it). Each sync is charged at most the
    time the host waited in it, over the idle that follows it until work is queued again."""
    out = dict.fromkeys(("input", "copy", "sync", "launch", "host", "queued"), 0.0)
    budget: dict[int, float] = {}  # each sync's wait not yet charged
    active = None  # the sync whose idle this is, until the GPU has work queued again
    for a, b in idle:
        # the host inside a host-to-device copy call holds the GPU back whether or not the copy was queued: the
        # copy's GPU work cannot start before the host has staged it
        pieces, taken = _minus([[a, b]], host.copies)
        out["copy"] += taken
        i = bisect.bisect_left(busy.starts, b)
        launch = busy.opened_by[i] if i < len(busy.starts) else float("inf")
        returned = busy.opened_end[i] if i < len(busy.starts) else float("inf")
        if returned <= a:  # the work that ends the gap was submitted before the gap began: GPU-side
            out["queued"] += total(pieces)
            active = None
            continue
        pieces, taken = _minus(pieces, host.inputs)
        out["input"] += taken
        rest = total(pieces)
        if not rest:
            continue
        found = host.sync_at(a)
        if found is not None:
            active = found
            budget.setdefault(found[1], found[2])
        if active is not None and budget[active[1]] > 0:  # no more than the host waited in the sync
            cost = min(rest, budget[active[1]])
            budget[active[1]] -= cost
            out[active[0]] += cost
            rest -= cost
        if launch - host.previous_launch(launch) <= LAUNCH_GAP_US:
            out["launch"] += rest
        else:
            out["host"] += rest
    return out


def copy_alone(host: HostCalls, span: Iterable[Sequence[float]]) -> float:
    """The µs of span in which the GPU copies host-to-device with no kernel running: the copy's GPU time."""
    alone = 0.0
    for a, b in span:
        for s, e in host.h2d.clip(a, b):
            alone += (e - s) - total(host.kernels.clip(s, e))
    return alone


def delays_us(figures: dict[str, Any], idle_by_cause: dict[str, float], copy_alone_us: float) -> dict[str, float]:
    """The span's time by class (CLASSES), in µs: they sum to the span. figures: attribution's idle figures."""
    out = dict.fromkeys(CLASSES, 0.0)
    comm = figures.get("comm_only_us") or 0.0
    out["communication"] = comm
    out["compute"] = max(0.0, figures["busy_us"] - comm - copy_alone_us)
    out.update(idle_by_cause)
    out["copy"] += copy_alone_us
    return out


# What each delay is, in a reader's words, and the class of fix that fits it.
NAMES = {
    "compute": "GPU compute",
    "communication": "communication between ranks",
    "input": "input wait",
    "copy": "copy to the GPU",
    "launch": "launch-bound",
    "sync": "sync",
    "host": "host work between launches",
    "queued": "GPU-side gaps",
}

FIXES = {
    "compute": "make the GPU's work cheaper or larger: bf16 autocast, channels_last, torch.compile, a larger batch",
    "communication": "overlap communication with compute, or find the rank the others wait for",
    "input": "more DataLoader workers within the job's CPUs, a cheaper transform, or input prepared on the GPU",
    "copy": "pinned memory with non_blocking=True copies, a prefetch stream, smaller inputs (uint8, not float), "
    "or decoding on the GPU",
    "launch": "fewer, larger launches: CUDA graphs, torch.compile, a bigger batch, fused or foreach ops",
    "sync": "keep values on the GPU (no .item(), .cpu() or printing a tensor in the step), log less often",
    "host": "move the host's own work out of the step, or overlap it with the GPU's",
    "queued": "look for waits between streams or on events in the trace",
}


def details(
    t: Trace, gpu_corrs: CorrIndex, host: HostCalls, runtime: Iterable[tuple], mine: Iterable[tuple], steps: int
) -> dict[str, Any]:
    """The evidence behind each delay over a window's launches (runtime: its calls) and GPU events (mine: the
    (event, scope) it launched), per step. Returns figures per class; evidence() words them."""
    kernel_durations, waits = SortedRecords("d", 1), SortedRecords("d", 1)
    launch_count = launch_us = memsets = memsets_lost = 0
    copies = {"count": 0, "bytes": 0, "us": 0.0, "pageable": 0, "pinned": 0}
    ends = {}  # correlation -> the launch call's end, for the launch-to-start wait
    for name, s, e, corr in runtime:
        if name in LAUNCH_CALLS:
            launch_count += 1
            launch_us += e - s
            if corr is not None:
                ends[corr] = e
        elif name in MEMSET_CALLS:
            memsets += 1
            memsets_lost += corr not in gpu_corrs
    for ev, _ in mine:
        kind, s, e = ev[0], ev[1], ev[2]
        if kind == "kernel":
            kernel_durations.add(e - s)
            end = ends.get(ev[4])
            if end is not None:
                waits.add(s - end)
        elif kind == "h2d":
            copies["count"] += 1
            copies["bytes"] += ev[5]
            copies["us"] += e - s
            name = t.gpu_names.get(ev, "")
            memory = "pageable" if "Pageable" in name else "pinned" if "Pinned" in name else "other"
            copies[memory] = copies.get(memory, 0) + 1
    kernels = len(kernel_durations)
    syncs = _sync_origins(t, host)
    sync_count = sum(syncs.values())
    return {
        "steps": steps,
        "launch": {
            "kernels_per_step": kernels / steps,
            "kernel_median_us": median(kernel_durations),
            "launches_per_step": launch_count / steps,
            "cpu_us_per_launch": launch_us / launch_count if launch_count else None,
            "launch_to_start_median_us": median(waits),
        },
        "copy": {**copies, "per_step_bytes": copies["bytes"] / steps, "count_per_step": copies["count"] / steps},
        "sync": {"count_per_step": sync_count / steps, "origins": syncs},
        "memsets_without_gpu_record": memsets_lost,
        "memsets": memsets,
    }


def _sync_origins(t: Trace, host: HostCalls) -> dict[str, int]:
    """Where the syncs inside the steps come from: the outermost known operator (aten::item, ...) around each
    sync call on its thread, else the call's own name."""
    starts = sorted(t.steps, key=lambda step: step[1])
    firsts = [a for _, a, _ in starts]
    calls = []  # (name, start, end, tid) of the sync calls inside a step
    for name, s, e, tid in t.sync_calls:
        k = bisect.bisect_right(firsts, s) - 1
        if k < 0 or s >= starts[k][2]:  # outside every step (the profiler's own closing sync)
            continue
        calls.append((name, s, e, tid))
    # the outermost operator around each call, (start, end, name) the least, in one pass over the operators (a
    # long trace holds many): each looks only at the calls of its thread that start inside it
    by_thread: dict[Any, tuple[list[float], list[int]]] = {}
    for i in sorted(range(len(calls)), key=lambda i: calls[i][1]):
        at, which = by_thread.setdefault(calls[i][3], ([], []))
        at.append(calls[i][1])
        which.append(i)
    best: list[tuple[float, float, str] | None] = [None] * len(calls)
    if by_thread:
        for op_name, op_s, op_e, tid in t.sync_ops:
            found = by_thread.get(tid)
            if found is None:
                continue
            at, which = found
            for j in range(bisect.bisect_left(at, op_s), bisect.bisect_right(at, op_e)):
                i = which[j]
                if calls[i][2] <= op_e and (best[i] is None or (op_s, op_e, op_name) < best[i]):
                    best[i] = (op_s, op_e, op_name)
    out: dict[str, int] = {}
    for (name, s, e, _), around in zip(calls, best):
        origin = around[2] if around else f"{name} (no operator around it)"
        if host.is_copy(s, e) or (not around and any(True for _ in host.h2d.clip(s, e))):
            origin = "a host-to-device copy"
        out[origin] = out.get(origin, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def evidence(cls: str, d: dict[str, Any], per_step_us: dict[str, float], source: str | None) -> str:
    """One line: the figures behind a delay class (d: details(); per_step_us: each class's µs per step)."""
    if cls == "input":
        return (
            f"the main thread is inside {source or 'the input'} while the GPU idles, {_ms(per_step_us['input'])} a step"
        )
    if cls == "copy":
        c = d["copy"]
        if not c["count"]:
            return f"the GPU idles {_ms(per_step_us['copy'])} a step while the host copies"
        memory = "pageable" if c.get("pageable") else "pinned" if c.get("pinned") else "unknown"
        rate = c["bytes"] / (c["us"] * 1e3) if c["us"] else None
        return (
            f"{c['count_per_step']:.0f} host-to-device copies a step, {c['per_step_bytes'] / 1e6:.1f} MB from "
            f"{memory} memory" + (f" at {rate:.1f} GB/s" if rate else "")
        )
    if cls == "launch":
        x = d["launch"]
        parts = [f"{x['kernels_per_step']:.0f} kernels a step"]
        if x["kernel_median_us"] is not None:
            parts.append(f"median {x['kernel_median_us']:.1f} µs each")
        if x["cpu_us_per_launch"] is not None:
            parts.append(f"{x['cpu_us_per_launch']:.1f} µs of CPU per launch")
        if x["launch_to_start_median_us"] is not None:
            parts.append(f"a kernel starts a median {x['launch_to_start_median_us']:.1f} µs after its launch returns")
        if x["cpu_us_per_launch"] is not None:
            calls = x["cpu_us_per_launch"] * x["launches_per_step"]
            parts.append(
                f"the GPU waits {_ms(per_step_us['launch'])} a step on the host issuing work "
                f"({_ms(calls)} of it inside launch calls, the rest in Python and operators around them)"
            )
        return ", ".join(parts)
    if cls == "sync":
        s = d["sync"]
        n = d["steps"]
        origins = ", ".join(f"{k} ({v / n:.1f} a step)" for k, v in list(s["origins"].items())[:3]) or "no operator"
        idle = _ms(per_step_us["sync"])
        return f"{s['count_per_step']:.1f} syncs a step, from {origins}; the GPU then idles {idle} a step"
    if cls == "host":
        gap = f"{LAUNCH_GAP_US / 1e3:.0f} ms"
        return f"the host runs {_ms(per_step_us['host'])} a step without launching, longer than {gap} at a time"
    if cls == "queued":
        return f"the GPU idles {_ms(per_step_us['queued'])} a step with its next work already queued"
    if cls == "communication":
        return f"the GPU runs only communication kernels {_ms(per_step_us['communication'])} a step"
    return f"the GPU runs kernels {_ms(per_step_us['compute'])} a step"
