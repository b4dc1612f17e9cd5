"""Perfetto's nesting rule for complete events: which slices its JSON importer drops, and a repair that leaves none.

Perfetto's JSON importer before v57.1 drops a complete event that starts inside another on its (pid, tid) track
and outlasts it. PyTorch traces cross that rule in two ways: with_stack=True scopes that start and end inside
Python slices, and overlapping kernels on one stream (Hopper). repair() clips the first and moves the second to a
sibling track. The rule as Perfetto's source states it, and the checks against a real UI: docs/PERFETTO.md."""

import gzip
import heapq
import itertools
import json
from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from steplens.trace.spill import Runs, SortedRecords

GPU_TRACK_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
PYTHON_CAT = "python_function"
OVERLAP_ARG = "overlap_track_of"  # on a moved GPU event: the tid of the stream track it belongs to
SIBLING_TID_STEP = 1_000_000  # a sibling track's tid: the stream's tid + lane x this (checked to be free)


try:  # the fastest JSON codec at hand: a workers=0 full trace is about 54 MB of JSON
    import orjson
except ImportError:
    orjson = None


class NestingError(Exception):
    pass


def to_ns(value: float | str) -> int:
    """A JSON timestamp or duration in µs, as Perfetto's tokenizer turns it into integer nanoseconds."""
    if isinstance(value, int):
        return value * 1000
    v = float(value)
    return _float_ns(v) if v >= 0 else -to_ns(-v)


def _float_ns(v: float) -> int:
    """to_ns of a float that is not negative: llround, halves away from zero."""
    if v.is_integer():
        return int(v) * 1000
    r = v * 1000.0
    n = int(r)
    return n + 1 if r - n >= 0.5 else n


def complete_event(ev: Any) -> tuple[tuple[Any, Any], int, int] | None:
    """(track, ts_ns, dur_ns) of a complete event the importer places on a thread track, else None."""
    if not isinstance(ev, dict) or ev.get("ph") != "X" or "dur" not in ev:
        return None
    try:
        ts, dur = to_ns(ev["ts"]), to_ns(ev["dur"])
    except (KeyError, TypeError, ValueError):
        return None
    if ts < 0 or dur < 0:  # the importer rejects these for other reasons
        return None
    return (ev.get("pid"), ev.get("tid")), ts, dur


def complete_events(events: Iterable[Any]) -> Iterator[tuple[int, tuple[Any, Any], int, int]]:
    """(index, track, ts_ns, dur_ns) of each complete event the importer places on a thread track."""
    for i, ev in enumerate(events):
        found = complete_event(ev)
        if found:
            yield (i, *found)


def by_start_then_longest(starts: Sequence[float], ends: Sequence[float], max_runs: int = 64) -> Iterable[int]:
    """Indices ordered by start, the longest first among equal starts (an enclosing slice before its child).

    A trace lists a thread's slices almost in order (a few sorted runs): merging the runs holds one
    index per run, where sorting would hold a key per slice, several times the slices' own memory on
    a big trace. Many runs: sorted by the start alone, then equal-start runs by end.
    """
    key = lambda i: (starts[i], -ends[i])
    n = len(starts)
    runs, a = [], 0
    for i in range(1, n):
        if starts[i] < starts[i - 1] or (starts[i] == starts[i - 1] and ends[i] > ends[i - 1]):
            runs.append(range(a, i))
            a = i
            if len(runs) > max_runs:
                break
    else:
        runs.append(range(a, n))
        return heapq.merge(*runs, key=key) if len(runs) > 1 else iter(range(n))
    order = sorted(range(n), key=starts.__getitem__)
    i = 0
    while i < n:
        j = i + 1
        while j < n and starts[order[j]] == starts[order[i]]:
            j += 1
        if j - i > 1:
            order[i:j] = sorted(order[i:j], key=lambda k: -ends[k])
        i = j
    return order


def accepts(stack: list[tuple[int, int]], ts: int, dur: int) -> bool:
    """The slice tracker's rule (MaybeCloseStack): pops what has closed; False if the new slice must be dropped.

    stack: [(end, dur)] of the open slices, outermost first; changed in place as the importer changes it.
    """
    i = len(stack) - 1
    while i >= 0:
        end, d = stack[i]
        if end < ts or (end == ts and not (d == 0 and dur == 0)):
            stack.pop()  # the importer pops the top of the stack here, whichever level it looked at
            i -= 1
            continue
        if ts < end < ts + dur:
            return False
        if end > ts:  # the new slice nests here; the slices below end no earlier: none of them pops or crosses
            return True
        i -= 1
    return True


class Tracks:
    """Complete events gathered one at a time (a list or a stream), per (pid, tid) track, as compact arrays."""

    def __init__(self):
        self.tracks = defaultdict(lambda: (array("q"), array("q"), array("q")))  # index, ts, end (ns)

    def add(self, index: int, track: tuple[Any, Any], ts: int, dur: int) -> None:
        idx, starts, ends = self.tracks[track]
        idx.append(index)
        starts.append(ts)
        ends.append(ts + dur)

    def add_event(self, index: int, ev: Any) -> None:
        found = complete_event(ev)
        if found:
            self.add(index, *found)

    def in_importer_order(self) -> Iterator[tuple[tuple[Any, Any], Iterator[tuple[int, int, int]]]]:
        """Per track: (index, ts, dur) as the importer sorts them (ts; the longer first; the file's order).

        Each track's slices come one at a time, read once: a list of them would hold a tuple per slice,
        several times the arrays' own memory on a big trace."""
        for track, (idx, starts, ends) in self.tracks.items():
            yield track, ((idx[k], starts[k], ends[k] - starts[k]) for k in by_start_then_longest(starts, ends))

    def dropped(self) -> list[int]:
        """Indices of the complete events the importer (before v57.1) would drop, in file order."""
        out = []
        for _, slices in self.in_importer_order():
            stack = []
            for i, ts, dur in slices:
                if accepts(stack, ts, dur):
                    stack.append((ts + dur, dur))
                else:
                    out.append(i)
        return sorted(out)


class DropCount:
    """How many complete events the importer (before v57.1) would drop, from events gathered one at a time.

    Each event is kept as one record (track, ts, -end) in spill.SortedRecords: sorted on disk when there are
    many, so memory does not grow with the trace. Slices with equal track, ts and end are interchangeable for
    the importer's rule, so their order among themselves does not change the count (Tracks keeps indices)."""

    def __init__(self):
        self.ids: dict[tuple[Any, Any], int] = {}
        self.records = SortedRecords("q", 3)

    def add_event(self, ev: Any) -> None:
        found = complete_event(ev)
        if found:
            self.add(*found)

    def add(self, track: tuple[Any, Any], ts: int, dur: int) -> None:
        """One slice: its track and its times in integer ns (to_ns)."""
        n = self.ids.get(track)
        if n is None:
            n = self.ids[track] = len(self.ids)
        self.records.add((n, ts, -(ts + dur)))

    def add_readable(self, track: tuple[Any, Any], ev: dict[str, Any]) -> None:
        """A complete event that damage.readable kept (a dict, ph X, with ts and dur): as add_event, sooner."""
        ts, dur = ev["ts"], ev["dur"]
        if type(ts) is float and type(dur) is float and ts >= 0.0:  # dur >= 0: readable checked it
            self.add(track, _float_ns(ts), _float_ns(dur))
        else:
            self.add_event(ev)

    def count(self) -> int:
        """The number dropped, track by track in the importer's order (ts; the longer first). Read once."""
        n, track, stack = 0, None, []
        for tr, ts, neg_end in self.records:
            if tr != track:
                track, stack = tr, []
            dur = -neg_end - ts
            if accepts(stack, ts, dur):
                stack.append((ts + dur, dur))
            else:
                n += 1
        return n


def gather(events: Iterable[Any]) -> Tracks:
    tracks = Tracks()
    for i, track, ts, dur in complete_events(events):
        tracks.add(i, track, ts, dur)
    return tracks


def dropped(events: Iterable[Any]) -> list[int]:
    """Indices of the complete events Perfetto's importer (before v57.1) would drop, in file order."""
    return gather(events).dropped()


def violations(events: Iterable[Any]) -> int:
    """How many complete events Perfetto's importer (before v57.1) would drop."""
    return len(dropped(events))


def _us(ns):
    return ns / 1000.0  # exact enough: llround(ns / 1000 * 1000) gives ns back for any trace duration


def _clip_cpu_track(events, slices, counts):
    """Clip Python slices that cross another slice of their track, in the importer's order (see repair)."""
    stack = []  # [end, dur, index] of the open slices
    for i, ts, dur in slices:
        while True:
            while stack and (stack[-1][0] < ts or (stack[-1][0] == ts and not (stack[-1][1] == 0 and dur == 0))):
                stack.pop()
            if not stack or ts + dur <= stack[-1][0]:
                stack.append([ts + dur, dur, i])
                break
            top_end, _, j = stack[-1]
            if events[i].get("cat") == PYTHON_CAT:  # the new Python slice ends where the open slice ends
                new = top_end - ts
                _note_clip(counts, dur - new)
                events[i]["dur"] = _us(new)
                dur = new
            elif events[j].get("cat") == PYTHON_CAT:  # the open Python slice ends where the new slice starts
                top_ts = top_end - stack[-1][1]
                _note_clip(counts, top_end - ts)
                events[j]["dur"] = _us(ts - top_ts)
                stack.pop()
            else:  # two slices of other kinds cross: left as they are, and repair() refuses the trace
                break


def _note_clip(counts, ns):
    counts["clipped"] += 1
    counts["clipped_max_us"] = max(counts["clipped_max_us"], round(ns / 1000.0, 3))


def _lanes_for_gpu_track(slices):
    """Each event's lane: 0 on the stream's own track; else the first sibling where it nests (Perfetto v57.1's
    overflow tracks: a slice goes to the first lane where it nests in the innermost open slice or follows them)."""
    lanes, where = [[]], {}
    for i, ts, dur in slices:
        for n, stack in enumerate(lanes):
            if accepts(stack, ts, dur):
                break
        else:
            lanes.append([])
            n, stack = len(lanes) - 1, lanes[-1]
        stack.append((ts + dur, dur))
        where[i] = n
    return where


def repair_file(path: str) -> dict[str, float]:
    """Repair a Chrome trace file (.json or .json.gz) in place: read, repair, write back in the same format.

    Meant for a file no reader sees yet (profile mode repairs its temp file before renaming it). Returns
    repair()'s counts.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    doc = _loads(data)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise NestingError(f"{path}: no traceEvents list: not a Chrome trace")
    _, counts = repair(events)
    data = orjson.dumps(doc) if orjson else json.dumps(doc, separators=(",", ":")).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)  # zlib's default level: most of level 9's size, in half the time
    with open(path, "wb") as f:
        f.write(data)
    return counts


def _loads(data):
    if orjson:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # e.g. an integer beyond 64 bits, which orjson refuses and json reads
            pass
    return json.loads(data)


def repair(events: Iterable[Any]) -> tuple[list[Any], dict[str, float]]:
    """Events that every Perfetto version imports whole, and what was changed: {clipped, clipped_max_us, moved}.

    (a) A Python slice (cat python_function) that crosses a slice of another kind on its thread is clipped
        to that slice's boundary; the other slice (a scope, an operator) keeps its times. Two Python slices
        that cross: the later one is clipped.
    (b) An event on a GPU stream's track that partially overlaps an earlier one moves, with its ts and dur
        unchanged, to a sibling track of that stream (a new tid named "stream S (overlapping)"); its args
        carry overlap_track_of = the stream's tid. Flow ends bound to it move with it.
    The list is changed in place and returned; every event is kept. counts also carries violations_before
    (what the importer would have dropped). Raises NestingError if anything would still be dropped.
    """
    events = events if isinstance(events, list) else list(events)
    counts = {"clipped": 0, "clipped_max_us": 0.0, "moved": 0}
    tracks = Tracks()
    gpu_tracks = set()
    for i, track, ts, dur in complete_events(events):
        tracks.add(i, track, ts, dur)
        if events[i].get("cat") in GPU_TRACK_CATS:
            gpu_tracks.add(track)
    counts["violations_before"] = len(tracks.dropped())
    used = defaultdict(set)
    for ev in events:
        if isinstance(ev, dict):
            used[ev.get("pid")].add(ev.get("tid"))
    names = {
        (ev.get("pid"), ev.get("tid")): ev
        for ev in events
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_name"
    }
    moved_at, added = {}, []
    for track, slices in tracks.in_importer_order():
        if track not in gpu_tracks:
            _clip_cpu_track(events, slices, counts)
            continue
        pid, tid = track
        siblings = {}
        for i, lane in _lanes_for_gpu_track(slices).items():
            if not lane:
                continue
            if lane not in siblings:
                siblings[lane] = _sibling(pid, tid, lane, used, names, added)
            ev = events[i]
            ev["tid"] = siblings[lane]
            ev["args"] = {**(ev.get("args") or {}), OVERLAP_ARG: tid}
            moved_at[(pid, tid, ev["ts"])] = siblings[lane]
            counts["moved"] += 1
    for ev in events:  # a flow's end binds to the slice at its (pid, tid, ts): it follows a moved event
        if isinstance(ev, dict) and ev.get("ph") in ("s", "f", "t"):
            sib = moved_at.get((ev.get("pid"), ev.get("tid"), ev.get("ts")))
            if sib is not None:
                ev["tid"] = sib
    events.extend(added)
    left = violations(events)
    if left:
        raise NestingError(
            f"{left} complete events still cross others on their track after the repair: "
            "they are neither Python slices nor GPU events, so nothing here may move them"
        )
    return events, counts


def _sibling(pid, tid, lane, used, names, added):
    """A free tid for lane `lane` of stream track (pid, tid), with a thread_name event naming it for its stream."""
    step = SIBLING_TID_STEP if isinstance(tid, int) else f" (overlapping {lane})"
    sib = tid + lane * step if isinstance(tid, int) else f"{tid}{step}"
    while sib in used[pid]:
        sib += step
    used[pid].add(sib)
    own = names.get((pid, tid))
    own_name = (own.get("args") or {}).get("name") if own else None
    stream = own_name.strip() if isinstance(own_name, str) and own_name.strip() else f"stream {tid}"
    label = f"{stream} (overlapping)" if lane == 1 else f"{stream} (overlapping {lane})"
    meta = {"name": "thread_name", "ph": "M", "pid": pid, "tid": sib, "args": {"name": label}}
    if own and "ts" in own:
        meta["ts"] = own["ts"]
    added.append(meta)
    if isinstance(tid, int):  # beside its stream where the viewer sorts threads by this index
        added.append({**meta, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return sib


def crossing_slices(
    slices_by_thread: dict[tuple[Any, Any], tuple[Sequence[float], Sequence[float]]],
) -> dict[tuple[Any, Any], int]:
    """Per thread, slices that start inside another slice and end after it (they cross).

    slices_by_thread: {thread: (starts, ends)} as two parallel sequences.
    Perfetto before v57.1 dropped such slices on import; with_stack=True makes them common.
    """
    counts = {}
    for thread, (starts, ends) in slices_by_thread.items():
        n = _crossing(((starts[i], ends[i]) for i in by_start_then_longest(starts, ends)))
        if n:
            counts[thread] = n
    return counts


def _crossing(slices: Iterable[tuple[float, float]]) -> int:
    """How many of one thread's slices, given as (start, end) by start then the longest first, cross another."""
    stack, n = [], 0
    for s, e in slices:
        # 1 ns of slack both ways: exported timestamps are rounded to ns, and near 5e12 µs a double's
        # step is about 1 ns, so a slice that ends where the next starts may sum to just past it.
        while stack and stack[-1] <= s + 1e-3:
            stack.pop()
        if stack and e > stack[-1] + 1e-3:
            n += 1
        stack.append(e)  # a crossing slice can itself be crossed by a later one
    return n


class Crossing:
    """crossing_slices of CPU slices gathered one at a time: one record (thread, start, -end) each in
    spill.SortedRecords, sorted on disk when there are many. Equal slices of a thread are interchangeable."""

    def __init__(self):
        self.ids: dict[tuple[Any, Any], int] = {}
        self.records = SortedRecords("d", 3)

    def add(self, thread: tuple[Any, Any], start: float, end: float) -> None:
        n = self.ids.get(thread)
        if n is None:
            n = self.ids[thread] = len(self.ids)
        self.records.add((n, start, -end))

    def __bool__(self) -> bool:
        return bool(self.ids)

    def threads(self) -> list[tuple[Any, Any]]:
        """The (pid, tid) of every thread with a CPU slice, in the order first seen."""
        return list(self.ids)

    def counts(self) -> dict[tuple[Any, Any], int]:
        """{thread: slices that cross another}, threads in the order first seen, those with none left out. Read once."""
        found = {}
        for n, group in itertools.groupby(self.records, key=lambda r: r[0]):
            found[int(n)] = _crossing((s, -neg_e) for _, s, neg_e in group)
        return {thread: found[n] for thread, n in self.ids.items() if found.get(n)}


_INF = float("inf")
NOT_CPU = float("-inf")  # a Slices record's start where the event is no CPU slice


class Slices:
    """DropCount and Crossing at once, from one record per complete event, for the one-pass read (timeline.quick).

    Each event is one record (ts_ns, -end_ns, start, -end) of its track in spill.Runs (the runs a thread lists in
    order, on disk past a chunk): the integer ns of Perfetto's rule (from the first event's, where they pass 2**52),
    and the µs floats of the crossing check (start -inf: not a CPU slice). Read once per track, sorted by the first
    two, they give both figures where that order is exact for both: no two events share a track, start and end
    (they could be one event written twice, which fingerprints tell apart), and the CPU slices' floats come in
    their own order (start, then the longest first). Else finish() answers False, and the trace is read again
    the exact way (timeline.read). So it does where a track's records come in more than MAX_RUNS runs: in no
    order, they are for the exact read's sort."""

    MAX_RUNS = 256

    def __init__(self):
        self.ids: dict[tuple[Any, Any], int] = {}  # every track with a complete event, numbered as first seen
        self.cpu: dict[int, tuple[Any, Any]] = {}  # the tracks with a CPU slice, in the order first seen
        self.records = Runs("d", 4, max_runs=self.MAX_RUNS)
        self.drops: int  # both set by finish()
        self.crossing: dict[tuple[Any, Any], int]

    def finish(self) -> bool:
        """Count both figures (read once); False where the sorted records cannot give them exactly."""
        try:
            return self._count()
        finally:
            self.records.close()

    def _count(self) -> bool:
        drops, crossing = 0, {}
        if not self.records.finish():
            return False
        for track, n in self.ids.items():
            # the ends of the open slices (Perfetto's stack; the crossing check's): the top apart, the rest below it,
            # above a bottom that no slice closes or crosses
            top, below, cpu_top, cpu_below = _INF, [], _INF, []
            cpu_n = 0
            last = last_end = None
            last_s = last_e = -_INF
            for ts, neg_end, s, neg_e in self.records.sorted(n):  # ns (exact in a double), then µs
                if ts == last and neg_end == last_end:  # two events alike on one track: perhaps one written twice
                    return False
                last, last_end = ts, neg_end
                # Perfetto's rule (accepts): pop what has closed, drop a slice that ends past an open one. With no
                # two slices alike, the rule's one exception (two slices of no length at one time: the second is
                # looked for deeper) cannot arise, so only the top of the stack is ever read.
                end = -neg_end
                while top <= ts:
                    top = below.pop()
                if top < end:
                    drops += 1
                else:
                    below.append(top)
                    top = end
                if s == NOT_CPU:
                    continue
                if s < last_s or (s == last_s and neg_e < last_e):
                    return False  # the floats' order is not the ns order
                last_s, last_e = s, neg_e
                e = -neg_e  # _crossing, inline
                while cpu_top <= s + 1e-3:
                    cpu_top = cpu_below.pop()
                if e > cpu_top + 1e-3:
                    cpu_n += 1
                cpu_below.append(cpu_top)
                cpu_top = e
            if cpu_n:
                crossing[track] = cpu_n
        self.drops = drops
        self.crossing = {track: crossing[track] for track in self.cpu.values() if track in crossing}
        return True

    def count(self) -> int:
        """DropCount.count's answer (after finish)."""
        return self.drops

    def counts(self) -> dict[tuple[Any, Any], int]:
        """Crossing.counts' answer (after finish)."""
        return dict(self.crossing)

    def threads(self) -> list[tuple[Any, Any]]:
        """Crossing.threads' answer: the tracks with a CPU slice, in the order first seen."""
        return list(self.cpu.values())
