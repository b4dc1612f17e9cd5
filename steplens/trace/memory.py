"""The memory a trace records: the profiler's [memory] events per device, as arrays; figures per step and scope.

A full capture (profile_memory=True) writes one instant event per allocation and free: `name "[memory]"`,
`cat cpu_instant_event`, args `Bytes` (negative for a free), `Total Allocated` and `Total Reserved` (the
allocator's running totals after the event), `Device Type` (0 CPU, 1 CUDA) and `Device Id`. docs/EVIDENCE.md
defines every figure made here."""

import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from steplens.trace.damage import Damage

MEMORY_EVENT = "[memory]"
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
NO_EVENTS = (
    "the trace has no memory events: it was captured without profile_memory (--profile-detail lean), "
    "or its steps allocated nothing (a CUDA graph's replay allocates nothing: its memory lives in the graph's pool)"
)
CPU_RESERVED = "the CPU allocator reserves nothing beyond what it allocates: the profiler reports 0"
COUNTED_FROM = {
    "cpu": "the blocks allocated while the profiler records (it does not know earlier ones): memory allocated "
    "since the capture's warm-up began, a lower bound of what the process holds",
    "cuda": "the caching allocator's own running total: every block the process holds on the device",
}


class Device:
    """One device's events, sorted later: start times and the three figures each event carries."""

    def __init__(self):
        self.ts, self.bytes = array("d"), array("q")
        self.allocated, self.reserved = array("q"), array("q")


class Memory:
    """Every device's memory events, kept as arrays (32 bytes an event), never as the events."""

    def __init__(self):
        self.devices: dict[str, Device] = {}
        self.unreadable = 0  # [memory] events without a finite time or numeric totals

    def add(self, ev: dict[str, Any]) -> None:
        """Keep one [memory] event's time, bytes and totals under its device."""
        args, ts = ev.get("args"), ev.get("ts")
        if not isinstance(args, dict) or not _number(ts):
            self.unreadable += 1
            return
        values = [args.get(k) for k in ("Bytes", "Total Allocated", "Total Reserved")]
        kind, index = args.get("Device Type"), args.get("Device Id")
        if not all(_number(v) for v in values) or not isinstance(kind, int) or isinstance(kind, bool):
            self.unreadable += 1
            return
        name = DEVICE_TYPES.get(kind, f"type{kind}")
        if name != "cpu":
            name = f"{name}:{index}"
        d = self.devices.get(name)
        if d is None:
            d = self.devices[name] = Device()
        d.ts.append(ts)
        d.bytes.append(int(values[0]))
        d.allocated.append(int(values[1]))
        d.reserved.append(int(values[2]))


def tap(events: Iterable[Any], memory: Memory) -> Iterator[Any]:
    """Pass every event on, keeping the [memory] ones in memory (the reader of complete events skips them)."""
    for ev in events:
        if type(ev) is dict and ev.get("ph") == "i" and ev.get("name") == MEMORY_EVENT:
            memory.add(ev)
        yield ev


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _sorted(d: Device) -> tuple[Device, int]:
    """The device's events in time order (file order among equal times), an event identical to the one before it
    dropped (a trace written twice); returns them and how many were dropped. Events already in time order (as
    the profiler writes them) are sorted in place: no second copy of the arrays."""
    n = len(d.ts)
    if any(d.ts[i] < d.ts[i - 1] for i in range(1, n)):
        order = sorted(range(n), key=d.ts.__getitem__)
        out = Device()
        for i in order:
            out.ts.append(d.ts[i])
            out.bytes.append(d.bytes[i])
            out.allocated.append(d.allocated[i])
            out.reserved.append(d.reserved[i])
        d = out
    columns = (d.ts, d.bytes, d.allocated, d.reserved)
    kept, last = 0, None
    for i in range(n):
        key = (d.ts[i], d.bytes[i], d.allocated[i], d.reserved[i])
        if key == last:
            continue
        last = key
        for column in columns:
            column[kept] = column[i]
        kept += 1
    for column in columns:
        del column[kept:]
    return d, n - kept


def _at(d: Device, i: int) -> tuple[int, int]:
    """(allocated, reserved) just before event i: the totals after event i-1, or before the first event."""
    if i > 0:
        return d.allocated[i - 1], d.reserved[i - 1]
    return d.allocated[0] - d.bytes[0], d.reserved[0]


def _span(d: Device, s: float, e: float) -> dict[str, Any]:
    """Allocated and reserved at the span's start, their peaks inside it, and at its end (bytes)."""
    i0, i1 = bisect_left(d.ts, s), bisect_left(d.ts, e)
    a0, r0 = _at(d, i0)
    a1, r1 = _at(d, i1)
    return {
        "allocated_start": a0,
        "allocated_peak": max([a0, *d.allocated[i0:i1]]),
        "allocated_end": a1,
        "reserved_start": r0,
        "reserved_peak": max([r0, *d.reserved[i0:i1]]),
        "reserved_end": r1,
        "events": i1 - i0,
    }


def _scope(d: Device, spans: list[list[float]]) -> dict[str, Any] | None:
    """A scope's net change and peak over its slices in one step (None where the step has none)."""
    if not spans:
        return None
    parts = [_span(d, s, e) for s, e in spans]
    return {
        "allocated_change": sum(p["allocated_end"] - p["allocated_start"] for p in parts),
        "allocated_peak": max(p["allocated_peak"] for p in parts),
        "reserved_change": sum(p["reserved_end"] - p["reserved_start"] for p in parts),
        "reserved_peak": max(p["reserved_peak"] for p in parts),
        "events": sum(p["events"] for p in parts),
    }


def breaks(d: Device) -> int:
    """Events whose allocated total is not the one before plus their bytes: each is a gap or a reordering."""
    return sum(d.allocated[i] != d.allocated[i - 1] + d.bytes[i] for i in range(1, len(d.ts)))


def figures(
    memory: Memory,
    steps: list[tuple[int, float, float]],
    scopes: dict[str, list[list[float]]],
    names: Iterable[str],
    damage: Damage | None = None,
) -> dict[str, Any]:
    """Per device: each step's allocated and reserved memory at its start, peak and end, and each scope's net change
    and peak inside it (bytes); the window's peaks; the events no step holds. names: the scopes to read.
    damage: where memory events written twice (read once) and unreadable ones (skipped) are counted.
    The devices' arrays are sorted and cleared of repeats in place: call it once per Memory."""
    devices = {name: _sorted(memory.devices[name]) for name in memory.devices}
    total = sum(len(d.ts) for d, _ in devices.values())
    out = {"events": total, "unreadable_events": memory.unreadable, "null_reason": None if total else NO_EVENTS}
    out["devices"] = {}
    if damage is not None:
        for _ in range(sum(repeated for _, repeated in devices.values())):
            damage.add("duplicate_memory", {"name": "[memory]"}, False)
        for _ in range(memory.unreadable):
            damage.add("unreadable_memory", {"name": "[memory]"}, False)
    for name in sorted(devices, key=lambda n: (n == "cpu", n)):
        d, repeated = devices[name]
        rows = []
        for num, a, b in steps:
            row = {"step": num, **_span(d, a, b)}
            row["scopes"] = {sc: _scope(d, [x for x in scopes.get(sc, []) if a <= x[0] < b]) for sc in names}
            rows.append(row)
        inside = sum(r["events"] for r in rows)
        dev = {
            "events": len(d.ts),
            "outside_steps": len(d.ts) - inside,
            "running_total_breaks": breaks(d),
            "reserved_null_reason": CPU_RESERVED if name == "cpu" else None,
            "allocated_counts": COUNTED_FROM.get(name.split(":")[0]),
            "steps": rows,
            "window": {
                "allocated_start": rows[0]["allocated_start"] if rows else None,
                "allocated_end": rows[-1]["allocated_end"] if rows else None,
                "reserved_start": rows[0]["reserved_start"] if rows else None,
                "reserved_end": rows[-1]["reserved_end"] if rows else None,
                "allocated_peak": max(r["allocated_peak"] for r in rows) if rows else None,
                "reserved_peak": max(r["reserved_peak"] for r in rows) if rows else None,
            },
        }
        if name == "cpu":
            for r in rows + [dev["window"]]:
                for k in [k for k in r if k.startswith("reserved_")]:
                    r[k] = None
                for sc in (r.get("scopes") or {}).values():
                    if sc:
                        sc["reserved_change"] = sc["reserved_peak"] = None
        out["devices"][name] = dev
    return out


NO_GPU_EVENTS = "the trace's memory events are the CPU's alone: it holds no GPU memory to draw"


def lane(memory: Memory, steps: list[tuple[int, float, float]]) -> dict[str, Any]:
    """The GPU's allocated memory over each step, for the step picture: {"device", "null_reason", "steps": {step:
    [(ts, allocated bytes)]}}. Each step's points: the total at its start, the running total after each of its
    events (the allocator's own `Total Allocated`), and the total at its end. One device: the GPU with the most
    events (a process has one). Without GPU memory events, device None and the reason."""
    gpus = [name for name in memory.devices if name != "cpu"]
    if not gpus:
        reason = NO_GPU_EVENTS if memory.devices else NO_EVENTS
        return {"device": None, "null_reason": reason, "steps": {}}
    name = max(sorted(gpus), key=lambda n: len(memory.devices[n].ts))
    d, _ = _sorted(memory.devices[name])
    out = {}
    for num, a, b in steps:
        i0, i1 = bisect_left(d.ts, a), bisect_left(d.ts, b)
        points = [(a, _at(d, i0)[0])]
        points += [(d.ts[i], d.allocated[i]) for i in range(i0, i1)]
        out[num] = points + [(b, _at(d, i1)[0])]
    return {"device": name, "null_reason": None, "steps": out}
