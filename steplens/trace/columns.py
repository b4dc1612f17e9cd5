"""A trace's GPU events and launch calls held as columns (arrays), not as a tuple of Python objects each.

A tuple per event, with its floats and ids, costs about 200 bytes; these columns cost 48 bytes a GPU event and
29 a launch call, and hold no small objects that pin the allocator's memory. Read back, an event is the same
tuple the figures always read (timeline.Trace says which)."""

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from steplens.trace.spill import SortedRecords

_NONE, _INT, _OTHER = 0, 1, 2
_LOW, _HIGH = -(1 << 63), (1 << 63) - 1


class Values:
    """A column of JSON scalars: plain ints in an array, None as a flag, anything else (rare) aside."""

    def __init__(self):
        self.ints, self.kinds, self.other = array("q"), bytearray(), {}

    def append(self, v: Any) -> None:
        if type(v) is int and _LOW <= v <= _HIGH:
            self.kinds.append(_INT)
            self.ints.append(v)
            return
        if v is not None:
            self.other[len(self.kinds)] = v
        self.kinds.append(_NONE if v is None else _OTHER)
        self.ints.append(0)

    def __getitem__(self, i: int) -> Any:
        kind = self.kinds[i]
        if kind == _INT:
            return self.ints[i]
        return None if kind == _NONE else self.other[i % len(self.kinds)]

    def take(self, places: Iterable[int]) -> list[Any]:
        """[self[i] for i in places], places at or past 0, in one pass."""
        ints, kinds, other = self.ints, self.kinds, self.other
        return [ints[i] if kinds[i] == _INT else other.get(i) for i in places]  # (None: not in other)

    def __len__(self) -> int:
        return len(self.kinds)


class Names:
    """Each distinct name once, and its number."""

    def __init__(self):
        self.names: list[str] = []
        self.codes: dict[str, int] = {}

    def code(self, name: str) -> int:
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = len(self.names)
            self.names.append(name)
        return c


class GpuEvent(tuple):
    """One GPU event as the figures read it, (kind, start, end, stream, correlation, bytes), equal to that plain
    tuple; index: its place among the trace's GPU events (GpuEvents.name gives its name)."""

    index: int


KINDS = ("kernel", "h2d", "memcpy", "memset")
_KIND_CODES = {k: i for i, k in enumerate(KINDS)}


class GpuEvents:
    """The trace's GPU events in file order, as columns; reads as a sequence of GpuEvent tuples."""

    def __init__(self, names: Names | None = None):
        self.kind, self.name_code = bytearray(), array("i")
        self.start, self.end = array("d"), array("d")
        self.stream, self.corr, self.bytes = Values(), Values(), Values()
        self.names = names or Names()

    def append(self, kind: str, s: float, e: float, stream: Any, corr: Any, nbytes: Any, name: str) -> None:
        self.kind.append(_KIND_CODES[kind])
        self.start.append(s)
        self.end.append(e)
        self.stream.append(stream)
        self.corr.append(corr)
        self.bytes.append(nbytes)
        self.name_code.append(self.names.code(name))

    def __len__(self) -> int:
        return len(self.kind)

    def __getitem__(self, i: int) -> GpuEvent:
        if i < 0:
            i += len(self.kind)
        ev = GpuEvent((KINDS[self.kind[i]], self.start[i], self.end[i], self.stream[i], self.corr[i], self.bytes[i]))
        ev.index = i
        return ev

    def __iter__(self) -> Iterator[GpuEvent]:
        return _chunks(self.take, len(self.kind))

    def take(self, places: Iterable[int]) -> list[GpuEvent]:
        """[self[i] for i in places], places at or past 0, in one pass."""
        places = places if isinstance(places, (array, range, list)) else list(places)
        kinds, code, start, end = KINDS, self.kind, self.start, self.end
        out = []
        for i, stream, corr, nbytes in zip(
            places, self.stream.take(places), self.corr.take(places), self.bytes.take(places)
        ):
            ev = GpuEvent((kinds[code[i]], start[i], end[i], stream, corr, nbytes))
            ev.index = i
            out.append(ev)
        return out

    def name(self, i: int) -> str:
        return self.names.names[self.name_code[i]]


class GpuNames:
    """Each GPU event's name, looked up by the event (a GpuEvent of the trace): what the figures read as
    t.gpu_names.get(ev, "")."""

    def __init__(self, gpu: GpuEvents):
        self.gpu = gpu

    def get(self, ev: Any, default: Any = None) -> Any:
        i = getattr(ev, "index", None)
        return default if i is None or i >= len(self.gpu) else self.gpu.name(i)

    def __getitem__(self, ev: Any) -> str:
        found = self.get(ev)
        if found is None:
            raise KeyError(ev)
        return found


class RuntimeCalls:
    """The trace's CUDA runtime and driver calls in file order, as columns; reads as (name, start, end,
    correlation) tuples."""

    def __init__(self, names: Names | None = None):
        self.name_code, self.start, self.end, self.corr = array("i"), array("d"), array("d"), Values()
        self.names = names or Names()

    def append(self, name: str, s: float, e: float, corr: Any) -> None:
        self.name_code.append(self.names.code(name))
        self.start.append(s)
        self.end.append(e)
        self.corr.append(corr)

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> tuple[str, float, float, Any]:
        return (self.names.names[self.name_code[i]], self.start[i], self.end[i], self.corr[i])

    def __iter__(self) -> Iterator[tuple[str, float, float, Any]]:
        return _chunks(self.take, len(self.start))

    def take(self, places: Iterable[int]) -> list[tuple[str, float, float, Any]]:
        """[self[i] for i in places], places at or past 0, in one pass."""
        places = places if isinstance(places, (array, range, list)) else list(places)
        names, code, start, end = self.names.names, self.name_code, self.start, self.end
        return [(names[code[i]], start[i], end[i], corr) for i, corr in zip(places, self.corr.take(places))]


class SyncOps(RuntimeCalls):
    """The CPU operators that hand a GPU value to the host (aten::item, ...), in file order, as RuntimeCalls'
    columns with the tid where a call has its correlation id: 29 bytes an operator, not a tuple of four objects
    (about 170 bytes); reads as (name, start, end, tid) tuples."""


def _chunks(take: Callable[[range], list[Any]], n: int, size: int = 256) -> Iterator[Any]:
    """take's items of places 0 to n, made size at a time (not all held at once)."""
    for a in range(0, n, size):
        yield from take(range(a, min(a + size, n)))


def _int_key(v: Any) -> int | None:
    """The int a correlation id equals (a dict would take 5, 5.0 and True as one key), or None."""
    if isinstance(v, int):
        return int(v) if _LOW <= v <= _HIGH else None
    if isinstance(v, float) and v.is_integer() and _LOW <= v <= _HIGH:
        return int(v)
    return None


class CorrIndex:
    """Correlation id -> the place of the last item that carries it, as a dict of them would hold it, kept as two
    sorted arrays (12 bytes an id; ids that are no whole number, rare, in a dict)."""

    def __init__(self, items: Iterable[tuple[Any, int]]):  # (correlation id, place), None ids left out
        records, self.other = SortedRecords("q", 2), {}
        for corr, place in items:
            if corr is None:
                continue
            key = _int_key(corr)
            if key is None:
                self.other[corr] = place
            else:
                records.add((key, place))
        self.keys, self.places = array("q"), array("i")
        for key, place in records:
            if self.keys and self.keys[-1] == key:
                self.places[-1] = place  # the later place: sorted by (key, place)
            else:
                self.keys.append(key)
                self.places.append(place)

    def get(self, corr: Any) -> int | None:
        if corr is None:
            return None
        key = _int_key(corr)
        if key is None:
            return self.other.get(corr)
        i = bisect_left(self.keys, key)
        return self.places[i] if i < len(self.keys) and self.keys[i] == key else None

    def __contains__(self, corr: Any) -> bool:
        return self.get(corr) is not None


def sorted_pairs(pairs: Iterable[tuple[float, float]]) -> Iterator[tuple[float, float]]:
    """(start, end) pairs in sorted order, as sorted() would give them, through spill.SortedRecords: a chunk in
    memory at a time, whatever their number."""
    records = SortedRecords("d", 2)
    for pair in pairs:
        records.add(pair)
    return iter(records)


def merge_sorted(pairs: Iterable[tuple[float, float]]) -> Iterator[list[float]]:
    """intervals.union of pairs already in sorted order, yielded one merged [start, end) at a time."""
    cur = None
    for s, e in pairs:
        if cur is not None and s <= cur[1]:
            if e > cur[1]:
                cur[1] = e
        else:
            if cur is not None:
                yield cur
            cur = [s, e]
    if cur is not None:
        yield cur


class Merged:
    """Merged [start, end) intervals (intervals.union's) as two arrays: 16 bytes an interval."""

    def __init__(self, merged: Iterable[list[float]] = ()):
        self.starts, self.ends = array("d"), array("d")
        for s, e in merged:
            self.starts.append(s)
            self.ends.append(e)

    def __len__(self) -> int:
        return len(self.starts)

    def pairs(self) -> Iterator[list[float]]:
        """Every interval, in order, as [start, end]."""
        return ([s, e] for s, e in zip(self.starts, self.ends))

    def clip(self, a: float, b: float) -> Iterator[list[float]]:
        """intervals.clip of the intervals to [a, b), one at a time: only those that reach into it are read."""
        lo, hi = bisect_right(self.ends, a), bisect_left(self.starts, b)
        for i in range(lo, hi):
            s, e = max(self.starts[i], a), min(self.ends[i], b)
            if s < e:
                yield [s, e]

    def clip_all(self, merged: Iterable[list[float]]) -> Iterator[list[float]]:
        """intervals.intersect of the intervals with other merged ones, one clip per other interval."""
        for a, b in merged:
            yield from self.clip(a, b)
