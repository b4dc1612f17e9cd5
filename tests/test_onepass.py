"""The one-pass read (timeline.quick) against the exact read it stands in for (timeline.extract, twice where
events were written twice): the same timeline on random traces, whatever their order, and no answer where it
cannot be sure of one. Also spill.Runs, the sort it stands on."""

import json
import os
import random

import pytest
from conftest import ROOT

from steplens.evidence import summarize
from steplens.trace import damage, nesting, reader, spill, timeline

CATS = ("python_function", "cpu_op", "user_annotation", "cuda_runtime")


def nested(rng, start, end, depth=0):
    """Slices that nest, as a call stack makes them: (start, end) pairs between start and end; some start where
    their parent or the slice before ends, some last no time."""
    out, t = [], start
    while len(out) < 10:
        a = t if rng.random() < 0.3 else t + rng.uniform(0, 3)
        if a >= end:
            break
        b = a if rng.random() < 0.05 else a + rng.uniform(0, min(40.0, end - a))
        out.append((a, b))
        if depth < 4 and b - a > 2:
            out += nested(rng, a, b, depth + 1)
        t = b if rng.random() < 0.3 else b + rng.uniform(0, 2)
    return out


def times(rng, value, kind):
    return {"ns": round(value, 3), "int": int(value), "any": value}[kind]


def random_trace(seed):
    """A step loop's events: two families of slices on the main thread (each nested in itself, crossing the
    other), a second thread, launches, kernels that overlap on one stream, [memory] events; listed family by
    family (as a profiler writes them), cut into pieces and some swapped; sometimes an event written twice."""
    rng = random.Random(seed)
    base = rng.choice([0.0, 1000.0, 5.4e12])
    kind = rng.choice(["ns", "ns", "int", "any"])
    families, corr = [], 0
    for fam, cat in enumerate(rng.sample(CATS, 3)):
        events = []
        for a, b in nested(rng, 0.0, 400.0):
            tid = 2 if rng.random() < 0.1 else 1
            ev = {"ph": "X", "cat": cat, "name": f"{cat}{rng.randrange(5)}", "pid": 1, "tid": tid}
            if cat == "cpu_op" and rng.random() < 0.1:
                ev["name"] = "aten::item"  # an operator that waits for the GPU (timeline.SYNC_OPS)
            elif rng.random() < 0.02:
                del ev["cat"]  # read as ""
            ev.update(ts=times(rng, base + a, kind), dur=times(rng, b - a, kind))
            if cat == "cuda_runtime":
                corr += 1
                ev["name"] = "cudaLaunchKernel"
                ev["args"] = {"correlation": corr}
            elif rng.random() < 0.7:
                ev["args"] = {"Ev Idx": rng.randrange(100)}
            events.append(ev)
        events.sort(key=lambda ev: (ev["ts"], -ev["dur"]))
        families.append(events)
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1,
              "ts": times(rng, base + 100.0 * k, kind), "dur": times(rng, 100.0, kind), "args": {}}
             for k in range(4)]  # fmt: skip
    gpu = []
    for k in range(rng.randrange(1, 30)):
        a = rng.uniform(0, 400)
        gpu.append({"ph": "X", "cat": rng.choice(["kernel", "kernel", "gpu_memcpy"]), "name": f"k{k % 3}", "pid": 0,
                    "tid": 7, "ts": times(rng, base + a, kind), "dur": times(rng, rng.uniform(0, 9), kind),
                    "args": {"stream": 7, "correlation": rng.randrange(1, corr + 2)}})  # fmt: skip
    memory = [{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
               "ts": times(rng, base + rng.uniform(0, 400), kind),
               "args": {"Bytes": 512, "Total Allocated": 512 * (k + 1), "Total Reserved": 4096, "Device Type": 1,
                        "Device Id": 0}} for k in range(rng.randrange(0, 20))]  # fmt: skip
    pieces = []
    for events in [*families, steps, gpu, memory]:
        cut = sorted(rng.sample(range(len(events) + 1), min(len(events) + 1, rng.randrange(1, 4))))
        pieces += [events[a:b] for a, b in zip([0, *cut], [*cut, len(events)]) if a < b]
    if rng.random() < 0.3:
        rng.shuffle(pieces)
    out = [ev for piece in pieces for ev in piece]
    for _ in range(rng.randrange(0, 3)):  # a few events out of place
        i, j = rng.randrange(len(out)), rng.randrange(len(out))
        out[i], out[j] = out[j], out[i]
    if rng.random() < 0.15:  # an event written twice
        out.append(dict(rng.choice([ev for ev in out if ev["ph"] == "X"])))
    return out


class Lists(reader.Events):
    """Events given as the reader gives them: in lists of a few events (the one-pass read writes its records a
    list at a time); with structs, each list as the reader's Events where they read as such (its JSON text
    decoded as the reader decodes a run), else as dicts. structs: by default, the form every test runs in (form)."""

    structs_by_default = True

    def __init__(self, events, size, structs=None):
        self.events, self.size = events, size
        self.structs = self.structs_by_default if structs is None else structs

    def lists(self, structs=False):
        for i in range(0, len(self.events), self.size):
            part = self.events[i : i + self.size]
            if structs and self.structs:
                try:
                    part = reader._EVENTS(json.dumps(part))
                except ValueError:  # NaN, a list for an event: as dicts, as the reader gives them
                    pass
            yield part


def timeline_of(t):
    """Everything a timeline holds that a figure reads, as plain values."""
    return {
        "steps": t.steps,
        "scopes": dict(t.scopes),
        "scope_ids": t.scope_ids,
        "loader": t.loader,
        "named": dict(t.named),
        "gpu": list(t.gpu),
        "gpu_names": [t.gpu.name(i) for i in range(len(t.gpu))],
        "runtime": list(t.runtime),
        "annotations": t.annotations,
        "comm": sorted(t.comm),
        "sync_calls": t.sync_calls,
        "sync_ops": list(t.sync_ops),
        "captures": t.captures,
        "cpu_span": t.cpu_span,
        "exported": t.exported,
        "drops": t.complete.count(),
        "crossing": t.threads.counts(),
        "threads": t.threads.threads(),
        "damage": t.damage.report(),
        "memory": {name: d.count for name, d in t.memory.devices.items()},
    }


@pytest.fixture(autouse=True, params=["dicts", "events"])
def form(request, monkeypatch):
    """Every test twice: the one-pass read given its events as dicts, then as the reader's Events (msgspec's
    structs: _OnePass._each_event), each held to the same answers."""
    monkeypatch.setattr(Lists, "structs_by_default", request.param == "events")


@pytest.fixture
def small_runs(monkeypatch):
    """Chunks of 16 records and blocks of 4: a few hundred events flush and merge many times. The trace's time
    is fixed by its first 11 complete events (not 1001), so that the far-from-the-trace check runs early."""
    monkeypatch.setattr(spill, "CHUNK", 16)
    monkeypatch.setattr(spill, "BUFFER", 4)
    monkeypatch.setattr(damage, "ANCHOR_EVENTS", 11)


def exact(events, tap=None):
    """The timeline as the exact read gives it (extract; twice where events were written twice); tap: given what
    the last pass keeps."""
    keys = spill.SortedRecords("q", 1)
    t = timeline.extract(list(events), keys=keys, tap=tap)
    twice = timeline.repeated(keys)
    if not twice:
        return t
    if tap is not None:
        tap.seen.clear()
    return timeline.extract(list(events), skip=damage.Skip(twice), tap=tap)


class Seen:
    """A tap: what it is given of each complete event (cat, name, pid, tid, args, start and duration), in order."""

    def __init__(self, cats=None):
        self.seen, self.cats = [], cats

    def __call__(self, *given):
        self.seen.append(given)


def test_the_one_pass_read_is_the_exact_read_on_random_traces(small_runs):
    """On 120 random traces, read as lists of 1 to 40 events, as dicts and as the reader's Events: wherever quick
    answers, its timeline is the exact read's, field by field, and so is what it gives a tap; where it does not
    (events written twice, times that do not sort alike in ns and µs), read() gives the exact read's. It answers on
    most (70 of 120 at least, as Events: whole-µs times make many slices alike)."""
    answered = 0
    for seed in range(120):
        events = random_trace(seed)
        cats = (None, ("cpu_op", "kernel"))[seed % 2]
        tapped = Seen(cats)
        want = timeline_of(exact(events, tapped))
        for structs in (False, True):
            tap = Seen(cats)
            got = timeline.quick(Lists(events, 1 + seed % 40, structs), tap)
            answered += got is not None and structs
            if got is not None:
                assert timeline_of(got) == want, (seed, structs)
                assert tap.seen == tapped.seen, (seed, structs)
        assert timeline_of(timeline.read(lambda: Lists(events, 7, True))) == want, seed
    assert answered >= 70, answered


def test_quick_gives_up_where_it_cannot_be_sure_and_read_counts_the_damage(monkeypatch):
    """No answer from quick on an event written twice, two events alike on a track, a NaN, a time far from the
    trace's, a non-object, "args": null, whether its events come as dicts or as the reader's Events; read() then
    counts what extract counts."""
    monkeypatch.setattr(damage, "ANCHOR_EVENTS", 3)  # the trace's time known early: later events read the fast way
    ok = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 2}", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0,
           "args": {}} for i in range(5)]  # fmt: skip
    assert timeline.quick(ok) is not None
    assert timeline.quick(Lists(ok, 3, True)) is not None
    alike = dict(ok[2], name="other")
    cases = {
        "written twice": ok + [dict(ok[1])],
        "alike": ok + [alike],
        "nan": ok + [dict(ok[1], ts=float("nan"))],
        "far": ok + [dict(ok[1], ts=1e13)],
        "far, within the fast way's times": ok + [dict(ok[1], ts=2 * damage.FAR_US)],
        "non-object": ok + [[1, 2]],
        "args null": ok + [dict(ok[1], args=None, ts=60.0)],
    }
    for name, events in cases.items():
        assert timeline.quick(events) is None, name
        assert timeline.quick(Lists(events, 3, True)) is None, name
        assert timeline_of(timeline.read(lambda: events)) == timeline_of(exact(events)), name
    assert timeline.read(lambda: cases["written twice"]).damage.counts == {"duplicate": 1}
    assert timeline.read(lambda: cases["alike"]).damage.counts == {}  # two events, both kept


def test_sound_events_of_odd_forms_read_as_the_exact_read_whatever_their_form(monkeypatch):
    """Events the one-pass read answers on, read as they come after the trace's time is known: a thread without
    pid, one without tid, an event without cat (a tap that asks for "" is given it), whole-µs times among float
    ones, a start and a duration half a ns past a whole one. quick's timeline, and what it gives a tap, are the
    exact read's (as dicts and as Events: the form fixture)."""
    monkeypatch.setattr(damage, "ANCHOR_EVENTS", 3)
    ok = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 2}", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0,
           "args": {}} for i in range(6)]  # fmt: skip
    no_pid, no_tid, no_cat = (dict(ok[1], ts=61.0), dict(ok[1], ts=62.0), dict(ok[1], ts=63.0))
    del no_pid["pid"], no_tid["tid"], no_cat["cat"]
    whole = dict(ok[0], ts=70, dur=2)
    halves = [dict(ok[1], ts=30.0005, dur=1.0), dict(ok[0], ts=80.0, dur=0.0005)]  # 30000.5 ns; 0.5 ns
    events = ok + [no_pid, no_tid, no_cat, whole, *halves]
    for cats in (None, ("",), ("cpu_op",)):
        tapped, tap = Seen(cats), Seen(cats)
        want = timeline_of(exact(events, tapped))
        got = timeline.quick(Lists(events, 4), tap)
        assert got is not None and timeline_of(got) == want, cats
        assert tap.seen == tapped.seen and (cats != ("",) or len(tap.seen) == 1), cats


def test_a_stored_trace_reads_the_same_whole_either_way(monkeypatch):
    """The evidence of a stored H100 trace, as summarize prints it (--json), is the same from the one-pass read
    and from the exact read (quick made to give up)."""
    path = os.path.join(ROOT, "results", "h100-delays", "input.pt.trace.json.gz")
    assert timeline.quick(reader.iter_events(path)) is not None, "the one-pass read must answer on it"
    fast = summarize.summarize_file(path)
    monkeypatch.setattr(timeline, "quick", lambda events, tap=None: None)
    assert json.dumps(summarize.summarize_file(path)) == json.dumps(fast)


def test_runs_give_every_record_back_sorted_from_few_runs_or_many(small_runs):
    """Records added in runs (a few long, then many short, then at random) come back per group exactly as
    sorted() gives them, through flushes and merges; the runs are counted as they are cut."""
    rng = random.Random(3)
    runs = spill.Runs("d", 3)
    groups = [runs.add() for _ in range(3)]
    added, since = [[], [], []], 0  # since: records added after the last flush
    for g, records in enumerate(groups):
        for piece in range(4 if g == 0 else 40):
            start = rng.uniform(0, 100)
            for k in range(rng.randrange(1, 30)):
                record = (start + k, -rng.uniform(0, 5), float(g))
                records.extend(record)
                added[g].append(record)
                since += 1
                assert runs.pending() == since
                if since >= runs.chunk:
                    assert runs.flush() and runs.pending() == 0
                    since = 0
    assert runs.file is not None and runs.runs(0) <= 4 < runs.runs(1)
    for g in range(3):
        assert list(runs.sorted(g)) == sorted(added[g]), g
    runs.close()


def test_runs_cut_where_first_numbers_tie_and_the_rest_decide(small_runs):
    """First numbers that tie (the rest then order the records), records written twice, -inf in the second
    column, and ties across a flush: every record comes back as sorted() gives them, and a track written in order
    stays one run however its records are flushed."""
    rng = random.Random(8)
    for case in range(40):
        runs = spill.Runs("d", 3)
        shuffled, in_order = runs.add(), runs.add()
        added = []
        for k in range(rng.randrange(1, 300)):
            record = (float(rng.randrange(5)), rng.choice([-float("inf"), -1.0, -2.0]), float(rng.randrange(2)))
            added.append(record)
            shuffled.extend(record)
            if rng.random() < 0.05:
                assert runs.flush()
        for record in sorted(added):
            in_order.extend(record)
            if rng.random() < 0.05:
                assert runs.flush()
        assert runs.flush()
        assert list(runs.sorted(0)) == sorted(added), case
        assert runs.runs(1) == 1, case
        assert list(runs.sorted(1)) == sorted(added), case
        runs.close()


def test_the_rare_event_is_read_as_the_exact_read_does(small_runs):
    """Lists that hold a rare event after the trace's time is fixed: a start half a ns
    past a whole one (llround rounds it up, round() would not), a slice that ends 1 ns after the slice it
    starts in (1 ns of slack: no crossing), "args": null, an event far from the trace's time. quick answers
    the exact read's timeline, or nothing."""
    ok = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 100.0 + 10 * i, "dur": 4.0, "args": {}}
          for i in range(20)]  # fmt: skip
    rare = {
        "half ns": [dict(ok[0], ts=399.0, dur=1.001), dict(ok[0], ts=400.0005, dur=2.0)],  # starts as the first ends
        "1 ns past": [dict(ok[0], ts=400.0, dur=5.0), dict(ok[0], ts=401.0, dur=4.001, cat="python_function")],
        "args null": [dict(ok[0], ts=400.0, args=None)],
        "far": [dict(ok[0], ts=400.0 + 2 * damage.FAR_US)],
    }
    answers = {}
    for name, extra in rare.items():
        events = ok + extra
        got = timeline.quick(Lists(events, 20))
        answers[name] = got is not None
        if got is not None:
            assert timeline_of(got) == timeline_of(exact(events)), name
    assert answers == {"half ns": True, "1 ns past": True, "args null": False, "far": False}, answers
    half = timeline.quick(Lists(ok + rare["half ns"], 20))
    assert half.complete.count() == 0 and timeline_of(half)["crossing"] == {}


def test_the_blocks_kept_do_not_grow_with_the_events(monkeypatch):
    """A trace of 2 steps and the same trace scaled to 6 (inside the test: 5,000 Python slices a step): what is
    still allocated once the timeline is read (tracemalloc, with the timeline alive) grows by under one block
    per 100 added events and under 2 bytes an event. Kept in memory, the records would add 32 bytes an event;
    kept as objects, a block or more. Small chunks (2,048 records) put both traces past them."""
    import tracemalloc

    monkeypatch.setattr(spill, "CHUNK", 2048)

    def trace(steps, slices=5000):
        events = []
        for n in range(steps):
            t0 = 1000.0 + n * (2.0 * slices + 110.0)
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                           "ts": t0, "dur": 2.0 * slices + 100.0, "args": {}})  # fmt: skip
            events += [{"ph": "X", "cat": "python_function", "name": f"f{i % 50}", "pid": 1, "tid": 1,
                        "ts": t0 + 3 + 2 * i, "dur": 1.5, "args": {}} for i in range(slices)]  # fmt: skip
        return events

    def kept(events):
        """(blocks, bytes) still allocated with the timeline alive."""
        tracemalloc.start()
        try:
            t = timeline.quick(Lists(events, 500))
            assert t is not None and len(t.steps) == len(events) // 5001
            blocks = sum(stat.count for stat in tracemalloc.take_snapshot().statistics("filename"))
            return blocks, tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    small, large = trace(2), trace(6)
    kept(small)  # the first read imports and caches what every later one shares
    (blocks_small, bytes_small), (blocks_large, bytes_large) = kept(small), kept(large)
    added = len(large) - len(small)
    assert (blocks_large - blocks_small) / added < 0.01, (blocks_small, blocks_large)
    assert (bytes_large - bytes_small) / added < 2, (bytes_small, bytes_large)


def test_ids_names_and_cats_of_any_json_type_neither_crash_nor_differ(small_runs):
    """A pid, tid, name or cat that is a list, an object, null, a float (1.0 equals the others' 1), a bool, an
    integer past 64 bits or a string, in lists of one event or of all: the one-pass read gives up or gives the
    exact read's timeline, and never fails on an unhashable value (as Events: the decode's types hold the loop's
    checks)."""
    ok = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 4.0, "args": {}}
          for i in range(20)]  # fmt: skip
    for field in ("pid", "tid", "name", "cat"):
        for value in ([1], {"a": 1}, None, 1.0, 1.5, True, 1 << 70, "1"):
            for events in (ok + [dict(ok[0], ts=300.0, **{field: value})], [dict(ok[0], **{field: value})] + ok[1:]):
                want = timeline_of(exact(events))
                for size in (1, 21):
                    got = timeline.quick(Lists(events, size))
                    assert got is None or timeline_of(got) == want, (field, value, size)
                assert timeline_of(timeline.read(lambda: events)) == want, (field, value)


def test_records_alike_but_for_their_floats_merge_and_end(small_runs):
    """Three events that start and end at the same ns on one track (one of them no CPU slice, so its floats
    sort before the others'), written in two runs: the merge of the runs ends (runs are cut on whole records),
    and quick gives up (two events alike), leaving the exact read's answer."""
    one = {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 500.0, "dur": 5.0}
    events = [one, dict(one, name="b"), dict(one, name="c", cat="Trace"), dict(one, name="w", ts=100.0)]
    events += [dict(one, name="v", ts=600.0)]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000.0 + i, "dur": 0.5}
               for i in range(16)]  # fmt: skip
    assert timeline.quick(events) is None
    assert timeline_of(timeline.read(lambda: events)) == timeline_of(exact(events))


def test_ends_past_2_53_ns_and_times_past_104_days_are_exact(small_runs):
    """Two slices whose ends, in ns, lie past 2**53 (not exact in a double): in lists of one event or of all, quick
    gives up or answers the exact read's drop count. A trace whose clock reads past 2**53 ns (a host up more
    than 104 days): quick answers, the exact read's timeline, counting ns from its first event."""
    ok = [{"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": 1100.0 + i, "dur": 0.5, "args": {}}
          for i in range(20)]  # fmt: skip
    a = dict(ok[0], name="a", ts=1000.0, dur=9007199254000.31)
    b = dict(ok[0], name="b", ts=1001.0, dur=9007199253999.312)
    for events in ([a, b] + ok, ok + [a, b]):
        got = timeline.quick(Lists(events, 20))
        assert got is None or got.complete.count() == exact(events).complete.count() == 1
    late = [dict(ev, ts=ev["ts"] + 1.2e13) for ev in ok]
    late += [dict(ok[0], ts=1.2e13 + 1105.0, dur=3.0), dict(ok[0], ts=1.2e13 + 1106.5, dur=3.0)]  # they cross
    for size in (1, 22):
        got = timeline.quick(Lists(late, size))
        assert got is not None and timeline_of(got) == timeline_of(exact(late))
        assert got.complete.count() == 1  # the second crosses the first and is dropped


def test_records_in_no_order_give_up_at_the_first_chunk(small_runs):
    """A thread listed latest first: every record its own run. quick gives up at the first flush that finds more
    than 256 runs on a track, having read a few hundred of the 2,000 events; read() answers the exact way."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": 10000.0 - 3 * i, "dur": 1.0,
               "args": {}} for i in range(2000)]  # fmt: skip
    seen = []

    class Counted(Lists):
        def lists(self, structs=False):
            for part in super().lists(structs):
                seen.append(len(part))
                yield part

    assert timeline.quick(Counted(events, 10)) is None
    assert sum(seen) < 400, sum(seen)
    assert timeline_of(timeline.read(lambda: events)) == timeline_of(exact(events))


def test_slices_on_a_small_grid_count_as_the_exact_read(small_runs):
    """Tracks of slices drawn from the (start, end) pairs of a grid of 0 to 5 µs, zero-length slices among them,
    so that slices start where others end and last no time there (Perfetto's rule treats two such slices apart):
    on 300 such tracks the one-pass read's drops and crossing slices are the exact read's."""
    rng = random.Random(11)
    pairs = [(a, b) for a in range(6) for b in range(a, 6)]
    for seed in range(300):
        picked = rng.sample(pairs, rng.randrange(2, 12))
        cats = ["cpu_op" if rng.random() < 0.8 else "kernel" for _ in picked]
        events = [{"ph": "X", "cat": cat, "name": f"s{i}", "pid": 1, "tid": 1, "ts": 100.0 + a, "dur": float(b - a),
                   "args": {}} for i, ((a, b), cat) in enumerate(zip(picked, cats))]  # fmt: skip
        rng.shuffle(events)
        got = timeline.quick(Lists(events, 4))
        want = exact(events)
        assert got is not None, seed
        assert (got.complete.count(), got.threads.counts()) == (want.complete.count(), want.threads.counts()), seed


def test_too_many_runs_in_the_last_records_give_up_too(small_runs, monkeypatch):
    """A track whose last records, not yet written when the read ends, come in more runs than allowed (3 here):
    quick gives up at the end, and read() answers the exact way."""
    monkeypatch.setattr(nesting.Slices, "MAX_RUNS", 3)
    ok = [{"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": 100.0 + 2 * i, "dur": 1.0, "args": {}}
          for i in range(30)]  # fmt: skip
    late = [dict(ok[0], ts=500.0 - 3 * i) for i in range(8)]  # latest first: 8 runs
    events = ok + late
    assert timeline.quick(Lists(events, 30)) is None
    assert timeline.quick(Lists(ok + late[:2], 30)) is not None  # 3 runs: answered
    assert timeline_of(timeline.read(lambda: events)) == timeline_of(exact(events))


def test_times_at_the_fast_ways_bounds_read_as_the_exact_read(small_runs):
    """The fast way reads a start in doubles below 2**52 ns (records counted from 0) or below 2**53 ns (counted
    from the first event's), a duration below 2**51 ns; any other goes the general way. Slices on one thread
    that straddle each bound, with times of four decimals (halves of a ns round away from zero), nested and
    crossing: quick answers, and its timeline is the exact read's."""
    rng = random.Random(3)
    for origin, first_ns in ((2**52 / 1000, 2**52 - 40_000), (2**53 / 1000, 2**53 - 40_000)):
        events = [{"ph": "X", "cat": "cpu_op", "name": "first", "pid": 1, "tid": 1, "ts": first_ns / 1000, "dur": 1.0}]
        for k in range(60):
            ts = round(origin + rng.uniform(-30, 30), 4)
            dur = round(rng.choice([rng.uniform(0, 9), 2**51 / 1000 + rng.uniform(-0.002, 0.002)]), 4)
            cat = rng.choice(["cpu_op", "python_function", "cuda_runtime"])
            events.append({"ph": "X", "cat": cat, "name": f"s{k}", "pid": 1, "tid": 1, "ts": ts, "dur": dur})
        events[1:] = sorted(events[1:], key=lambda ev: (ev["ts"], -ev["dur"]))
        for size in (1, 9, 61):
            got = timeline.quick(Lists(events, size))
            assert got is not None, (origin, size)
            assert timeline_of(got) == timeline_of(exact(events)), (origin, size)
        assert exact(events).complete.count() > 0  # some slices cross, and are dropped
    # halves of a ns (0.0625 µs: 62.5 ns, exact in a double) round up: a slice that starts where another ends
    # closes it; a slice that ends where its parent ends nests (rounded to even, both would be dropped)
    x = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1}
    slices = (("p", 0.0, 10.0), ("a", 1.0, 0.063), ("c", 1.0625, 1.0), ("e", 3.0, 1.0625), ("f", 3.5, 0.563))
    halves = [dict(x, name=name, ts=5000.0 + a, dur=d) for name, a, d in slices]
    got = timeline.quick(Lists(halves, 5))
    assert got is not None and got.complete.count() == exact(halves).complete.count() == 0


def test_names_found_printable_are_kept_up_to_a_bound(small_runs, monkeypatch):
    """Each name is looked at once and kept, up to NAME_CHARS_KEPT characters of them (memory does not grow
    with a trace of ever new names); past the bound, a name that is not printable still makes quick give up."""
    monkeypatch.setattr(timeline, "NAME_CHARS_KEPT", 10)  # n0..n4: 10 characters
    events = [{"ph": "X", "cat": "cpu_op", "name": f"n{k % 20}", "pid": 1, "tid": 1, "ts": 1000.0 + k, "dur": 0.5}
              for k in range(60)]  # fmt: skip
    one = timeline._OnePass(None)
    assert one.each(events) and len(one.names_read) == 5
    assert timeline_of(one.end()) == timeline_of(exact(events))
    assert timeline.quick(Lists(events + [dict(events[0], name="bell\a", ts=1061.0)], 7)) is None


def test_the_cycle_collector_is_paused_for_a_read_and_restored_however_it_ends():
    """read() pauses Python's cycle collector while it reads, and leaves it as it found it: on, after a read or a
    damaged file; off, where the caller had turned it off."""
    import gc

    seen = []

    def events():
        seen.append(gc.isenabled())
        return [{"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0}]

    def broken():
        raise reader.TraceError("cut short")

    assert gc.isenabled()
    timeline.read(events)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(reader.TraceError):
        timeline.read(broken)
    assert gc.isenabled()
    gc.disable()
    try:
        timeline.read(events)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_tap_is_given_the_complete_events_of_its_categories_alone_either_way(small_runs):
    """A tap that names its categories (cats) is given the complete events of those alone, in file order, by the
    one-pass read and by the exact read alike; a tap that names none is given every complete event."""
    events = random_trace(11)
    complete = [(ev["name"], ev["cat"]) for ev in events if ev.get("ph") == "X"]

    def taps():
        got = {"some": [], "all": []}

        def some(cat, name, pid, tid, args, s, dur):
            got["some"].append((name, cat))

        some.cats = ("cpu_op", "user_annotation")
        return got, some, lambda cat, name, *_: got["all"].append((name, cat))

    for read in (
        lambda tap: timeline.quick(Lists(events, 7), tap),
        lambda tap: timeline.extract(list(events), tap=tap),
    ):
        got, some, every = taps()
        assert read(some) is not None and read(every) is not None
        assert got["some"] == [(n, c) for n, c in complete if c in some.cats] != []
        assert got["all"] == complete


def test_records_are_written_only_once_they_pass_a_chunk_whatever_else_the_trace_holds():
    """Instant events count toward no chunk: 300 slices of one thread in falling order (300 runs, past
    MAX_RUNS) among 33,000 instant events are sorted in memory, and quick answers as the exact read does."""
    x = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1}
    events = [dict(x, name=f"f{k}", ts=1300.0 - k, dur=0.5) for k in range(300)]
    events += [{"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 1000.0, "s": "t"} for _ in range(33_000)]
    got = timeline.quick(Lists(events, 500))
    assert got is not None and timeline_of(got) == timeline_of(exact(events))


def test_a_cat_of_any_json_type_is_damage_the_exact_read_counts_not_a_crash():
    """A complete event whose cat is a list, in a trace the one-pass read gives up on (a NaN time): read() counts
    it as the exact read does, and does not stop on it."""
    x = {"ph": "X", "pid": 1, "tid": 1, "dur": 1.0}
    events = [dict(x, cat="cpu_op", name=f"f{k}", ts=1000.0 + 2 * k) for k in range(20)]
    events += [dict(x, cat=["cpu_op"], name="odd", ts=1050.0), dict(x, cat="cpu_op", name="nan", ts=float("nan"))]
    assert timeline.quick(Lists(events, 7)) is None
    t = timeline.read(lambda: Lists(events, 7))
    assert timeline_of(t) == timeline_of(exact(events)) and t.damage.report()


def test_a_stored_trace_comes_as_events_that_all_go_the_fast_way(monkeypatch):
    """The reader gives a stored H200 trace's runs as its Events (msgspec's structs, not dicts), and the one-pass
    read keeps them all the fast way (_each_event): it hands the dict path (_each) only the events read one by one
    at the document's head and tail. The same timeline from dicts alone."""
    path = os.path.join(ROOT, "results", "h200-reprofile", "eager", "runs", "5ad75ecce38942bb8a82409565c94b80",
                        "outputs", "traces", "trace-cycle1-steps2-4.pt.trace.json.gz")  # fmt: skip
    kinds = [type(part[0]) for part in reader.iter_events(path).lists(structs=True)]
    assert kinds.count(reader.Event) >= len(kinds) - 2, kinds  # the document's head and tail: read one by one
    handed, each = [], timeline._OnePass._each

    def counted(self, events):
        handed.append(len(events))
        return each(self, events)

    monkeypatch.setattr(timeline._OnePass, "_each", counted)
    fast = timeline.quick(reader.iter_events(path))
    events = sum(1 for _ in reader.iter_events(path))
    assert fast is not None and 0 < sum(handed) <= 2, handed
    monkeypatch.setattr(reader, "STRUCTS", False)
    handed.clear()
    assert timeline_of(timeline.quick(reader.iter_events(path))) == timeline_of(fast)
    assert sum(handed) == events
