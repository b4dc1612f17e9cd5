"""The profiler's distortion, the pauses that refill DataLoader queues, and which cycle the headline reads."""

import json

import pytest

from steplens import stats
from steplens.evidence import cycle_evidence, distortion, summarize
from steplens.job import capture as job_capture
from steplens.scopes import NEXT_BATCH


def x(name, cat, ts, dur, **args):
    ev = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if cat == "kernel":
        ev.update(pid=0, tid=7)
    if args:
        ev["args"] = args
    return ev


def cycle_trace(tmp_path, name, steps, wall, next_batch, launch_at, kernel_at, kernel_dur):
    """Steps of `wall` us: next_batch from the step's start (one length, or one per step), one kernel
    launched and run at fixed offsets."""
    events = []
    for i, n in enumerate(steps):
        a = 1000 * i
        corr = 100 * n
        wait = next_batch[i] if isinstance(next_batch, list) else next_batch
        events += [
            x(f"ProfilerStep#{n}", "user_annotation", a, wall),
            x(NEXT_BATCH, "user_annotation", a, wait),
            x("cudaLaunchKernel", "cuda_runtime", a + launch_at, 1, correlation=corr),
            x("void gemm()", "kernel", a + kernel_at, kernel_dur, stream=7, correlation=corr),
        ]
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def two_cycles(tmp_path):
    """Cycle 1 waits for input (next_batch 40 of 100 us, the GPU idle meanwhile); cycle 2, served from
    queues a trace dump refilled, finds its batches ready (next_batch 2 us)."""
    one = cycle_trace(tmp_path, "c1.json", [2, 3, 4], 100, 40, 45, 50, 40)
    two = cycle_trace(tmp_path, "c2.json", [7, 8, 9], 60, 2, 5, 10, 40)
    return [
        {"cycle": 1, "profiler_steps": [2, 4], "trace": one, "dump_before_step": 5, "dump_seconds": 1.0},
        {"cycle": 2, "profiler_steps": [7, 9], "trace": two, "dump_before_step": 10, "dump_seconds": 1.0},
    ]


def capture(pauses, depth=8, workers=4, step_ms=0.1, steps_s=None):
    """The timings of a capture: unprofiled steps of step_ms (the loader's pace), the pauses before each
    of the 10 loop steps, and, when given, each loop step's duration."""
    return {
        "detail": "full",
        "unprofiled": {"steps": 10, "seconds": step_ms * 10 / 1e3, "step_ms": step_ms},
        "pauses_s": pauses,
        "steps_s": steps_s,
        "queue_depth": depth,
        "workers": workers,
        "device_input": False,
        "queue": f"{workers} workers x prefetch_factor 2",
    }


SHORT = 0.2 * 0.1e-3  # a fifth of an unprofiled step: no batch refilled
FAST = [0.6 * 0.1e-3] * 10  # every loop step at 0.6 of the loader's pace: without pauses each one waits


def test_a_dump_refilled_cycle_is_flagged_and_the_headline_reads_the_other(tmp_path):
    """A 1 s trace dump before step 5 fills the queue of 8 batches: cycle 2's steps (58 us of compute,
    faster than the loader's 100 us) find their batches queued where without the dump each would have
    waited about 40 us, so cycle 2 is flagged and the headline input figures come from cycle 1, whose steps
    the trace shows waiting (40 us in input/next_batch)."""
    cycles = two_cycles(tmp_path)
    pauses = [SHORT] * 10
    pauses[5] = 1.0
    head = cycle_evidence.write_evidence(cycles, capture(pauses))
    assert head["headline_cycles"] == [1] and head["headline_steps"] is None
    assert head["input_gap_share"] == pytest.approx(40 / 60) and head["gpu_idle_share"] == pytest.approx(0.6)
    assert cycles[1]["follows_dump"] == [5] and cycles[0]["refilled_by"] == []
    assert cycles[1]["refilled_by"][0]["steps"] == [7, 8, 9]
    assert cycles[1]["evidence"]["input_gap_share"] == pytest.approx(2 / 20), "cycle 2 alone would hide the wait"
    with open(cycles[1]["evidence_txt"]) as f:
        text = f.read()
    assert "pause: cycle 1's trace dump (1.000 s, before step 5)" in text and "understate" in text
    assert "step(s) 7, 8, 9 found their batch ready" in text and "headline figures come from cycle(s) 1" in text
    with open(cycles[1]["evidence_json"]) as f:
        saved = json.load(f)
    assert saved["capture"]["refilled_by"][0]["batches"] == 8
    assert saved["capture"]["dumps"] == [
        {"cycle": 1, "seconds": 1.0, "before_step": 5},
        {"cycle": 2, "seconds": 1.0, "before_step": 10},
    ]
    assert "this cycle's steps start 2 steps after cycle 1's trace was written (1.000 s, before step 5)" in text


def test_when_refills_served_every_traced_step_the_input_figures_are_null_with_the_reason(tmp_path):
    """Steps faster than the loader, none waiting in the trace, a 0.5 s start and a 1 s dump: every traced
    step was served by a refill, so the headline idle and input gap are null, with the reason."""
    one = cycle_trace(tmp_path, "c1.json", [2, 3, 4], 60, 2, 5, 10, 40)
    two = cycle_trace(tmp_path, "c2.json", [7, 8, 9], 60, 2, 5, 10, 40)
    cycles = [
        {"cycle": 1, "profiler_steps": [2, 4], "trace": one, "dump_before_step": 5, "dump_seconds": 1.0},
        {"cycle": 2, "profiler_steps": [7, 9], "trace": two, "dump_before_step": 10, "dump_seconds": 1.0},
    ]
    pauses = [SHORT] * 10
    pauses[1], pauses[5] = 0.5, 1.0
    head = cycle_evidence.write_evidence(cycles, capture(pauses, steps_s=FAST))
    assert head["gpu_idle_share"] is None and head["input_gap_share"] is None
    assert "refill" in head["null_reasons"]["input_wait"]
    assert cycles[0]["refilled_by"][0]["what"] == "the profiler's start" and cycles[0]["refilled_by"][0]["steps"] == [
        2,
        3,
        4,
    ]
    assert head["profiled_step_ms"] is not None and head["headline_cycles"] == [1, 2]
    assert head["headline_steps"] is None


def test_a_short_start_pause_refills_one_step_and_the_headline_reads_the_others(tmp_path):
    """Steps computing for a fifth of the loader's batch time: the profiler's start (1.5 batch times) serves
    step 2, and steps 3 and 4 wait a little (10 us, which the model puts at 50-60 us): cycle 1 waited less
    than a quarter of what it would have without the pause, so it is flagged, as is cycle 2 after the dump.
    Every headline figure then comes from steps 3 and 4, the steps no refill served."""
    one = cycle_trace(tmp_path, "c1.json", [2, 3, 4], 30, [2, 10, 10], 12, 15, 10)
    two = cycle_trace(tmp_path, "c2.json", [7, 8, 9], 22, 2, 5, 10, 10)
    cycles = [
        {"cycle": 1, "profiler_steps": [2, 4], "trace": one, "dump_before_step": 5, "dump_seconds": 1.0},
        {"cycle": 2, "profiler_steps": [7, 9], "trace": two, "dump_before_step": 10, "dump_seconds": 1.0},
    ]
    pauses = [SHORT] * 10
    pauses[1], pauses[5] = 1.5 * 0.1e-3, 1.0
    head = cycle_evidence.write_evidence(cycles, capture(pauses))
    assert [(r["batches"], r["steps"]) for r in cycles[0]["refilled_by"]] == [(1.5, [2])]
    assert [r["steps"] for r in cycles[1]["refilled_by"]] == [[7, 8, 9]]
    assert head["headline_steps"] == [3, 4] and head["headline_cycles"] == [1]
    assert head["gpu_idle_share"] == pytest.approx(20 / 30) and head["input_gap_share"] == pytest.approx(10 / 20)
    assert head["profiled_step_ms"] == head["cpu_step_ms"] == pytest.approx(0.03), "one basis, the same steps"
    assert head["gpu_work_ms_per_step"] == pytest.approx(0.01) and head["gpu_span_ms_per_step"] == pytest.approx(1.0)
    with open(cycles[0]["evidence_txt"]) as f:
        assert "headline figures come from the steps no pause served (3, 4)" in f.read()


def test_an_uneven_loader_is_not_read_as_a_refill():
    """Two workers that finish together: per cycle one step waits 10 ms and two find a batch, with or
    without the 0.9 s dump before cycle 2 (the waits measured in both cycles are the same). The steady-pace
    model would have each step wait 5 ms: the cycles' measured 10 ms is no less than a quarter of its 15 ms,
    so no cycle is flagged."""
    cycles = [{"cycle": 1, "profiler_steps": [2, 4]}, {"cycle": 2, "profiler_steps": [7, 9], "dump_before_step": 5}]
    pauses = [0.002, 0.02, 0.0005, 0.0001, 0.0001, 0.9, 0.02, 0.0005, 0.0001, 0.0001]
    measured = {2: 0.0, 3: 0.01, 4: 0.0, 7: 0.0, 8: 0.01, 9: 0.0}
    found = distortion.refills(
        cycles,
        pauses,
        queue_depth=4,
        pace_s=0.015,
        compute_s=[0.01] * 10,
        seen_waits={3: 0.01, 8: 0.01},
        measured_waits=measured,
    )
    assert found == {1: [], 2: []}
    hidden = {i: 0.0 for i in measured}  # the same pauses, and no step of cycle 2 waited at all
    found = distortion.refills(
        cycles,
        pauses,
        queue_depth=4,
        pace_s=0.015,
        compute_s=[0.01] * 10,
        seen_waits={3: 0.01},
        measured_waits={**hidden, 3: 0.01},
    )
    assert found[2] and found[2][0]["dump"]


def test_on_the_gpu_timeline_no_single_steps_stand_in(tmp_path):
    """Per-step figures add up to the window's only on the CPU's steps: when every cycle was refilled and
    the cycles read idle time on the GPU's timeline, the input figures are null rather than pooled."""
    cycles = two_cycles(tmp_path)
    evidences = {
        c["cycle"]: {"idle_basis": "gpu_timeline", "steps": [{"step": 2, "pace_us": 1.0, "gpu_idle_us": 0.0}]}
        for c in cycles
    }
    for c in cycles:
        c["refilled_by"] = []
    assert distortion.clean_steps(cycles, evidences) == []
    evidences[1]["idle_basis"] = evidences[2]["idle_basis"] = "cpu_steps"
    assert [s["step"] for _, s in distortion.clean_steps(cycles, evidences)] == [2, 2]


def test_without_worker_processes_nothing_is_refilled(tmp_path):
    cycles = two_cycles(tmp_path)
    pauses = [SHORT] * 10
    pauses[5] = 1.0
    head = cycle_evidence.write_evidence(cycles, capture(pauses, depth=0, workers=0))
    assert head["headline_cycles"] == [1, 2] and all(c["refilled_by"] == [] for c in cycles)


def served(waits, pace):
    return [w < distortion.WAITED_AT * pace for w in waits]


def test_the_queue_model_drains_a_refill_at_the_steps_own_pace():
    """A pause of 2.5 batch times, steps at half the loader's pace: each step takes a batch and the loader
    makes half of one meanwhile, so the refill (with the half batch left from step 0) lasts five steps, not
    two; the queue caps a long pause; a wait is not loading time."""
    pace, half = 0.02, [0.01] * 7
    waits = distortion.queue_waits([0, 0.05, 0, 0, 0, 0, 0], half, 8, pace)
    assert served(waits, pace) == [False] + [True] * 5 + [False]
    assert waits[0] == pytest.approx(pace) and waits[6] == pytest.approx(0.5 * pace)
    assert served(distortion.queue_waits([0] * 7, half, 8, pace), pace) == [False] * 7
    capped = distortion.queue_waits([0, 9.0, 0, 0, 0, 0, 0], half, 3, pace)
    assert served(capped, pace) == [False] + [True] * 5 + [False]
    assert served(distortion.queue_waits([0] * 4, [0.03] * 4, 8, pace), pace) == [False, True, True, True], (
        "slower than the loader"
    )
    seen = distortion.queue_waits([0, 1.0, 0, 0], [0.01] * 4, 8, pace, seen_waits={2: 0.009})
    assert seen[2] == 0.009 and not served(seen, pace)[3], "a wait seen in the trace empties the queue"
    # A step of 0.0099 s that waited 0.009 s of it loaded for 0.0009 s, not 0.0099: the 0.5 ms pause after
    # it does not make the next step's batch.
    after = distortion.queue_waits([0, 0, 0.0005], [0.01, 0.0099, 0.01], 8, pace, seen_waits={1: 0.009})
    assert after[2] > distortion.WAITED_AT * pace


def test_a_refill_that_hides_a_tiny_wait_is_not_flagged():
    """Steps computing for 0.999 of the loader's pace and a 1 s dump: without the dump each would wait
    20 us, far below a quarter of a batch's time: nothing worth calling hidden."""
    cycles = [{"cycle": 1, "profiler_steps": [2, 4]}, {"cycle": 2, "profiler_steps": [7, 9], "dump_before_step": 5}]
    pauses = [0] * 10
    pauses[5] = 1.0
    found = distortion.refills(cycles, pauses, queue_depth=8, pace_s=0.02, compute_s=[0.01998] * 10)
    assert found == {1: [], 2: []}


def test_refills_flag_what_the_pauses_served_and_name_the_pause():
    cycles = [{"cycle": 1, "profiler_steps": [2, 4]}, {"cycle": 2, "profiler_steps": [7, 9]}]
    pauses = [0] * 10
    pauses[6] = 0.05
    found = distortion.refills(cycles, pauses, queue_depth=8, pace_s=0.02, compute_s=[0.01] * 10)
    assert found[1] == []
    assert found[2] == [
        {
            "before_step": 6,
            "seconds": 0.05,
            "batches": 2.5,
            "steps": [7, 8, 9],
            "what": "the profiler's start",
            "dump": False,
        }
    ]
    slow = distortion.refills(cycles, pauses, queue_depth=8, pace_s=0.02, compute_s=[0.03] * 10)
    assert slow == {1: [], 2: []}, "steps slower than the loader never wait: no refill hides a wait"
    unknown = distortion.refills(cycles, pauses, queue_depth=8, pace_s=None)
    assert [r["steps"] for r in unknown[1]] == [[2, 3, 4]], "no pace known: every traced step is suspect"


def test_a_gpu_bound_run_with_workers_keeps_its_headline(tmp_path):
    """Where the CPU runs ahead (idle read on the GPU's timeline), a host-side wait idles no GPU: no refill
    is flagged, whatever the pauses, and the headline idle share stays."""
    cycles = two_cycles(tmp_path)
    pauses = [SHORT] * 10
    pauses[1], pauses[5] = 0.5, 1.0
    real = summarize.summarize_file

    def ahead(path, **kw):
        ev = real(path, **kw)
        ev["idle_basis"] = "gpu_timeline"
        return ev

    summarize.summarize_file = ahead
    try:
        head = cycle_evidence.write_evidence(cycles, capture(pauses, steps_s=FAST))
    finally:
        summarize.summarize_file = real
    assert all(c["refilled_by"] == [] for c in cycles) and head["gpu_idle_share"] is not None


@pytest.mark.parametrize(
    "ratio,workers,device,expect",
    [
        (1.76, 0, False, "overstates the in-process input cost"),
        (1.76, 2, False, "may not show in the trace"),
        (1.3, 0, True, "CPU times are inflated"),
        (1.05, 2, False, None),
        (None, 2, False, None),
        (0.79, 2, False, "understates the input wait"),  # profiled faster than unprofiled: queued batches
        (0.85, 0, False, "the host's pace changed"),
        (1 / 1.1, 2, False, "which the profiler cannot cause"),  # the boundary itself
        (0.92, 2, False, None),
        (1.1, 2, False, "may not show in the trace"),
    ],
)
def test_distortion_sentence(ratio, workers, device, expect):
    said = distortion.distortion_sentence(ratio, workers, device)
    assert (said is None) if expect is None else (expect in said and f"{ratio:.2f}x" in said)


def test_the_ratio_s_standard_error_is_said_and_a_ratio_whose_interval_holds_1_called_uncertain():
    said = distortion.distortion_sentence(1.3, 2, False, se=0.2, df=4)
    assert "give or take 0.20" in said and "too uncertain" in said and "slows the main process" not in said, (
        "an uncertain ratio asserts no effect"
    )
    assert "paced by the loader" in said
    assert distortion.distortion_sentence(1.02, 0, False, se=0.001, df=10) is None, "a steady 1.02 needs no word"
    clear = distortion.distortion_sentence(1.69, 4, False, se=0.22, df=30)
    assert "give or take 0.22" in clear and "too uncertain" not in clear and "may not show" in clear
    assert "too uncertain" in distortion.distortion_sentence(1.69, 4, False, se=0.22, df=2), (
        "with 2 degrees of freedom the interval is 4.3 standard errors wide each way"
    )
    assert "compare --profile-detail lean" in distortion.distortion_sentence(1.6, 4, False)
    calm = distortion.distortion_sentence(0.86, 4, False, refilled=False, spread=(5900.0, 8700.0))
    assert "host's pace changed" in calm and "understates" not in calm and "5900.0 to 8700.0 ms" in calm, (
        "with workers but no refill and no wait, a ratio below 1 is the host's pace"
    )
    lean = distortion.distortion_sentence(1.6, 4, False, detail="lean")
    assert "--profile-detail lean" not in lean and "still records every operator" in lean


def test_the_unprofiled_pace_leaves_out_a_slow_first_step_and_the_ratio_has_a_standard_error():
    """Where the CPU runs ahead, the first unprofiled step starts on an empty GPU queue (3.2 against 2.47 ms
    on the H200): left out. A first step that is not the slowest stays in."""
    each = [3.213, 2.467, 2.47, 2.475, 2.469]
    mean, steady = distortion.unprofiled_pace({"steps": 5, "step_ms": 2.6, "step_ms_each": each}, cpu_runs_ahead=True)
    assert steady == each[1:] and mean == pytest.approx(sum(each[1:]) / 4)
    assert distortion.unprofiled_pace({"steps": 5, "step_ms": 2.6, "step_ms_each": each})[1] == each, (
        "a loop paced by its CPU or its loader keeps its first step: a wait in it is real"
    )
    uneven = [9.7, 20.0, 11.1, 21.7]
    assert distortion.unprofiled_pace({"steps": 4, "step_ms": 15.6, "step_ms_each": uneven}, True)[1] == uneven
    assert distortion.unprofiled_pace({"steps": 5, "step_ms": 2.6}) == (2.6, None)
    se, df = distortion.ratio_se(2.0, [10.0, 12.0], [5.0, 5.0])
    assert se == pytest.approx(2.0 * 1.0 / 11.0) and df == pytest.approx(1.0)  # stdev 1.414, / sqrt 2 / mean 11
    assert distortion.ratio_se(2.0, [10.0], [5.0, 5.0]) == (None, None)
    assert stats.t975(None) == 1.96 and stats.t975(2.7) == 4.30 and stats.t975(500) == 1.96


def test_time_unprofiled_times_each_step_between_two_synchronizations(monkeypatch):
    """A stand-in clock that only the steps and the synchronizations move (no real time is read): each lap
    is its step's own time, the total runs from after the opening synchronization to after the closing
    one, the last step's end is before the closing synchronization, and without laps the rest is the same."""
    import types

    now = [100.0]
    monkeypatch.setattr(job_capture, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []

    def step():
        now[0] += 0.002 * (1 + len(calls) % 2)  # 2 ms, 4 ms, 2 ms, ... (the syncs count in calls too)
        calls.append("step")

    def sync():
        now[0] += 0.0005
        calls.append("sync")

    out, last_end = job_capture.time_unprofiled(step, 6, sync, laps=job_capture.Laps(False))
    assert calls[0] == calls[-1] == "sync" and calls.count("sync") == 2 and calls.count("step") == 6
    assert out["step_ms_each"] == pytest.approx([4.0, 2.0, 4.0, 2.0, 4.0, 2.0])
    assert out["seconds"] == pytest.approx(0.018 + 0.0005) and out["steps"] == 6
    assert out["step_ms"] == pytest.approx((18.0 + 0.5) / 6)
    assert last_end == pytest.approx(100.0005 + 0.018), "the last step's end, before the closing synchronization"
    calls.clear()
    bare, _ = job_capture.time_unprofiled(step, 2, lambda: None)
    assert "step_ms_each" not in bare and bare["steps"] == 2 and bare["seconds"] == pytest.approx(0.002 + 0.004)
    stopped, _ = job_capture.time_unprofiled(step, 6, lambda: None, boundary=lambda: len(calls) >= 5)
    assert stopped["steps"] == 3, "a boundary that returns true ends the block and keeps the steps done"


def test_distortion_is_profiled_over_unprofiled(tmp_path):
    cycles = two_cycles(tmp_path)
    head = cycle_evidence.write_evidence(cycles, capture([SHORT] * 10, depth=0, workers=0, step_ms=0.05))
    assert head["unprofiled_step_ms"] == 0.05
    assert head["profiled_step_ms"] == pytest.approx((3 * 100 + 3 * 60) / 6 / 1e3)
    assert head["profiler_distortion"] == pytest.approx(head["profiled_step_ms"] / 0.05)
    assert "loading runs in the profiled main process" in head["distortion_sentence"]
    assert head["unprofiled_step_ms_range"] is None, "no per-step laps were given"


def test_the_evidence_carries_the_unprofiled_spread(tmp_path):
    cycles = two_cycles(tmp_path)
    cap = capture([SHORT] * 10, depth=0, workers=0, step_ms=0.05)
    cap["unprofiled"]["step_ms_each"] = [0.09, 0.05, 0.07]  # read on the CPU's steps: the first stays in
    head = cycle_evidence.write_evidence(cycles, cap)
    assert head["unprofiled_step_ms_range"] == [0.05, 0.09] and head["unprofiled_step_ms"] == pytest.approx(0.07)
    assert head["profiler_distortion_se"] > 0
    with open(cycles[0]["evidence_txt"]) as f:
        text = f.read()
    assert "the 3 averaged, 0.05 to 0.09 ms" in text and "too uncertain" in text
