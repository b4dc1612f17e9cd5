"""profiling.py: the profiler's distortion, the pauses that refill DataLoader queues, and which cycle the headline reads."""
import json

import pytest

import profiling
from scopes import NEXT_BATCH


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
        events += [x(f"ProfilerStep#{n}", "user_annotation", a, wall),
                   x(NEXT_BATCH, "user_annotation", a, wait),
                   x("cudaLaunchKernel", "cuda_runtime", a + launch_at, 1, correlation=corr),
                   x("void gemm()", "kernel", a + kernel_at, kernel_dur, stream=7, correlation=corr)]
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def two_cycles(tmp_path):
    """Cycle 1 waits for input (next_batch 40 of 100 us, the GPU idle meanwhile); cycle 2, served from
    queues a trace dump refilled, finds its batches ready (next_batch 2 us)."""
    one = cycle_trace(tmp_path, "c1.json", [2, 3, 4], 100, 40, 45, 50, 40)
    two = cycle_trace(tmp_path, "c2.json", [7, 8, 9], 60, 2, 5, 10, 40)
    return [{"cycle": 1, "profiler_steps": [2, 4], "trace": one, "dump_before_step": 5, "dump_seconds": 1.0},
            {"cycle": 2, "profiler_steps": [7, 9], "trace": two, "dump_before_step": 10, "dump_seconds": 1.0}]


def capture(pauses, depth=8, workers=4, step_ms=0.1):
    return {"detail": "full", "unprofiled": {"steps": 10, "seconds": step_ms * 10 / 1e3, "step_ms": step_ms},
            "pauses_s": pauses, "queue_depth": depth, "workers": workers, "device_input": False,
            "queue": f"{workers} workers x prefetch_factor 2"}


SHORT = 0.2 * 0.1e-3  # a fifth of an unprofiled step: no batch refilled


def test_a_dump_refilled_cycle_is_flagged_and_the_headline_reads_the_other(tmp_path):
    """A 1 s trace dump before step 5 with 8 batches of queue: steps 5-12 may be served from the refill,
    so cycle 2 (steps 7-9) is flagged and the headline input figures come from cycle 1."""
    cycles = two_cycles(tmp_path)
    pauses = [SHORT] * 10
    pauses[5] = 1.0
    head = profiling.write_evidence(cycles, capture(pauses))
    assert head["headline_cycles"] == [1]
    assert head["input_gap_share"] == pytest.approx(40 / 60) and head["gpu_idle_share"] == pytest.approx(0.6)
    assert cycles[1]["follows_dump"] == [5] and cycles[0]["refilled_by"] == []
    assert cycles[1]["evidence"]["input_gap_share"] == pytest.approx(2 / 20), "cycle 2 alone would hide the wait"
    with open(cycles[1]["evidence_txt"]) as f:
        text = f.read()
    assert "follows cycle 1's trace dump (1.000 s, before step 5)" in text and "understated" in text
    assert "headline figures from cycle(s) 1" in text
    with open(cycles[1]["evidence_json"]) as f:
        saved = json.load(f)
    assert saved["capture"]["refilled_by"][0]["batches"] == 8
    assert saved["capture"]["dumps"] == [{"cycle": 1, "seconds": 1.0, "before_step": 5},
                                         {"cycle": 2, "seconds": 1.0, "before_step": 10}]
    assert "cycle 2's active steps start 2 steps after cycle 1's trace dump (1.000 s, before step 5)" in text


def test_when_the_profiler_start_refills_every_cycle_the_input_figures_are_null_with_the_reason(tmp_path):
    cycles = two_cycles(tmp_path)
    pauses = [SHORT] * 10
    pauses[1], pauses[5] = 0.5, 1.0  # the profiler's start after step 0, the dump after step 4
    head = profiling.write_evidence(cycles, capture(pauses))
    assert head["gpu_idle_share"] is None and head["input_gap_share"] is None
    assert "refill" in head["null_reasons"]["input_wait"]
    assert cycles[0]["refilled_by"][0]["what"] == "the profiler's start"
    assert head["profiled_step_ms"] is not None and head["headline_cycles"] == [1, 2]
    assert head["headline_steps"] is None


def test_a_short_start_pause_refills_one_step_and_the_headline_reads_the_others(tmp_path):
    """The profiler's start refills 2 batches (steps 1 and 2), the dump all of cycle 2: no cycle is clean,
    so the headline comes from steps 3 and 4, which waited for input; step 2, served from the refill,
    found its batch ready and would dilute the wait."""
    one = cycle_trace(tmp_path, "c1.json", [2, 3, 4], 100, [2, 40, 40], 45, 50, 40)
    two = cycle_trace(tmp_path, "c2.json", [7, 8, 9], 60, 2, 5, 10, 40)
    cycles = [{"cycle": 1, "profiler_steps": [2, 4], "trace": one, "dump_before_step": 5, "dump_seconds": 1.0},
              {"cycle": 2, "profiler_steps": [7, 9], "trace": two, "dump_before_step": 10, "dump_seconds": 1.0}]
    pauses = [SHORT] * 10
    pauses[1], pauses[5] = 2.5 * 0.1e-3, 1.0  # 2.5 unprofiled steps: 2 batches
    head = profiling.write_evidence(cycles, capture(pauses))
    assert [r["batches"] for r in cycles[0]["refilled_by"]] == [2]
    assert head["headline_steps"] == [3, 4] and head["headline_cycles"] == [1, 2]
    assert head["gpu_idle_share"] == pytest.approx(0.6) and head["input_gap_share"] == pytest.approx(40 / 60)
    assert head["profiled_step_ms"] == pytest.approx(0.1)
    assert head["profiler_distortion"] == pytest.approx(1.0)
    with open(cycles[0]["evidence_txt"]) as f:
        assert "from the steps no pause refilled (3, 4)" in f.read()


def test_without_worker_processes_nothing_is_refilled(tmp_path):
    cycles = two_cycles(tmp_path)
    pauses = [SHORT] * 10
    pauses[5] = 1.0
    head = profiling.write_evidence(cycles, capture(pauses, depth=0, workers=0))
    assert head["headline_cycles"] == [1, 2] and all(c["refilled_by"] == [] for c in cycles)


def test_refill_counts_batches_by_the_unprofiled_step():
    """A pause of 2.5 unprofiled steps refills 2 batches (they serve the next 2 steps), never more than the queue."""
    cycles = [{"cycle": 1, "profiler_steps": [2, 4]}, {"cycle": 2, "profiler_steps": [7, 9]}]
    found = profiling.refills(cycles, [0, 0, 0, 0, 0, 0.05, 0, 0, 0, 0], queue_depth=8, step_s=0.02)
    assert found == {1: [], 2: []}, "steps 5 and 6 take the two refilled batches"
    found = profiling.refills(cycles, [0, 0, 0, 0, 0, 0, 0.05, 0, 0, 0], queue_depth=8, step_s=0.02)
    assert found[2] == [{"before_step": 6, "seconds": 0.05, "batches": 2, "what": "the profiler's start",
                         "dump": False}]
    capped = profiling.refills(cycles, [0] * 5 + [9.0] + [0] * 4, 3, 0.02)[2]
    assert capped[0]["batches"] == 3, "a 9 s pause refills the whole queue of 3: steps 5-7, one of them cycle 2's"


@pytest.mark.parametrize("ratio,workers,device,expect", [
    (1.76, 0, False, "overstates the in-process input cost"),
    (1.76, 2, False, "may not show in the trace"),
    (1.3, 0, True, "CPU times are inflated"),
    (1.05, 2, False, None),
    (None, 2, False, None),
    (0.79, 2, False, "understates the input wait"),  # profiled faster than unprofiled: refilled queues
    (0.85, 0, False, "the host's pace changed"),
])
def test_distortion_sentence(ratio, workers, device, expect):
    said = profiling.distortion_sentence(ratio, workers, device)
    assert (said is None) if expect is None else (expect in said and f"{ratio:.2f}x" in said)


def test_an_unsteady_unprofiled_pace_is_said_even_when_the_ratio_looks_harmless():
    """A workers=0 host whose steps wandered from 28 to 54 ms: the ratio is uncertain by that much."""
    each = [28.0, 30.0, 54.0, 50.0]
    said = profiling.distortion_sentence(1.02, 0, False, each)
    assert "ranged from 28.0 to 54.0 ms" in said and "uncertain" in said
    assert profiling.distortion_sentence(1.02, 0, False, [30.0, 31.0, 33.0]) is None, "a steady pace needs no word"
    assert "uncertain" in profiling.distortion_sentence(3.9, 0, False, each)
    assert "compare --profile-detail lean" in profiling.distortion_sentence(1.6, 4, False)
    lean = profiling.distortion_sentence(1.6, 4, False, detail="lean")
    assert "--profile-detail lean" not in lean and "still records every operator" in lean


def test_time_unprofiled_times_each_step_between_two_synchronizations():
    """Real steps on the CPU clock: each step's time is recorded, they add up to the synchronized total
    (give or take the closing synchronization), and the laps do not change what is returned otherwise."""
    import time
    import torch
    calls = []

    def step():
        time.sleep(0.002 * (1 + len(calls) % 2))  # 2 ms, 4 ms, 2 ms, ...
        calls.append(1)
    out, last_end = profiling.time_unprofiled(step, 6, lambda: calls.append("sync"), laps=profiling.Laps(torch, False))
    assert len(out["step_ms_each"]) == 6 and calls.count("sync") == 2
    assert sum(out["step_ms_each"]) == pytest.approx(out["seconds"] * 1e3, rel=0.2)
    assert min(out["step_ms_each"]) >= 2.0 and max(out["step_ms_each"]) >= 4.0
    bare, _ = profiling.time_unprofiled(step, 2, lambda: None)
    assert "step_ms_each" not in bare and bare["steps"] == 2


def test_distortion_is_profiled_over_unprofiled(tmp_path):
    cycles = two_cycles(tmp_path)
    head = profiling.write_evidence(cycles, capture([SHORT] * 10, depth=0, workers=0, step_ms=0.05))
    assert head["unprofiled_step_ms"] == 0.05
    assert head["profiled_step_ms"] == pytest.approx((3 * 100 + 3 * 60) / 6 / 1e3)
    assert head["profiler_distortion"] == pytest.approx(head["profiled_step_ms"] / 0.05)
    assert "loading runs in the profiled main process" in head["distortion_sentence"]
    assert head["unprofiled_step_ms_range"] is None, "no per-step laps were given"


def test_the_evidence_carries_the_unprofiled_spread(tmp_path):
    cycles = two_cycles(tmp_path)
    cap = capture([SHORT] * 10, depth=0, workers=0, step_ms=0.05)
    cap["unprofiled"]["step_ms_each"] = [0.03, 0.05, 0.07]
    head = profiling.write_evidence(cycles, cap)
    assert head["unprofiled_step_ms_range"] == [0.03, 0.07]
    with open(cycles[0]["evidence_txt"]) as f:
        text = f.read()
    assert "each 0.03 to 0.07 ms" in text and "uncertain" in text
