"""A trace's timeline: the steps, scopes, GPU events and launch calls that the evidence is made of."""

import bisect
import gc
import math
import statistics
import struct
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from steplens.scopes import KNOWN
from steplens.trace import columns, damage, memory, nesting, soundness, spill
from steplens.trace.calls import (  # noqa: F401 (read as timeline.NAME by the evidence)
    BLOCKING_COPY_CALLS,
    CAPTURE_CAT,
    COPY_CALLS,
    CPU_SLICE_CATS,
    GPU_CATS,
    GRAPH_LAUNCH_CALLS,
    LAUNCH_CALLS,
    MEMSET_CALLS,
    STEP_SLACK_US,
    SYNC_CALLS,
    SYNC_OPS,
    WORK_CALLS,
)
from steplens.trace.intervals import total, union
from steplens.trace.reader import UNSET, Event, Events
from steplens.trace.reader import as_dict as _as_dict


class Trace:
    """What the figures need from a trace, as compact tuples.

    steps: (num, start, end); scopes: {scope: [[start, end], ...]}; scope_ids: {External id: (scope, start)};
    gpu: (kind, start, end, stream, correlation, bytes) with kind kernel, h2d, memcpy or memset, and runtime:
    (name, start, end, correlation), each kept as columns (steplens/trace/columns.py);
    annotations: (name, start, end, External id) on GPU tracks;
    threads: the CPU slices' threads and times, for the slices that cross (nesting.Crossing; the one-pass read:
    nesting.Slices);
    complete: every complete event's track and times, for Perfetto's nesting rule (nesting.DropCount, or Slices);
    both keep a record per event in spill.SortedRecords, on disk past a chunk, and are read once.
    memory: the profiler's [memory] events per device, as arrays (steplens/trace/memory.py).
    """

    def __init__(self):
        self.steps, self.scopes, self.scope_ids = [], defaultdict(list), {}
        self.loader, self.named = [], defaultdict(list)  # DataLoader annotations; every other user annotation
        names = columns.Names()  # one string object per distinct name, shared by the columns
        self.gpu, self.runtime = columns.GpuEvents(names), columns.RuntimeCalls(names)  # columns, read as tuples
        self.annotations = []
        self.gpu_names = columns.GpuNames(self.gpu)  # each GPU event's name (kernel classes, steplens/trace/kernels.py)
        self.comm = set()  # indices into gpu of the communication kernels (NCCL): GPU time, but no compute
        self.threads = nesting.Crossing()
        self.complete = nesting.DropCount()
        self.damage = damage.Damage()
        self.memory = memory.Memory()
        self.sync_calls = []  # (name, start, end, tid) of each call that blocks the host on the GPU (few a step)
        self.sync_ops = columns.SyncOps()  # (name, start, end, tid) of the operators that hand the host a GPU value
        self.captures = []  # the profiler's own span of each capture ("PyTorch Profiler (0)", cat Trace)
        self.cpu_span = None  # (first start, last end) of the CPU slices: also the window of a capture without steps
        self.exported = False  # the steps carry the profiler's own numbering: its export, which ends with its span


Tap = Callable[[Any, str, Any, Any, dict[str, Any], float, float], None]
# a tap is given each complete event kept as (cat, name, pid, tid, args, start, duration): cat "" where the event
# has none, pid and tid None where it has none, args {} where it has none (never to be changed)


def tap_cats(tap: Tap | None) -> tuple[Any, ...] | None:
    """The categories of the complete events a tap reads (its `cats`, a tuple: an event of any other is not given
    to it), or None: every category."""
    return getattr(tap, "cats", None)


def extract(
    events: Iterable[Any],
    skip: damage.Skip | None = None,
    keys: spill.SortedRecords | None = None,
    tap: Tap | None = None,
) -> Trace:
    """One pass over the events (a list or a stream), keeping only compact tuples; damage counted in t.damage.
    tap: given every complete event the reader keeps (readable, not a second copy; its fields, see Tap), for what
    else a caller keeps from the same pass (the roofline's operators)."""
    t = Trace()
    names = {}  # one string object per distinct name
    scopes = set(KNOWN)  # every phase's scopes (steplens/scopes.py); other annotations go to named
    complete, threads, first, last = t.complete, t.threads, None, None  # first, last: the CPU slices' span
    cats = tap_cats(tap)
    # the memory events are instant events, which damage.readable passes to memory's take
    for index, ev, s, dur in damage.readable(events, t.damage, skip, keys, t.memory.take):
        e = s + dur
        track = (ev.get("pid"), ev.get("tid"))
        complete.add_readable(track, ev)
        cat, name, args = ev.get("cat", ""), ev["name"], ev.get("args") or _NO_ARGS
        if tap is not None and (cats is None or cat in cats):
            tap(cat, name, track[0], track[1], args, s, dur)
        if cat in CPU_SLICE_CATS:
            threads.add(track, s, e)
            if first is None:
                first, last = s, e
            else:
                first, last = s if s < first else first, e if e > last else last
            if cat == "cpu_op" and name in SYNC_OPS:
                t.sync_ops.append(name, s, e, track[1])
            if cat == "python_function" or cat == "cpu_op":
                continue
        _keep(t, ev, cat, name, args, s, e, track[1], names, scopes)
    return _finish(t, first, last)


def _keep(t: Trace, ev: Any, cat: str, name: str, args: dict[str, Any], s: float, e: float, tid: Any,
          names: dict[str, str], scopes: set[str]) -> None:  # fmt: skip
    """What the figures keep of a complete event that is neither a Python function nor a CPU operator; ev (a dict
    or a reader.Event) is read only where it is damage."""
    if cat == "user_annotation":
        if name.startswith(damage.STEP_PREFIX):
            num = step_number(name)
            if num is None:
                t.damage.add("unreadable_step", _dict(ev), True)
            elif e <= s:
                t.damage.add("empty_step", _dict(ev), True)
            else:
                t.steps.append((num, s, e))
                t.exported = t.exported or PROFILER_ARG in args
        elif name in scopes:
            t.scopes[name].append([s, e])
            if args.get("External id") is not None:
                t.scope_ids[args["External id"]] = (name, s)
        elif name.startswith(LOADER_PREFIX):
            t.loader.append([s, e])
        else:
            t.named[names.setdefault(name, name)].append([s, e])
    elif cat in GPU_CATS:
        if cat == "kernel":
            kind = "kernel"
        elif cat == "gpu_memset":
            kind = "memset"
        else:
            kind = "h2d" if "HtoD" in name else "memcpy"
        stream = args.get("stream", args.get(nesting.OVERLAP_ARG))  # a sibling track's event: its own stream
        t.gpu.append(kind, s, e, stream, args.get("correlation"), _bytes(args.get("bytes")), name)
        if kind == "kernel" and "nccl" in name.lower():
            t.comm.add(len(t.gpu) - 1)
    elif cat in ("cuda_runtime", "cuda_driver"):
        t.runtime.append(name, s, e, args.get("correlation"))
        if name in SYNC_CALLS or name in BLOCKING_COPY_CALLS:
            t.sync_calls.append((name, s, e, tid))
    elif cat == "gpu_user_annotation":
        t.annotations.append((names.setdefault(name, name), s, e, args.get("External id")))
    elif cat == CAPTURE_CAT:
        t.captures.append((s, e))


def _dict(ev: Any) -> dict[str, Any]:
    """ev as a dict: itself, or the dict a reader.Event stands for."""
    return ev if isinstance(ev, dict) else _as_dict(ev)


def _finish(t: Trace, first: float | None, last: float | None) -> Trace:
    """The checks of a whole timeline, once its events are read."""
    t.cpu_span = (first, last) if first is not None else None
    t.steps.sort()
    soundness.check_steps(t)
    step_damage(t)
    coverage_damage(t)
    soundness.check(t)
    return t


_INF = float("inf")
_EXACT = float(1 << 53) / 1000.0  # below this, a whole number of µs times 1000 is exact in a double
_EXACT_NS = 1 << 53  # the records hold ns in doubles: exact up to here
_IDS = frozenset((int, str, type(None)))  # what a pid or tid may be
_NO_ARGS: dict[str, Any] = {}  # the args of an event without any (never changed)
_2_52 = float(1 << 52)  # a double at or past it is a whole number; r + 2**52 - 2**52 rounds r (below it) to one
NAME_CHARS_KEPT = 1 << 20  # characters of the names quick keeps as read (the bench trace's distinct ones: 33,000)
_FAST_DUR_US = float(1 << 51) / 1000.0  # a duration the fast way reads (26 days): its ns are at most 2**51
_NUMBERS = frozenset((int, float))
_RECORD = struct.Struct("=4d").pack  # a Slices record's bytes (spill.Runs: its array's typecode "d", width 4)


def quick(events: Iterable[Any], tap: Tap | None = None) -> Trace | None:
    """extract's Trace in one pass, or None where this pass cannot be sure of it: then read() reads the trace the
    exact way (extract, twice where events were written twice). It reads only the common event (an object; a
    complete event with a name, non-negative finite numbers, near the trace's time) and gives up at the first
    other; it sorts each complete event once for both nesting figures (nesting.Slices), which also tells where
    two events could be one written twice. Whatever it answers is what extract answers on the same events
    (extract fails on times past 2**63 ns, which quick reads).

    events: a list, any iterable, or the reader's Events (read as the lists of events it parses at once)."""
    lists = events.lists(structs=True) if isinstance(events, Events) else _batches(events)
    one = _OnePass(tap)
    try:
        for part in lists:
            if not one.each(part):
                one.t.memory.close()
                return None
        t = one.end()
        if t is None:
            one.t.memory.close()
        return t
    except BaseException:  # stopped (a damaged file, a full disk, Ctrl-C): the temp files are closed on the way out
        one.t.memory.close()
        raise
    finally:
        lists.close()
        one.found.records.close()


def _batches(events: Iterable[Any], size: int = 4096) -> Iterator[list[Any]]:
    """The events as lists of at most size."""
    it = iter(events)
    while part := list(islice(it, size)):
        yield part


class _OnePass:
    """quick's state, kept from one list of events to the next."""

    def __init__(self, tap: Tap | None):
        self.t = t = Trace()
        self.found = t.complete = t.threads = nesting.Slices()
        self.tap, self.names, self.scopes, self.cats = tap, {}, set(KNOWN), tap_cats(tap)
        self.first, self.last = _INF, -_INF  # the CPU slices' span
        self.anchor = self.base = None  # base: the ns the records count from
        self.early = []  # the first ANCHOR_EVENTS starts: their median is the trace's time (damage.readable)
        self.pending = 0  # events since the records were last written (an upper bound of the records)
        self.names_read: set[str] = set()  # names found printable (NAME_CHARS_KEPT characters of them at most)
        self.name_chars = 0
        # the last event's track: pid, tid, its records' frombytes, whether a CPU slice's, its number, (pid, tid)
        self.track: tuple[Any, ...] = (None,) * 6

    def printable(self, name: str) -> bool:
        """Whether the name is printable (a name that is not is damage: for the exact read); kept where it is."""
        if not name.isprintable():
            return False
        if self.name_chars + len(name) <= NAME_CHARS_KEPT:
            self.names_read.add(name)
            self.name_chars += len(name)
        return True

    def each(self, events: list[Any]) -> bool:
        """Keep the events one by one; False at the first one quick does not read."""
        if events and type(events[0]) is Event:
            return self._each_event(events) and self.written(len(events))
        return self._each(events) and self.written(len(events))

    def _each_event(self, events: list[Any]) -> bool:
        """each() over a list of reader.Event, the reader's lighter form of an event (a field is read faster than a
        dict's key, and the object freed faster): _each's loop, field for key (an unset pid, tid or cat read as
        _each reads a missing key), no dict made (a tap is given the fields; _keep reads the event itself only
        where it is damage). tests/test_onepass.py holds the two loops to the exact read, on the same random traces."""
        t, found, tap, names, scopes, cats = self.t, self.found, self.tap, self.names, self.scopes, self.cats
        cpu, add_memory = found.cpu, t.memory.add
        first, last, anchor, far, printable = self.first, self.last, self.anchor, damage.FAR_US, self.names_read
        lim, off = _fast_limit(self.base)
        last_pid, last_tid, add_record, on_cpu, n, track = self.track
        pack, two52, fast_dur, keep = _RECORD, _2_52, _FAST_DUR_US, _keep
        cpu_cats, sync_ops, not_cpu, memory_event, unset = (
            CPU_SLICE_CATS,
            SYNC_OPS,
            nesting.NOT_CPU,
            memory.MEMORY_EVENT,
            UNSET,
        )
        for ev in events:
            ph = ev.ph
            if ph != "X":
                if ph == "i" and ev.name == memory_event:
                    add_memory(ev.args, ev.ts)  # (unset: no dict, no number, as None)
                continue
            ts, dur = ev.ts, ev.dur
            if type(ts) is float and type(dur) is float and 0.0 <= ts < lim and 0.0 <= dur < fast_dur:
                s, r, q = ts, ts * 1000.0, dur * 1000.0  # as in _each
                tn, dn = (r if r >= two52 else r + two52 - two52), q + two52 - two52
                if r - tn == 0.5 or q - dn == 0.5:
                    tn, dn = _llround(r), _llround(q)
                tn -= off
            elif (times := self.times(ts, dur)) is not None:  # (unset: no number, as a missing key)
                s, tn, dur, dn, lim, off = times
            else:
                return False
            # the decode checked these types (reader.Event): a name is a str, a pid and tid an int, a str or None,
            # args a dict; each may be unset ("args": null, damage, is no Event: its run comes as dicts)
            name, pid, tid, args = ev.name, ev.pid, ev.tid, ev.args
            if name is unset:
                return False
            if pid is unset or tid is unset:
                pid, tid = (None if pid is unset else pid), (None if tid is unset else tid)  # (as _each reads them)
            if name not in printable and not self.printable(name):
                return False
            if anchor is None:
                known, anchor = self.early_start(s)
                if not known:
                    return False
            elif s - anchor > far or anchor - s > far:
                return False
            e = s + dur
            if tid != last_tid or pid != last_pid or add_record is None:
                add_record, on_cpu, n, track = self.switch(pid, tid)
                last_pid, last_tid = pid, tid
            cat = ev.cat
            if tap is not None and (cats is None or cat in cats or cat is unset and "" in cats):
                tap("" if cat is unset else cat, name, pid, tid, args or _NO_ARGS, s, dur)
            if cat == "python_function" or cat in cpu_cats:
                add_record(pack(tn, -(tn + dn), s, -e))
                if not on_cpu:
                    cpu[n], on_cpu = track, True
                if s < first:
                    first = s
                if e > last:
                    last = e
                if cat != "python_function":
                    if cat == "cpu_op":
                        if name in sync_ops:
                            t.sync_ops.append(name, s, e, tid)
                    else:
                        keep(t, ev, cat, name, args or _NO_ARGS, s, e, tid, names, scopes)
            else:  # (an unset cat: "", as _each reads it)
                add_record(pack(tn, -(tn + dn), not_cpu, 0.0))
                keep(t, ev, "" if cat is unset else cat, name, args or _NO_ARGS, s, e, tid, names, scopes)
        self.first, self.last, self.anchor = first, last, anchor
        self.track = (last_pid, last_tid, add_record, on_cpu, n, track)
        return True

    def _each(self, events: list[Any]) -> bool:
        """each() over dicts (or anything else the file holds): False at the first event quick does not read."""
        t, found, tap, names, scopes, cats = self.t, self.found, self.tap, self.names, self.scopes, self.cats
        cpu, add_memory = found.cpu, t.memory.add
        first, last, anchor, far = self.first, self.last, self.anchor, damage.FAR_US
        printable = self.names_read
        lim, off = _fast_limit(self.base)  # the fast way's bound on a start, and the records' base as a double
        last_pid, last_tid, add_record, on_cpu, n, track = self.track  # the last event's track, kept from list to list
        # the module's names as locals, read for every event: a local costs less to read
        pack, two52, fast_dur, id_types, keep = _RECORD, _2_52, _FAST_DUR_US, _IDS, _keep
        cpu_cats, sync_ops, not_cpu, memory_event = CPU_SLICE_CATS, SYNC_OPS, nesting.NOT_CPU, memory.MEMORY_EVENT
        for ev in events:
            if type(ev) is not dict:
                return False
            ph = ev.get("ph")
            if ph != "X":
                if ph == "i" and ev.get("name") == memory_event:  # memory.take, inline
                    add_memory(ev.get("args"), ev.get("ts"))
                continue
            try:
                ts, dur, name = ev["ts"], ev["dur"], ev["name"]
            except KeyError:  # a complete event without a time or a name: for the exact read
                return False
            pid, tid = ev.get("pid"), ev.get("tid")
            if type(ts) is float and type(dur) is float and 0.0 <= ts < lim and 0.0 <= dur < fast_dur:
                s, r, q = ts, ts * 1000.0, dur * 1000.0  # nesting._float_ns, inline, in doubles (_fast_limit)
                tn, dn = (r if r >= two52 else r + two52 - two52), q + two52 - two52  # the nearest whole ns, or
                if r - tn == 0.5 or q - dn == 0.5:  # the even one of two: llround takes the larger
                    tn, dn = _llround(r), _llround(q)
                tn -= off
            elif (times := self.times(ts, dur)) is not None:
                s, tn, dur, dn, lim, off = times
            else:
                return False
            args = ev.get("args")
            if type(args) is not dict and (args is not None or "args" in ev):  # "args": null is damage
                return False  # (no args are read as none: _keep gets _NO_ARGS)
            if not (type(name) is str and type(pid) in id_types and type(tid) in id_types):
                return False
            if name not in printable and not self.printable(name):
                return False
            if anchor is None:
                known, anchor = self.early_start(s)
                if not known:
                    return False
            elif s - anchor > far or anchor - s > far:
                return False
            e = s + dur
            if tid != last_tid or pid != last_pid or add_record is None:
                add_record, on_cpu, n, track = self.switch(pid, tid)
                last_pid, last_tid = pid, tid
            cat = ev.get("cat", "")
            if tap is not None and (cats is None or cat in cats):
                tap(cat, name, pid, tid, args or _NO_ARGS, s, dur)
            if cat == "python_function" or cat in cpu_cats:  # (a tuple: a damaged cat may be unhashable)
                add_record(pack(tn, -(tn + dn), s, -e))
                if not on_cpu:
                    cpu[n], on_cpu = track, True
                if s < first:
                    first = s
                if e > last:
                    last = e
                if cat != "python_function":
                    if cat == "cpu_op":
                        if name in sync_ops:
                            t.sync_ops.append(name, s, e, tid)
                    else:
                        keep(t, ev, cat, name, args or _NO_ARGS, s, e, tid, names, scopes)
            else:
                add_record(pack(tn, -(tn + dn), not_cpu, 0.0))
                keep(t, ev, cat, name, args or _NO_ARGS, s, e, tid, names, scopes)
        self.first, self.last, self.anchor = first, last, anchor
        self.track = (last_pid, last_tid, add_record, on_cpu, n, track)
        return True

    def early_start(self, s: float) -> tuple[bool, float | None]:
        """One of the first ANCHOR_EVENTS starts, kept: (False, None) where they are all in and one lies far from
        their median, else (True, the trace's time once they are all in, None before)."""
        self.early.append(s)
        if len(self.early) < damage.ANCHOR_EVENTS:
            return True, None
        anchor = _anchor(self.early)
        return anchor is not None, anchor

    def switch(self, pid: Any, tid: Any) -> tuple[Callable[[bytes], None], bool, int, tuple[Any, Any]]:
        """The track (pid, tid) that events now come from (numbered where new): its records' frombytes, whether it
        has a CPU slice yet, its number, and (pid, tid)."""
        ids, records = self.found.ids, self.found.records
        n = ids.get(track := (pid, tid))
        if n is None:
            n = ids[track] = len(ids)
            records.add()
        return records.new[n].frombytes, n in self.found.cpu, n, track

    def written(self, events: int) -> bool:
        """After each list: the records are written once they pass a chunk (a chunk and a list at most are held;
        pending, the events since, bounds them, and they are counted only when it passes the chunk); False where
        a track's records came in too many runs (for the exact read)."""
        records = self.found.records
        self.pending += events
        if self.pending < records.chunk:
            return True
        self.pending = records.pending()
        if self.pending < records.chunk:
            return True
        self.pending = 0
        return records.flush()

    def times(self, ts: Any, dur: Any) -> tuple[float, int, float, int, float, float] | None:
        """(start, start ns less the base, duration, duration ns, and _fast_limit's two once the base is known) of a
        time the fast way does not read (an int, a large or the first one), or None where quick cannot read it: a
        NaN, an infinity, a negative number, a string, a bool, or ns not exact in a double."""
        if not (type(ts) in _NUMBERS and type(dur) in _NUMBERS and 0 <= ts < _INF and 0 <= dur < _INF):
            return None
        tn, dn = nesting.to_ns(ts), nesting.to_ns(dur)
        if self.base is None:  # where the first event's ns pass 2**52, the records count from them
            self.base = tn if tn >= _EXACT_NS // 2 else 0
        tn -= self.base
        if tn + dn >= _EXACT_NS or tn <= -_EXACT_NS:
            return None
        return float(ts), tn, float(dur), dn, *_fast_limit(self.base)

    def end(self) -> Trace | None:
        if self.anchor is None and self.early and _anchor(self.early) is None:
            return None
        cpu = self.first < _INF
        _finish(self.t, self.first if cpu else None, self.last if cpu else None)
        if not self.found.finish():
            return None
        return self.t


def _llround(r: float) -> float:
    """The whole number nearest r (0 <= r < 2**52), halves away from zero, as a double."""
    f = r % 1.0
    return r - f + (f >= 0.5)


def _fast_limit(base: int | None) -> tuple[float, float]:
    """The starts (µs) _OnePass.each reads the fast way, in doubles, and the base as a double. Its ns are exact
    (under 2**53), less the base they are at most 2**52, so that with a duration's (at most 2**51) they stay
    exact. Until the base is known (the first event), and past 2**53, none."""
    if base is None or base >= _EXACT_NS:
        return -1.0, 0.0
    return (_EXACT if base else float(1 << 52) / 1000.0), float(base)


def _anchor(starts: list[float]) -> float | None:
    """The trace's time (the median of its first starts), or None where one of them lies far from it."""
    mid = statistics.median(starts)
    return None if any(abs(s - mid) > damage.FAR_US for s in starts) else mid


def step_number(name: str) -> int | None:
    """N of a step's name, exactly ProfilerStep#N with N in ASCII digits (as the profiler writes it), else None."""
    num = name[len(damage.STEP_PREFIX) + 1 :]
    if not name.startswith(damage.STEP_PREFIX + "#") or not (num.isascii() and num.isdigit()):
        return None
    return int(num)


def read(open_events: Callable[[], Iterable[Any]], tap: Callable[[], Tap] | None = None) -> Trace:
    """The timeline of a trace that can be read again: one pass (quick) where it is sure of it, else the exact
    read (extract), whose second pass removes events written twice.
    tap: called at the start of each pass, it returns the Tap that pass gives its kept events to (see extract):
    a later pass starts afresh.
    Python's cycle collector is paused meanwhile (and restored as it was, however the read ends): the parsed
    events hold no cycles and are freed as they go, and its passes over them cost about 3% of the read."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return _read(open_events, tap)
    finally:
        if was_on:
            gc.enable()


def _read(open_events: Callable[[], Iterable[Any]], tap: Callable[[], Tap] | None) -> Trace:
    t = quick(open_events(), tap() if tap else None)
    if t is not None:
        return t
    keys = spill.SortedRecords("q", 1)  # each event's fingerprint: sorted on disk past a chunk
    t = extract(open_events(), keys=keys, tap=tap() if tap else None)
    twice = repeated(keys)
    if twice:
        t = extract(open_events(), skip=damage.Skip(twice), tap=tap() if tap else None)
    return t


def repeated(keys: spill.SortedRecords) -> array:
    """damage.repeated of the keys, read once where none repeats (as in a sound trace): each sorted block is
    looked at whole in C first (a set as long as the block, its first key not its predecessor's last)."""
    last = None
    for block in keys.blocks(keep=True):
        if block[0] == last or len(set(block)) < len(block):
            return damage.repeated(keys)  # read again, key by key
        last = block[-1]
    keys.close()
    return array("q")


def step_damage(t: Trace) -> None:
    """Steps the profiler never writes: one number on two slices, or a step that starts before the last ends."""
    numbers = [num for num, _, _ in t.steps]
    for i, (num, s, e) in enumerate(t.steps):
        if i and numbers[i - 1] == num:
            t.damage.add("repeated_step", {"name": f"ProfilerStep#{num}", "ts": s, "dur": e - s}, True)
    by_start = sorted((s, e, num) for num, s, e in t.steps)
    for (s0, e0, n0), (s1, _, n1) in zip(by_start, by_start[1:]):
        if e0 > s1 + STEP_SLACK_US and n0 != n1:
            t.damage.add("overlapping_steps", {"name": f"ProfilerStep#{n0}", "ts": s0, "dur": e0 - s0}, True)


def coverage_damage(t: Trace) -> None:
    """What a sound capture holds, checked: steps and GPU events inside the capture, launch calls up to its end,
    and steps whose launch calls number alike (docs/DAMAGE.md)."""
    spans = sorted(t.captures)
    if t.exported and t.steps and not spans:
        num, s, e = max(t.steps, key=lambda step: step[2])
        t.damage.add("capture_missing", {"name": f"ProfilerStep#{num}", "ts": s, "dur": e - s}, True)
    inside = lambda s, e: any(a - STEP_SLACK_US <= s and e <= b + STEP_SLACK_US for a, b in spans)
    for num, s, e in t.steps if spans else ():
        if not inside(s, e):
            t.damage.add("step_past_capture", {"name": f"ProfilerStep#{num}", "ts": s, "dur": e - s}, True)
    # a GPU event outside every capture (Kineto drops those), or, without the profiler's span, longer than the CPU's
    cpu_len = (t.cpu_span[1] - t.cpu_span[0]) if t.cpu_span else 0.0
    for i, (s, e) in enumerate(zip(t.gpu.start, t.gpu.end)):
        if (spans and not inside(s, e)) or (not spans and t.cpu_span and e - s > cpu_len):
            ev = {"name": t.gpu.name(i), "ts": s, "dur": e - s, "cat": t.gpu[i][0]}
            t.damage.add("gpu_outside_capture", ev, True)
    if not t.steps or not len(t.runtime):
        return
    # the launch calls of a sound capture run to its last step's end (the profiler's stop synchronizes after it)
    walls = sorted(e - s for _, s, e in t.steps)
    wall = walls[len(walls) // 2]
    last_call = max(t.runtime.end)
    num, s, e = max(t.steps, key=lambda step: step[2])
    # (torch.profiler's own export only: a loop traced another way need not end on a call)
    if t.exported and e - last_call > CUT_SHARE * wall:
        ev = {"name": f"ProfilerStep#{num}", "ts": s, "dur": e - s, "last_launch_call_end": last_call}
        t.damage.add("capture_cut", ev, True)
    # steps of one capture run the same code: their launch calls number alike
    steps = sorted(t.steps, key=lambda step: step[1])
    starts = [s for _, s, _ in steps]
    calls = [0] * len(steps)
    for name, s, _, _ in t.runtime:
        if name not in LAUNCH_CALLS:
            continue
        k = bisect.bisect_right(starts, s) - 1
        if k >= 0 and s < steps[k][2]:
            calls[k] += 1
    for k, (num, s, e) in enumerate(steps):
        most = max(calls[:k] + calls[k + 1 :], default=0)
        if most >= THIN_MIN_CALLS and calls[k] < THIN_SHARE * most:
            ev = {"name": f"ProfilerStep#{num}", "ts": s, "dur": e - s, "launch_calls": calls[k], "sibling": most}
            t.damage.add("thin_step", ev, False)  # gradient accumulation, a validation step: sound loops do this


PROFILER_ARG = "Ev Idx"  # torch.profiler's number of each CPU event, on every step it exports
CUT_SHARE = 0.25  # launch calls that stop this share of a median step before the last step ends: the end was lost
THIN_SHARE = 0.5  # a step with under this share of its busiest sibling's kernel launches lost some, or did other work
THIN_MIN_CALLS = 20  # ...where that sibling has this many: a few calls more or less are no pattern


def _bytes(value: Any) -> float:
    """A copy's bytes, 0 where the field is absent or not a finite number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return 0


def bucket(events: list[tuple]) -> dict[str, Any]:
    """A line's worth about GPU events charged to no step (launched before the trace, or between steps)."""
    if not events:
        return {"events": 0, "kernels": 0, "gpu_work_us": 0.0, "first_us": None, "last_us": None}
    return {
        "events": len(events),
        "kernels": sum(ev[0] == "kernel" for ev in events),
        "gpu_work_us": total(union([[s, e] for _, s, e, _, _, _ in events])),
        "first_us": min(ev[1] for ev in events),
        "last_us": max(ev[2] for ev in events),
    }


LOADER_PREFIX = "enumerate(DataLoader)#"  # the DataLoader's own annotation of each __next__, in every trace
