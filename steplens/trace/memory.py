"""The memory a trace records: the profiler's [memory] events per device, as arrays; figures per step and scope.

A full capture (profile_memory=True) writes one instant event per allocation and free: `name "[memory]"`,
`cat cpu_instant_event`, args `Bytes` (negative for a free), `Total Allocated` and `Total Reserved` (the
allocator's running totals after the event), `Device Type` (0 CPU, 1 CUDA) and `Device Id`. docs/MEMORY.md
defines every figure made here."""

import math
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from steplens.trace.damage import Damage
from steplens.trace.spill import SortedRecords

MEMORY_EVENT = "[memory]"
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
NO_EVENTS = (
    "the trace has no memory events: it was captured without profile_memory, "
    "or its steps allocated nothing (a CUDA graph's replay allocates nothing: its memory lives in the graph's pool)"
)
CPU_RESERVED = "the CPU allocator reserves nothing beyond what it allocates: the profiler reports 0"
COUNTED_FROM = {
    "cpu": "the blocks allocated while the profiler records (it does not know earlier ones): memory allocated "
    "since the capture's warm-up began, a lower bound of what the process holds",
    "cuda": "the caching allocator's own running total: every block the process holds on the device",
}


class Device:
    """One device's events as records (time, file order, bytes, allocated, reserved) in spill.SortedRecords:
    sorted on disk when there are many, so memory does not grow with the events."""

    def __init__(self):
        self.records = SortedRecords("q", 5)
        self.count = 0  # events kept (after figures: those left once repeats are dropped)


class Memory:
    """Every device's memory events, kept as sorted records (40 bytes an event, on disk past a chunk)."""

    def __init__(self):
        self.devices: dict[str, Device] = {}
        self.unreadable = 0  # [memory] events without a finite time, or a byte count or total no number within 64 bits
        self.seen = 0  # events kept, all devices: each one's place in the file
        self._by_id: dict[tuple[int, Any], Device] = {}  # (Device Type, Device Id): its device, once seen

    def add(self, args: Any, ts: Any) -> None:
        """Keep one [memory] event's time, bytes and totals under its device (else count it unreadable), from its
        args and ts (None where it has none, or reader.UNSET: neither is a dict or a number)."""
        if type(args) is dict and type(ts) is float and -_INF < ts < _INF:  # the common event: plain numbers
            nbytes, allocated, reserved = args.get("Bytes"), args.get("Total Allocated"), args.get("Total Reserved")
            kind, index = args.get("Device Type"), args.get("Device Id")
            if type(nbytes) is int and type(allocated) is int and type(reserved) is int and type(kind) is int:
                d = self._by_id.get((kind, index)) if type(index) in _INDEX_TYPES else None
                if d is not None:
                    record = _packed(ts, self.seen, nbytes, allocated, reserved)
                    if record is None:
                        self.unreadable += 1
                        return
                    d.records.add_bytes(record)
                    d.count += 1
                    self.seen += 1
                    return
        if not isinstance(args, dict) or not _number(ts):
            self.unreadable += 1
            return
        values = [args.get(k) for k in ("Bytes", "Total Allocated", "Total Reserved")]
        kind, index = args.get("Device Type"), args.get("Device Id")
        record = None
        if all(_number(v) for v in values) and isinstance(kind, int) and not isinstance(kind, bool):
            record = _packed(float(ts), self.seen, int(values[0]), int(values[1]), int(values[2]))
        if record is None:
            self.unreadable += 1
            return
        name = DEVICE_TYPES.get(kind, f"type{kind}")
        if name != "cpu":
            name = f"{name}:{index}"
        d = self.devices.get(name)
        if d is None:
            d = self.devices[name] = Device()
        if type(index) in _INDEX_TYPES:
            self._by_id[(kind, index)] = d
        d.records.add_bytes(record)
        d.count += 1
        self.seen += 1

    def close(self) -> None:
        """Close every device's temp file (records given up: the trace is read again)."""
        for d in self.devices.values():
            d.records.close()

    def take(self, ev: dict[str, Any]) -> None:
        """Keep ev where it is a [memory] event; any other event is left (damage.readable's other)."""
        if ev.get("ph") == "i" and ev.get("name") == MEMORY_EVENT:
            self.add(ev.get("args"), ev.get("ts"))


_SIGN = 1 << 63


_INF = math.inf
_INDEX_TYPES = (int, type(None))  # a Device Id that names a device the same way each time it is read
_DOUBLE, _INT64 = struct.Struct("<d"), struct.Struct("<q")  # a time's 8 bytes, read either way (_time_key, _time)
_RECORD = struct.Struct("=d4q").pack  # a Device record's bytes (its array's typecode "q", width 5), time first
_RECORD_KEYED = struct.Struct("=5q").pack  # the same, the time given as its _time_key


def _time_key(ts: float) -> int:
    """An integer that sorts as the time does (the double's bits, negatives flipped); -0.0 reads as 0.0."""
    bits = _INT64.unpack(_DOUBLE.pack(ts + 0.0))[0]
    return bits if bits >= 0 else -(bits + _SIGN) - 1


def _packed(ts: float, seen: int, nbytes: int, allocated: int, reserved: int) -> bytes | None:
    """A Device record's bytes (the time's _time_key, the place in the file, bytes, allocated, reserved), packed in
    one call, or None where a number does not fit 64 bits. At or past 0 a time's double's bits are its _time_key:
    it is packed as the double."""
    try:
        if ts >= 0.0:
            return _RECORD(ts + 0.0, seen, nbytes, allocated, reserved)
        return _RECORD_KEYED(_time_key(ts), seen, nbytes, allocated, reserved)
    except struct.error:
        return None


def _time(key: int) -> float:
    """The time _time_key was given."""
    bits = key if key >= 0 else (-key - 1) - _SIGN
    return _DOUBLE.unpack(_INT64.pack(bits))[0]


def tap(events: Iterable[Any], memory: Memory) -> Iterator[Any]:
    """Pass every event on, keeping the [memory] ones in memory (the reader of complete events skips them)."""
    for ev in events:
        if type(ev) is dict and ev.get("ph") == "i" and ev.get("name") == MEMORY_EVENT:
            memory.add(ev.get("args"), ev.get("ts"))
        yield ev


def _number(v: Any) -> bool:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past a double's range
        return False


def _events(d: Device, keep: bool, counts: dict[str, int]) -> Iterator[tuple[float, int, int, int]]:
    """The device's events (ts, bytes, allocated, reserved) in time order (file order among equal times), an
    event identical to the one before it dropped (a trace written twice). counts gets "events" (those given),
    "repeated" (those dropped) and "breaks" (those whose allocated total is not the one before plus their bytes:
    each is a gap or a reordering). keep: the records stay to be read again."""
    last = None
    counts.update(events=0, repeated=0, breaks=0)
    for key, _, nbytes, allocated, reserved in d.records.read(keep):
        event = (_time(key), nbytes, allocated, reserved)
        if event == last:
            counts["repeated"] += 1
            continue
        if last is not None and allocated != last[2] + nbytes:
            counts["breaks"] += 1
        counts["events"] += 1
        last = event
        yield event


class _Span:
    """A span [start, end) read as the events pass: the totals just before its first event and after its last
    (before the device's first event: its allocated total less its bytes), their peaks, the events in it."""

    def __init__(self, before: tuple[int, int], index: int):
        self.allocated_start, self.reserved_start = before
        self.allocated_peak, self.reserved_peak = before
        self.first = index
        self.points: list[tuple[float, int]] = []

    def see(self, allocated: float, reserved: float) -> None:
        """Peaks of events it holds (-inf: none)."""
        if allocated > self.allocated_peak:
            self.allocated_peak = allocated
        if reserved > self.reserved_peak:
            self.reserved_peak = reserved

    def end(self, before: tuple[int, int], index: int) -> dict[str, Any]:
        return {
            "allocated_start": self.allocated_start,
            "allocated_peak": self.allocated_peak,
            "allocated_end": before[0],
            "reserved_start": self.reserved_start,
            "reserved_peak": self.reserved_peak,
            "reserved_end": before[1],
            "events": index - self.first,
            "points": self.points,
        }


def _sweep(events: Iterator[tuple[float, int, int, int]], spans: list[tuple[float, float]], points: bool = False):
    """Each span's figures (_Span.end) in one pass over a device's sorted events: a span holds the events from the
    first at or after its start to the last before its end. points: each span also lists its (ts, allocated).
    Between two span bounds every event is seen by the same open spans: their peaks are met once, at the next
    bound, from the peaks of the events between."""
    bounds = sorted((x, kind, q) for q, (s, e) in enumerate(spans) for x, kind in ((s, 0), (e, 1)))
    found, open_, b, index, prev, first = [None] * len(spans), {}, 0, 0, None, None
    top_a = top_r = -_INF  # the peaks of the events since the last bound
    at = bounds[0][0] if bounds else _INF  # the next bound

    def before():  # (allocated, reserved) just before the event at index
        return (prev[2], prev[3]) if prev is not None else (first[2] - first[1], first[3])

    def settle(b: int, upto: float | None) -> int:  # the open spans see the peaks; the bounds up to upto pass
        for span in open_.values():
            span.see(top_a, top_r)
        while b < len(bounds) and (upto is None or bounds[b][0] <= upto):  # None: every bound left
            _, kind, q = bounds[b]
            if kind == 0:
                open_[q] = _Span(before(), index)
            else:
                found[q] = open_.pop(q).end(before(), index)
            b += 1
        return b

    for event in events:
        if first is None:
            first = event
        if event[0] >= at:
            b = settle(b, event[0])
            top_a = top_r = -_INF
            at = bounds[b][0] if b < len(bounds) else _INF
        if event[2] > top_a:
            top_a = event[2]
        if event[3] > top_r:
            top_r = event[3]
        if points:
            for span in open_.values():
                span.points.append((event[0], event[2]))
        prev, index = event, index + 1
    settle(b, None)
    return found


def _scope(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A scope's net change and peak over its slices in one step (None where the step has none)."""
    if not parts:
        return None
    return {
        "allocated_change": sum(p["allocated_end"] - p["allocated_start"] for p in parts),
        "allocated_peak": max(p["allocated_peak"] for p in parts),
        "reserved_change": sum(p["reserved_end"] - p["reserved_start"] for p in parts),
        "reserved_peak": max(p["reserved_peak"] for p in parts),
        "events": sum(p["events"] for p in parts),
    }


def _rows(d: Device, steps, scopes, names) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each step's row of figures (its span, each scope's slices in it) and the device's counts (_events)."""
    spans, own = [], []  # own: each step's span, and each scope's slices in it, as indices into spans
    for _, a, b in steps:
        mine = {"": range(len(spans), len(spans) + 1)}
        spans.append((a, b))
        for sc in names:
            xs = [(x[0], x[1]) for x in scopes.get(sc, []) if a <= x[0] < b]
            mine[sc] = range(len(spans), len(spans) + len(xs))
            spans += xs
        own.append(mine)
    counts = {}
    found = _sweep(_events(d, True, counts), spans)
    for f in found:
        del f["points"]
    rows = []
    for (num, _, _), mine in zip(steps, own):
        row = {"step": num, **found[mine[""][0]]}
        row["scopes"] = {sc: _scope([found[j] for j in mine[sc]]) for sc in names}
        rows.append(row)
    return rows, counts


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
    Each device's records are read in one pass (kept for memory.lane); call it once per Memory."""
    devices = {name: _rows(memory.devices[name], steps, scopes, names) for name in memory.devices}
    total = sum(counts["events"] for _, counts in devices.values())
    out = {"events": total, "unreadable_events": memory.unreadable, "null_reason": None if total else NO_EVENTS}
    out["devices"] = {}
    if damage is not None:
        for _ in range(sum(counts["repeated"] for _, counts in devices.values())):
            damage.add("duplicate_memory", {"name": "[memory]"}, False)
        for _ in range(memory.unreadable):
            damage.add("unreadable_memory", {"name": "[memory]"}, False)
    for name in sorted(devices, key=lambda n: (n == "cpu", n)):
        rows, counts = devices[name]
        memory.devices[name].count = counts["events"]
        inside = sum(r["events"] for r in rows)
        dev = {
            "events": counts["events"],
            "outside_steps": counts["events"] - inside,
            "running_total_breaks": counts["breaks"],
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
    name = max(sorted(gpus), key=lambda n: memory.devices[n].count)
    found = _sweep(_events(memory.devices[name], True, {}), [(a, b) for _, a, b in steps], points=True)
    out = {}
    for (num, a, b), f in zip(steps, found):
        out[num] = [(a, f["allocated_start"]), *f["points"], (b, f["allocated_end"])]
    return {"device": name, "null_reason": None, "steps": out}
