"""The DataLoader's own timeline: when each batch was made, in which worker, and when the step asked for it and got it.

No profiler runs in the workers. The data set's __getitems__ notes when a worker starts a batch (mark_fetch), the
collate function notes when the fetch and transforms ended and when collating ended, and hands back a TimedBatch:
the batch default_collate made, untouched, with those times beside it. Batches (data.py) unwraps it in the main
process and notes when the step asked for it and when it arrived. Every time is time.time_ns() (CLOCK_REALTIME, one
clock for all processes): the exported trace's baseTimeNanoseconds + ts is the same clock, so into_traces can add
one track per worker to each trace. The figures and the verdict: docs/INPUT.md#the-dataloader-workers.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from steplens.atomic import write_atomic
from steplens.job import cpu_use, host_memory
from steplens.job.machine import cpu_budget
from steplens.trace import nesting

WORKER_CAT = "dataloader_worker"  # the cat of the slices added to a trace (no reader of the profiler's events uses it)
KEEP = 200_000  # batches kept per run: a few MB; beyond it the oldest are dropped (none is, in the modes' windows)
FIELDS = (
    "batch",
    "epoch",
    "worker",
    "pid",
    "start_ns",
    "fetched_ns",
    "made_ns",
    "pin_start_ns",
    "pinned_ns",
    "asked_ns",
    "received_ns",
    "wait_s",
)

_fetch_start: list[int] = []  # in each process: when the batch it is making was started (mark_fetch)


def mark_fetch() -> None:
    """Called by the data set's __getitems__ before it fetches a batch's samples: the batch starts now."""
    _fetch_start[:] = [time.time_ns()]


class TimedBatch:
    """A batch as default_collate made it, with when and where it was made; pinned whole by pin_memory()."""

    __slots__ = ("batch", "made", "pin")

    def __init__(self, batch: Any, made: tuple[int, int, int, int, int], pin: tuple[int, int] | None = None):
        self.batch, self.made, self.pin = batch, made, pin  # made: (worker, pid, start, fetched, made) ns

    def pin_memory(self) -> TimedBatch:  # torch's pin_memory() calls this, in the pin-memory thread
        from torch.utils.data._utils.pin_memory import pin_memory

        t0 = time.time_ns()
        pinned = pin_memory(self.batch)
        return TimedBatch(pinned, self.made, (t0, time.time_ns()))


def timed_collate(samples: list[Any]) -> TimedBatch:
    """default_collate, timed: the batch it returns is default_collate's own (the step unwraps it unchanged)."""
    from torch.utils.data import default_collate, get_worker_info

    fetched = time.time_ns()
    start = _fetch_start.pop() if _fetch_start else fetched
    batch = default_collate(samples)
    info = get_worker_info()
    return TimedBatch(batch, (info.id if info is not None else -1, os.getpid(), start, fetched, time.time_ns()))


class Timeline:
    """The main process's side: each batch's times, kept as the step receives it (a tuple append, no I/O)."""

    def __init__(self, workers: int, queue_depth: int):
        self.workers, self.queue_depth, self.count = workers, queue_depth, 0
        self.rows: deque[tuple] = deque(maxlen=KEEP)

    def received(self, item: Any, asked_ns: int, wait_ns: int, epoch: int) -> Any:
        """The batch inside item (item itself when it carries no times), its times noted: asked_ns, when the step
        asked for it (wall clock); wait_ns, how long it waited (perf_counter): received is asked plus the wait."""
        if not isinstance(item, TimedBatch):
            return item
        pin = item.pin or (None, None)
        self.rows.append((self.count, epoch, *item.made, *pin, asked_ns, asked_ns + wait_ns, wait_ns / 1e9))
        self.count += 1
        return item.batch

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(FIELDS, r)) for r in self.rows]


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def _ms(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    s = sorted(values)
    p90 = s[min(len(s) - 1, max(0, round(0.9 * len(s) + 0.5) - 1))]  # nearest rank
    return {"median": round(statistics.median(s) / 1e6, 3), "p90": round(p90 / 1e6, 3), "n": len(s)}


def parts(r: dict[str, Any]) -> dict[str, int]:
    """A request's wait (asked to received) in two parts that add up to it: the worker still making the batch
    after it was asked for, and the rest (transport: the queue, unpickling, pinning, the loader's reordering)."""
    wait = r["received_ns"] - r["asked_ns"]
    making = min(wait, max(0, r["made_ns"] - r["asked_ns"]))
    return {"wait_ns": wait, "worker_ns": making, "transport_ns": wait - making}


def window_figures(records: list[dict[str, Any]], windows: Sequence[tuple[int, int]], workers: int) -> dict[str, Any]:
    """The workers' figures over one or more windows [t0, t1] (ns): busy share per worker, time to make a batch,
    supply against demand, the share of requests that found their batch ready, transport, and the verdict."""
    span = sum(t1 - t0 for t0, t1 in windows)
    asked = [r for r in records if any(t0 <= r["asked_ns"] < t1 for t0, t1 in windows)]
    made = [r for r in records if any(_overlap(r["start_ns"], r["made_ns"], t0, t1) for t0, t1 in windows)]
    if not asked or span <= 0:
        return {"note": "no batch was asked for in the window", "verdict": None, "workers_limit": None}
    names = [str(k) for k in range(workers)] if workers else ["main"]
    busy = dict.fromkeys(names, 0)
    for r in made:
        key = "main" if r["worker"] < 0 else str(r["worker"])
        busy[key] = busy.get(key, 0) + sum(_overlap(r["start_ns"], r["made_ns"], t0, t1) for t0, t1 in windows)
    make = _ms([r["made_ns"] - r["start_ns"] for r in made])
    by_batch = {r["batch"]: r for r in asked}
    # the step's own time between two requests: from receiving a batch to asking for the next one. received is
    # asked plus the wait, so a preemption just before asked was read moves received later: a negative gap is
    # that skew, not a time, and is left out
    gaps = [
        by_batch[b + 1]["asked_ns"] - r["received_ns"]
        for b, r in by_batch.items()
        if b + 1 in by_batch and any(t0 <= r["asked_ns"] and by_batch[b + 1]["asked_ns"] < t1 for t0, t1 in windows)
    ]
    demand = [d for d in gaps if d >= 0]
    split = [parts(r) for r in asked]
    wait = sum(p["wait_ns"] for p in split)
    out = {
        "windows": len(windows),
        "window_ms": round(span / 1e6, 3),
        "requests": len(asked),
        "batches_made": len(made),
        "workers": workers,
        "pids": sorted({r["pid"] for r in made}),
        "busy_share": {k: round(v / span, 4) for k, v in busy.items()},
        "make_ms": make,
        "supply_ms": None if make is None else round(make["median"] / max(workers, 1), 3),
        "demand_ms": _ms(demand)["median"] if demand else None,
        "ready_share": round(sum(r["made_ns"] <= r["asked_ns"] for r in asked) / len(asked), 4),
        "wait_ms": _ms([p["wait_ns"] for p in split]),
        "worker_wait_share": round(sum(p["worker_ns"] for p in split) / wait, 4) if wait else 0.0,
        "transport_ms": _ms([p["transport_ns"] for p in split]),
        "pin_ms": _ms([r["pinned_ns"] - r["pin_start_ns"] for r in asked if r["pinned_ns"] is not None]),
    }
    out["supply_per_sec"] = round(1e3 / out["supply_ms"], 2) if out["supply_ms"] else None
    out["demand_per_sec"] = round(1e3 / out["demand_ms"], 2) if out["demand_ms"] else None
    out["verdict"], out["workers_limit"] = verdict(out)
    seen = {r["batch"]: r for r in made + asked}  # every batch the figures read, one row each, in batch order
    out["batches"] = {"fields": list(FIELDS), "rows": [[seen[b][k] for k in FIELDS] for b in sorted(seen)]}
    return out


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-batch records a window's figures keep (figures["batches"]), as dicts."""
    table = figures.get("batches") or {"fields": [], "rows": []}
    return [dict(zip(table["fields"], r)) for r in table["rows"]]


def verdict(f: dict[str, Any]) -> tuple[str | None, bool | None]:
    """The figures in one sentence, and whether the workers limit the step (None where it cannot be told)."""
    if f["supply_ms"] is None or f["demand_ms"] is None:
        return None, None
    x, y = f["supply_ms"], f["demand_ms"]
    if not f["workers"]:
        share = x / (x + y) if x + y else 0.0
        return (
            f"no worker processes: the step makes each batch itself, {x:.1f} ms beside {y:.1f} ms of its own "
            f"work ({100 * share:.0f}% of the loop): input is on the step's path",
            None,  # no worker processes to be the limit
        )
    n = f["workers"]
    said = f"the {n} worker{'s' if n > 1 else ''} make a batch every {x:.1f} ms; the step asks every {y:.1f} ms"
    ready = f" ({100 * f['ready_share']:.0f}% of requests found their batch ready)"
    if x > y:
        return f"{said}: the workers are the limit{ready}", True
    return f"{said}: input keeps up{ready}", False


# --------------------------------------------------------------------------- the trace


def _read(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.loads(f.read())


def trace_window(doc: dict[str, Any]) -> tuple[int, int, int, tuple[int, int]] | None:
    """On the wall clock (ns): the trace's base, its complete events' first start and last end, and the span of
    its profiled steps (first ProfilerStep start, last end). None without baseTimeNanoseconds or ProfilerStep."""
    base = doc.get("baseTimeNanoseconds")
    events = doc.get("traceEvents")
    if not isinstance(base, int) or not isinstance(events, list):
        return None
    spans = [
        (e["ts"], e["ts"] + e["dur"], str(e.get("name", "")).startswith("ProfilerStep#"))
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur"), (int, float))
    ]
    steps = [(a, b) for a, b, s in spans if s]
    if not steps:
        return None
    wall = lambda us: base + round(us * 1000)  # noqa: E731
    first, last = wall(min(a for a, _, _ in spans)), wall(max(b for _, b, _ in spans))
    return base, first, last, (wall(min(a for a, _ in steps)), wall(max(b for _, b in steps)))


def worker_events(records: Iterable[dict[str, Any]], base: int, t0: int, t1: int) -> list[dict[str, Any]]:
    """One track per worker process (its pid, named "DataLoader worker k"): a slice per batch made in [t0, t1] or
    asked for by a step in it (made earlier, it waited in the loader's queue), with its fetch+transforms and
    collate inside it."""
    us = lambda ns: round((ns - base) / 1000, 3)  # noqa: E731
    out, named = [], set()
    for r in records:
        if r["worker"] < 0 or not (_overlap(r["start_ns"], r["made_ns"], t0, t1) or t0 <= r["asked_ns"] <= t1):
            continue
        pid, label = r["pid"], f"DataLoader worker {r['worker']}"
        if pid not in named:
            named.add(pid)
            out += [
                {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": label}},
            ]
        args = {k: r[k] for k in ("batch", "worker", "epoch")}
        args.update(asked_by_step_us=us(r["asked_ns"]), received_by_step_us=us(r["received_ns"]))
        # Perfetto reads ts and dur as integer ns (nesting.to_ns): durations are set on that reading, so the two
        # parts end inside the batch's slice even where a µs float near 5e12 rounds a start by a nanosecond
        ts, mid = us(r["start_ns"]), us(r["fetched_ns"])
        end = nesting.to_ns(ts) + (r["made_ns"] - r["start_ns"])
        first = max(0, min(r["fetched_ns"] - r["start_ns"], nesting.to_ns(mid) - nesting.to_ns(ts)))
        common = {"ph": "X", "cat": WORKER_CAT, "pid": pid, "tid": pid}
        out += [
            {
                **common,
                "name": f"batch {r['batch']}",
                "ts": ts,
                "dur": _dur(r["made_ns"] - r["start_ns"]),
                "args": args,
            },
            {**common, "name": "fetch + transforms", "ts": ts, "dur": _dur(first), "args": {"batch": r["batch"]}},
            {
                **common,
                "name": "collate",
                "ts": mid,
                "dur": _dur(max(0, end - nesting.to_ns(mid))),
                "args": {"batch": r["batch"]},
            },
        ]
    return out


def _dur(ns: int) -> float:
    return round(ns / 1000, 3)  # a duration's ns come back whole from µs with 3 decimals


def add_tracks(path: str, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Add the workers' tracks to one exported trace (rewritten atomically); the window's times, or None."""
    doc = _read(path)
    found = trace_window(doc) if isinstance(doc, dict) else None
    if found is None:
        return None
    base, t0, t1, steps = found
    added = worker_events(records, base, t0, t1)
    left_out = nesting.violations(added)  # never expected: one worker makes one batch at a time
    if left_out:
        added = []
    if added:
        doc["traceEvents"].extend(added)
        data = json.dumps(doc, separators=(",", ":")).encode()
        write_atomic(path, gzip.compress(data, compresslevel=6) if path.endswith(".gz") else data)
    note = f"{left_out} worker slices would not nest: no worker track added" if left_out else None
    return {"steps": steps, "slices": sum(e["ph"] == "X" for e in added), "note": note}


def into_traces(cycles: list[dict[str, Any]], batches: Any) -> dict[str, Any] | None:
    """Profile mode, after the capture: each cycle's trace gains the workers' tracks and its figures over its
    profiled steps (cycle["input"]); returned: the figures over all cycles' steps. None without a DataLoader."""
    timeline = getattr(batches, "timeline", None)
    if timeline is None:
        return None
    records, windows = timeline.records(), []
    for c in cycles:
        added = add_tracks(c["trace"], records)
        if added is None:
            c["input"] = {"note": "the trace has no baseTimeNanoseconds or no ProfilerStep: no worker tracks"}
            continue
        windows.append(added["steps"])
        c["input"] = {"worker_slices": added["slices"], **window_figures(records, [added["steps"]], timeline.workers)}
        if added["note"]:
            c["input"]["tracks_note"] = added["note"]
    if not windows:
        return {"note": "no trace could be placed on the wall clock", "verdict": None, "workers_limit": None}
    return window_figures(records, windows, timeline.workers)


def window_start(batches: Any) -> dict[str, Any]:
    """Bench mode, just before the timed window: host memory (host_memory.read, under "memory"), then the wall
    clock and the CPU counters (cpu_use.snapshot)."""
    pids = batches.worker_pids() if hasattr(batches, "worker_pids") else []
    memory = host_memory.read(pids)
    return {**cpu_use.snapshot(pids), "memory": memory}


def after_window(batches: Any, start: dict[str, Any], end_ns: int) -> dict[str, Any] | None:
    """Bench mode, after the timed window: the CPU counters and host memory first, then the batches the workers
    queued during the window are taken (untimed) so that their times count; the window's figures, with its CPU
    use under "cpu" and memory under "memory" (as read after the window, and the larger of that read and the one
    before it: pss_peak_mb, shm_peak_mb). None without a DataLoader."""
    timeline = getattr(batches, "timeline", None)
    if timeline is None:
        return None
    cpu = cpu_use.window_use(start, cpu_use.snapshot(list(start["workers"])), cpu_budget()["cpus"])
    memory = host_memory.read(list(start["workers"]))
    edges = host_memory.peak([start["memory"], memory]) if start.get("memory") else {}
    memory.update({k: edges.get(k) for k in ("pss_peak_mb", "main_pss_peak_mb", "workers_pss_peak_mb", "shm_peak_mb")})
    for _ in range(timeline.queue_depth):
        next(batches)
    figures = window_figures(timeline.records(), [(start["wall_ns"], end_ns)], timeline.workers)
    return {**figures, "cpu": cpu, "memory": memory}


def outputs(figures: dict[str, Any] | None) -> dict[str, Any]:
    """The figures as flat Polyaxon outputs (input_*), those measured alone."""
    if not figures or not figures.get("verdict"):
        return {}
    busy = list(figures["busy_share"].values())
    out = {
        "input_verdict": figures["verdict"],
        "input_workers_limit": figures["workers_limit"],
        "input_supply_ms": figures["supply_ms"],
        "input_supply_per_sec": figures["supply_per_sec"],
        "input_demand_ms": figures["demand_ms"],
        "input_ready_share": figures["ready_share"],
        "input_make_ms": figures["make_ms"]["median"],
        "input_make_p90_ms": figures["make_ms"]["p90"],
        "input_transport_ms": figures["transport_ms"]["median"],
        "input_busy_share_mean": round(sum(busy) / len(busy), 4) if busy else None,
    }
    cpu = figures.get("cpu") or {}
    out.update(cpus_used=cpu.get("cpus_used"), cpu_throttled_share=cpu.get("throttled_share"))
    out.update(cpu_bound=cpu.get("cpu_bound"), cpu_sentence=cpu.get("cpu_sentence"))
    memory = figures.get("memory") or {}
    kept = ("main_pss_mb", "workers_pss_mb", "shm_used_mb", "shm_size_mb", "pss_peak_mb", "shm_peak_mb")
    out.update({k: memory.get(k) for k in kept})
    return {k: v for k, v in out.items() if v is not None}
