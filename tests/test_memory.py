"""The memory a trace records (steplens/trace/memory.py): per step and scope, from the profiler's [memory] events."""

import csv
import glob
import io
import json
import os
from array import array

from conftest import load_offline_run
from test_compare import rec
from test_summarize import reprofile, run_json, scope, step, write

from steplens.evidence import formatting, summarize
from steplens.job import device
from steplens.project import compare, comparison
from steplens.scopes import FORWARD_BACKWARD, NEXT_BATCH, OPTIMIZER, SCOPES, TO_DEVICE
from steplens.trace import memory

MB = 1_000_000


def mem(ts, nbytes, allocated, reserved, device_type=1, device_id=0):
    """One [memory] event as the profiler writes it: the allocator's totals after the allocation (or free)."""
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "args": {
            "Total Reserved": reserved,
            "Total Allocated": allocated,
            "Bytes": nbytes,
            "Device Id": device_id,
            "Device Type": device_type,
            "Addr": 1000 + ts,
        },
    }


def allocations(events):
    """Running totals for a list of (ts, bytes) on the GPU, from 100 MB held and 200 MB reserved; the reservation
    grows by 100 MB whenever allocated would pass it."""
    out, allocated, reserved = [], 100 * MB, 200 * MB
    for ts, nbytes in events:
        allocated += nbytes
        while allocated > reserved:
            reserved += 100 * MB
        out.append(mem(ts, nbytes, allocated, reserved))
    return out


def made_trace():
    """Two steps of 100 us, each with the four scopes; known allocations in each scope (MB):
    step 1: next_batch +1; to_device +2; forward_backward +50 +30 -30 -40 (peak 100+3+80=183); optimizer +5 -5
    step 2: next_batch -1 (the batch of step 1 freed) +1; to_device -2 +2; forward_backward +120 -120;
    optimizer +10 -10."""
    steps = [step(1, 0, 100), step(2, 100, 100)]
    for base in (0, 100):
        steps += [
            scope(NEXT_BATCH, base + 1, 9),
            scope(TO_DEVICE, base + 11, 9),
            scope(FORWARD_BACKWARD, base + 21, 50),
            scope(OPTIMIZER, base + 71, 20),
        ]
    made = [
        (2, 1 * MB),
        (12, 2 * MB),
        (22, 50 * MB),
        (30, 30 * MB),
        (40, -30 * MB),
        (60, -40 * MB),
        (72, 5 * MB),
        (80, -5 * MB),
        (102, -1 * MB),
        (103, 1 * MB),
        (112, -2 * MB),
        (113, 2 * MB),
        (122, 120 * MB),
        (160, -120 * MB),
        (172, 10 * MB),
        (180, -10 * MB),
    ]
    return steps + allocations(made)


def test_made_trace_gives_the_known_sums_per_step_and_scope():
    """Start, peak and end of each step, and each scope's change and peak, equal the sums of the made allocations."""
    ev = summarize.summarize_events(made_trace())
    m = ev["memory"]
    assert m["null_reason"] is None and m["events"] == 16 and list(m["devices"]) == ["cuda:0"]
    dev = m["devices"]["cuda:0"]
    s1, s2 = dev["steps"]
    assert (s1["allocated_start"], s1["allocated_peak"], s1["allocated_end"]) == (100 * MB, 183 * MB, 113 * MB)
    assert (s2["allocated_start"], s2["allocated_peak"], s2["allocated_end"]) == (113 * MB, 233 * MB, 113 * MB)
    # the reservation (200 MB) grows once: at step 2's 233 MB, to 300 MB
    assert (s1["reserved_start"], s1["reserved_peak"], s1["reserved_end"]) == (200 * MB, 200 * MB, 200 * MB)
    assert (s2["reserved_start"], s2["reserved_peak"], s2["reserved_end"]) == (200 * MB, 300 * MB, 300 * MB)
    change = lambda s: {sc: s["scopes"][sc]["allocated_change"] // MB for sc in SCOPES}
    peak = lambda s: {sc: s["scopes"][sc]["allocated_peak"] // MB for sc in SCOPES}
    assert change(s1) == {NEXT_BATCH: 1, TO_DEVICE: 2, FORWARD_BACKWARD: 10, OPTIMIZER: 0}
    assert peak(s1) == {NEXT_BATCH: 101, TO_DEVICE: 103, FORWARD_BACKWARD: 183, OPTIMIZER: 118}
    assert change(s2) == {NEXT_BATCH: 0, TO_DEVICE: 0, FORWARD_BACKWARD: 0, OPTIMIZER: 0}
    assert peak(s2) == {NEXT_BATCH: 113, TO_DEVICE: 113, FORWARD_BACKWARD: 233, OPTIMIZER: 123}
    assert s2["scopes"][FORWARD_BACKWARD]["reserved_change"] == 100 * MB
    assert dev["window"]["allocated_peak"] == 233 * MB and dev["window"]["reserved_peak"] == 300 * MB
    assert dev["outside_steps"] == 0 and dev["running_total_breaks"] == 0


def test_memory_events_are_read_in_time_order_whatever_the_file_order():
    """The profiler writes some threads' memory events out of time order: the figures do not depend on it."""
    events = made_trace()
    shuffled = events[:8] + list(reversed(events[8:]))
    assert summarize.summarize_events(shuffled)["memory"] == summarize.summarize_events(events)["memory"]


def test_a_memory_record_is_packed_in_one_call_as_an_array_holds_it():
    """add() packs each record in one call: its bytes are those of the record (the time's sort key, the place in
    the file, bytes, allocated, reserved) as an array would hold them, for -0.0, 0.0, the smallest double,
    negative and huge times and the 64-bit edges; the records come back sorted by time."""
    m = memory.Memory()
    cases = [(5.0, 5, 100), (0.0, 1, 1), (-0.0, 2, 2), (-3.5, -7, 0), (5e-324, 3, 3), (1e300, 4, 4)]
    cases += [(2.5, (1 << 63) - 1, 0), (3.0, 1, -(1 << 63)), (-2.0, (1 << 63) - 1, -(1 << 63))]
    for i, (ts, nbytes, allocated) in enumerate(cases):
        want = array("q", (memory._time_key(ts), i, nbytes, allocated, 1 << 40)).tobytes()
        assert memory._packed(ts, i, nbytes, allocated, 1 << 40) == want, ts
        ev = mem(ts, nbytes, allocated, 1 << 40)
        m.add(ev["args"], ev["ts"])
    want = sorted((memory._time_key(ts), i, b, a, 1 << 40) for i, (ts, b, a) in enumerate(cases))
    read = list(m.devices["cuda:0"].records.read(keep=True))
    assert read == want and m.unreadable == 0
    assert [memory._time(k) for k, *_ in read][:4] == [-3.5, -2.0, 0.0, 0.0]


def test_a_memory_total_past_64_bits_is_counted_unreadable_not_a_crash():
    """Numbers that no 64-bit record holds (a byte count past 2**63, a total below -2**63 or a float past 2**63,
    an int time past a double's range), read the common way (a float time, int totals) or the general one, are
    counted as unreadable events: the read goes on, and the events around them keep their figures."""
    events = made_trace()
    bad = [mem(50.0, 1 << 63, 999 * MB, 999 * MB), mem(51.0, MB, -(1 << 63) - 1, 999 * MB), mem(52.0, MB, 1e300, MB)]
    bad += [mem(53, 1 << 64, MB, MB), mem(54, MB, MB, MB)]
    bad[-1]["ts"] = 10**400
    assert not memory._number(10**400) and memory._packed(1.0, 0, 1 << 63, 0, 0) is None
    ev = summarize.summarize_events(events + bad)  # after the device is known: the common way reads the first two
    assert ev["memory"]["unreadable_events"] == 5
    assert ev["memory"]["devices"] == summarize.summarize_events(events)["memory"]["devices"]


def test_memory_events_written_twice_count_once():
    """A trace written twice: every memory event repeated is read once, and the figures stay those of one copy."""
    events = made_trace()
    mems = [e for e in events if e["ph"] == "i"]
    read = summarize.summarize_events(events + mems)
    twice, once = read["memory"], summarize.summarize_events(events)["memory"]
    assert [(d["kind"], d["count"]) for d in read["damage"]] == [("duplicate_memory", len(mems))]
    assert twice == once and read["damage_withheld"] is None


def test_cpu_memory_has_no_reserved_figures_and_says_why():
    """The CPU's events report 0 reserved: the reserved figures are null with a reason, allocated ones stay."""
    events = [step(1, 0, 100), scope(FORWARD_BACKWARD, 10, 50)]
    events += [mem(20, 8, 8, 0, device_type=0, device_id=-1), mem(30, 16, 24, 0, 0, -1), mem(40, -8, 16, 0, 0, -1)]
    dev = summarize.summarize_events(events)["memory"]["devices"]["cpu"]
    s = dev["steps"][0]
    assert (s["allocated_start"], s["allocated_peak"], s["allocated_end"]) == (0, 24, 16)
    assert s["reserved_peak"] is None and dev["window"]["reserved_peak"] is None
    assert dev["reserved_null_reason"] == memory.CPU_RESERVED
    assert s["scopes"][FORWARD_BACKWARD] == {
        "allocated_change": 16,
        "allocated_peak": 24,
        "reserved_change": None,
        "reserved_peak": None,
        "events": 3,
    }
    assert s["scopes"][NEXT_BATCH] is None  # the scope is not in the step: no figure, not a zero


def test_unreadable_memory_events_are_counted_not_read():
    """A [memory] event with a NaN time or a string total is counted as unreadable and left out of the figures."""
    events = made_trace()
    bad_ts, bad_total = mem(50, MB, 999 * MB, 999 * MB), mem(51, MB, 999 * MB, 999 * MB)
    bad_ts["ts"] = float("nan")
    bad_total["args"]["Total Allocated"] = "999"
    ev = summarize.summarize_events(events + [bad_ts, bad_total])
    assert ev["memory"]["unreadable_events"] == 2
    assert ev["memory"]["devices"] == summarize.summarize_events(events)["memory"]["devices"]


def test_a_lean_trace_says_it_has_no_memory_events(tmp_path, capsys):
    """Without memory events the evidence says why, shows no memory figure, and the text says so in one line."""
    lean = [e for e in made_trace() if e["ph"] == "X"]
    ev = summarize.summarize_events(lean)
    assert ev["memory"] == {"events": 0, "unreadable_events": 0, "null_reason": memory.NO_EVENTS, "devices": {}}
    path = write(tmp_path, lean)
    assert summarize.main([path, "--full"]) == 0
    out = capsys.readouterr().out
    assert f"no memory figures: {memory.NO_EVENTS}" in out and "allocated peak MB" not in out


def test_the_text_shows_the_memory_table_per_step(tmp_path, capsys):
    """summarize's text: per device a column per step, the window's peak, and each scope's change and peak."""
    path = write(tmp_path, made_trace())
    assert summarize.main([path, "--full"]) == 0
    out = capsys.readouterr().out
    row = lambda label: next(line for line in out.splitlines() if line.startswith(label)).split()
    assert row("memory cuda:0")[-3:] == ["#1", "#2", "window"]
    assert row("allocated peak MB")[-3:] == ["183.0", "233.0", "233.0"]
    assert row(f"  {FORWARD_BACKWARD} change MB")[-2:] == ["10.0", "0.0"]
    two = formatting.format_table([summarize.summarize_events(made_trace(), name="A")] * 2)
    assert "A: memory cuda:0: peak allocated 233.0 MB, peak reserved 300.0 MB" in two


def check_invariants(ev):
    """The invariants every figure obeys: start and end <= peak; a scope's peak <= its step's; reserved >= allocated
    where both exist. Returns how many steps were checked."""
    checked = 0
    for name, dev in ev["memory"]["devices"].items():
        for s in dev["steps"]:
            assert s["allocated_start"] <= s["allocated_peak"] and s["allocated_end"] <= s["allocated_peak"], (name, s)
            for sc, f in s["scopes"].items():
                if f:
                    assert f["allocated_peak"] <= s["allocated_peak"], (name, s["step"], sc)
                    assert f["reserved_peak"] is None or f["reserved_peak"] <= s["reserved_peak"], (name, sc)
            if s["reserved_peak"] is not None:
                for k in ("start", "peak", "end"):
                    assert s[f"reserved_{k}"] >= s[f"allocated_{k}"], (name, s["step"], k)
            checked += 1
        assert dev["running_total_breaks"] == 0, (name, dev["running_total_breaks"])
    return checked


def test_a_real_cpu_profile_trace_obeys_the_memory_invariants(profile_run):
    """A trace train.py wrote on the CPU (full detail): CPU memory figures for every step that obey the invariants."""
    traces = sorted(glob.glob(os.path.join(profile_run["outputs"], "traces", "*.pt.trace.json.gz")))
    assert traces
    for trace in traces:
        ev = summarize.summarize_file(trace)
        assert list(ev["memory"]["devices"]) == ["cpu"], ev["memory"]
        assert check_invariants(ev) == len(ev["steps"]) == 3
        steps = ev["memory"]["devices"]["cpu"]["steps"]
        # forward and backward allocates the activations: its peak is the step's, above the step's start
        assert all(s["scopes"][FORWARD_BACKWARD]["allocated_peak"] == s["allocated_peak"] for s in steps)
        assert all(s["allocated_peak"] > s["allocated_start"] for s in steps)


def test_stored_h200_full_traces_obey_the_memory_invariants(stored_evidence):
    """The stored H200 eager traces with memory events: GPU figures per step that obey the invariants, the same
    start and end in every step (the steady state), and forward and backward holding the step's peak."""
    full = [t for t in reprofile("eager") if run_json(t)["settings"]["profile_detail"] == "full"]
    assert len(full) == 2, full  # one cycle of each full run is stored (workers 4 and 0) since 2026-12-06
    for trace in full:
        ev = stored_evidence(trace)
        gpu = ev["memory"]["devices"]["cuda:0"]
        assert check_invariants(ev) >= 6
        assert len({(s["allocated_start"], s["allocated_end"]) for s in gpu["steps"]}) == 1, trace
        assert all(s["scopes"][FORWARD_BACKWARD]["allocated_peak"] == s["allocated_peak"] for s in gpu["steps"])


def test_stored_lean_traces_have_no_memory_figures(stored_evidence):
    """The stored lean H200 traces (no profile_memory) carry no memory events, and say so."""
    lean = [t for t in reprofile("eager") if run_json(t)["settings"]["profile_detail"] == "lean"]
    assert lean
    for trace in lean:
        assert stored_evidence(trace)["memory"]["null_reason"] == memory.NO_EVENTS


def test_bench_on_the_cpu_records_no_peak_memory_and_says_why(bench_run):
    """A CPU bench run: run.json's peak memory figures are null with the reason; Polyaxon gets the reason, no
    number; the run's output says it beside the rate."""
    with open(os.path.join(bench_run["outputs"], "run.json")) as f:
        r = json.load(f)["results"]
    assert r["peak_allocated_mb"] is None and r["peak_reserved_mb"] is None
    assert r["peak_memory_note"] == device.NO_CPU_PEAK
    out = load_offline_run(bench_run["root"], bench_run["uuid"])["outputs"]
    assert "peak_allocated_mb" not in out and out["peak_memory_note"] == device.NO_CPU_PEAK
    assert f"bench: peak memory n/a: {device.NO_CPU_PEAK}" in bench_run["proc"].stdout


def test_compare_shows_each_group_s_peak_memory_beside_its_rate():
    """steplens compare: the median of the runs' window peaks (allocated / reserved MB) beside the median rate, in
    the Markdown table and the CSV; '-' and empty cells for a group with a run that has no peak."""
    a = [rec(f"a{i}", i, r) for i, r in enumerate([3000.0, 3100.0, 3200.0])]  # no peak logged
    b = [rec(f"b{i}", i, r, batch_size=1024) for i, r in enumerate([9000.0, 9100.0, 9200.0])]
    for r, (alloc, res) in zip(b, [(4000.0, 5000.0), (4100.0, 5200.0), (3900.0, 5100.0)]):
        r["outputs"].update(peak_allocated_mb=alloc, peak_reserved_mb=res)
    result = comparison.compare_records(a + b)
    by = {g["group"]: g for g in result["tables"][0]["groups"]}
    assert by["batch_size=128"]["memory"] is None
    assert by["batch_size=1024"]["memory"] == {
        "median_allocated_mb": 4000.0,
        "max_allocated_mb": 4100.0,
        "median_reserved_mb": 5100.0,
    }
    text = compare.markdown(result)
    assert "| median samples/s | peak GPU MB allocated / reserved |" in text
    assert "| batch_size=1024 | 3 | 9.10k | 4000 / 5100 |" in text and "| batch_size=128 | 3 | 3.10k | - |" in text
    rows = list(csv.reader(io.StringIO(compare.csv_text(result))))
    cols = [compare.CSV_COLUMNS.index(k) for k in ("group", "peak_allocated_mb", "peak_reserved_mb")]
    assert sorted([row[i] for i in cols] for row in rows[1:]) == [
        ["batch_size=1024", "4000.0", "5100.0"],
        ["batch_size=128", "", ""],
    ]


def test_the_memory_lane_s_points_are_the_running_totals(tmp_path):
    """The picture's memory lane, per step: the total at its start, the allocator's running total after each event
    (ms from the CPU lane's zero), the total at its end; one scale for every lane, from the lowest to the highest."""
    from steplens.evidence import picture

    ev = summarize.summarize_events(made_trace(), lanes=True)
    assert ev["memory_lane"] == {"device": "cuda:0", "null_reason": None}
    rows = picture.draw(ev, str(tmp_path / "p.png"), "made")
    made = [(ms, v // MB) for ms, v in rows[0]["memory"]]
    assert made == [
        (0, 100),
        (0.002, 101),
        (0.012, 103),
        (0.022, 153),
        (0.030, 183),
        (0.040, 153),
        (0.060, 113),
        (0.072, 118),
        (0.080, 113),
        (0.1, 113),
    ]
    second = [(round(ms, 6), v // MB) for ms, v in rows[1]["memory"]]
    assert second[0] == (0, 113) and second[-1] == (0.1, 113) and max(v for _, v in second) == 233
    assert picture.memory_scale(rows) == (100 * MB, 233 * MB)
    dev = ev["memory"]["devices"]["cuda:0"]
    for row, s in zip(rows, dev["steps"]):  # the lane and the step's figures: one running total, two readings
        values = [v for _, v in row["memory"]]
        assert (values[0], max(values), values[-1]) == (s["allocated_start"], s["allocated_peak"], s["allocated_end"])
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_lean_trace_draws_no_memory_lane_and_says_so_in_one_line(tmp_path, capsys):
    from steplens.evidence import picture

    lean = [e for e in made_trace() if e["ph"] == "X"]
    ev = summarize.summarize_events(lean, lanes=True)
    assert ev["memory_lane"] == {"device": None, "null_reason": memory.NO_EVENTS}
    assert all(r["memory"] is None for r in picture.lanes_of(ev)) and picture.memory_scale(picture.lanes_of(ev)) is None
    path = write(tmp_path, lean)
    assert picture.main([path, "--out", str(tmp_path / "lean.png")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"steplens picture: no memory lane: {memory.NO_EVENTS}"]
    assert (tmp_path / "lean.png").stat().st_size > 0
    assert picture.no_lane_line(memory.NO_EVENTS, short=True) == "no memory lane: the trace has no memory events"


def test_cpu_memory_events_alone_draw_no_gpu_lane():
    events = [step(1, 0, 100), scope(FORWARD_BACKWARD, 10, 50), mem(20, 8, 8, 0, device_type=0, device_id=-1)]
    assert summarize.summarize_events(events, lanes=True)["memory_lane"]["null_reason"] == memory.NO_GPU_EVENTS


def test_a_stored_h200_full_trace_s_memory_lanes_match_its_figures(tmp_path):
    """The stored H200 eager traces with memory events: each step's lane starts, peaks and ends at its figures."""
    from steplens.evidence import picture

    full = [t for t in reprofile("eager") if run_json(t)["settings"]["profile_detail"] == "full"]
    ev = summarize.summarize_file(full[0], lanes=True)
    rows = picture.draw(ev, str(tmp_path / "h200.png"), "h200")
    steps = ev["memory"]["devices"]["cuda:0"]["steps"]
    assert len(rows) == len(steps) >= 3
    for row, s in zip(rows, steps):
        values = [v for _, v in row["memory"]]
        assert (values[0], max(values), values[-1]) == (s["allocated_start"], s["allocated_peak"], s["allocated_end"])
        assert len(values) == s["events"] + 2
        assert all(0 <= ms <= row["cpu_ms"] + 1e-9 for ms, _ in row["memory"]), "the lane stays inside its step"


def test_every_span_gets_its_figures_even_one_whose_bound_is_not_a_number():
    """_sweep ends every span still open when the events run out, one whose end is NaN included (the readers
    refuse such times; were one to pass, no span's figures would be None), and one that ends past them."""
    events = [(float(k), 8, 8 * (k + 1), 64) for k in range(6)]
    assert None not in memory._sweep(iter(events), [(0.0, float("nan"))])
    found = memory._sweep(iter(events), [(1.0, 3.0), (2.0, 99.0)])
    assert [(f["allocated_peak"], f["events"]) for f in found] == [(24, 2), (48, 4)]  # 1-2; 2-5
