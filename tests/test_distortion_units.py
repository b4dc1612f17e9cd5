"""The capture's account on figures written out by hand, no trace read: each loop step's compute time and the
waits seen (loop_timings), the headline pooled over chosen steps (pool_steps), the account kept beside each
cycle (capture_account) and the headline weighed against the capture (capture_headline)."""

import statistics

import pytest

from steplens.evidence import distortion
from steplens.scopes import NEXT_BATCH, SCOPES


def step(num, wall_us, input_us=None, **figs):
    """A traced step of wall_us, input_us of it in the input scope (none recorded when None)."""
    s = {"step": num, "wall_us": wall_us, "scopes_cpu_us": {} if input_us is None else {NEXT_BATCH: input_us}}
    s.update(figs)
    return s


def test_loop_timings_read_the_capture_first_then_the_traces_then_the_mean():
    """Steps 0 and 1 measured by the loop, step 2 by its trace alone, step 3 by neither. The trace's figures for
    steps 0 and 1 (1 s each) are not read: the loop's own measurements come first. Pace 0.5 s: a wait of
    0.125 s (a quarter of it) or more is seen."""
    capture = {"pauses_s": [0.0] * 4, "steps_s": [0.625, 0.0625], "inputs_s": [0.125, 0.25]}
    steps = [step(0, 1e6, 0.0), step(1, 1e6, 0.0), step(2, 250_000.0, 62_500.0), step(4, 1e6, 0.0)]
    evidences = {1: {"scope_set": SCOPES, "steps": steps}}
    compute, seen, measured = distortion.loop_timings(capture, [{"cycle": 1}], evidences, 0.5)
    # step 1 took less than its wait: no compute time, not less than none
    assert compute == [0.5, 0.0, 0.1875, statistics.fmean([0.5, 0.0, 0.1875])]
    assert seen == {0: 0.125, 1: 0.25}, "exactly a quarter of the pace is seen; 0.0625 is not"
    assert measured == {0: 0.125, 1: 0.25, 2: 0.0625}


def test_loop_timings_without_a_pace_weigh_each_wait_against_its_own_step():
    """No pace: a wait is seen at a quarter of its step's time (compute + wait). Step 0 is read from its trace."""
    steps = [
        step(0, 500_000.0, 125_000.0),  # 0.125 of 0.5 s: a quarter, seen
        step(1, 625_000.0, 125_000.0),  # 0.125 of 0.625 s: under a quarter
        step(2, 125_000.0, 125_000.0),  # all wait, no compute: seen
        step(3, 0.0),  # no time and no input scope: no wait, none seen
        step(5, 1e6, 0.0),  # beyond the capture's 4 steps
    ]
    evidences = {1: {"scope_set": SCOPES, "steps": steps}}
    compute, seen, measured = distortion.loop_timings({"pauses_s": [0.0] * 4}, [{"cycle": 1}], evidences, None)
    assert compute == [0.375, 0.5, 0.0, 0.0]
    assert seen == {0: 0.125, 2: 0.125}
    assert measured == {0: 0.125, 1: 0.125, 2: 0.125, 3: 0.0}


def test_loop_timings_with_no_step_known_take_the_pace():
    assert distortion.loop_timings({"pauses_s": [0.0, 0.0]}, [], {}, 0.5) == ([0.5, 0.5], {}, {})
    assert distortion.loop_timings({"pauses_s": [0.0, 0.0]}, [], {}, None) == ([None, None], {}, {})


def test_pool_steps_pools_the_chosen_steps_alone_and_keeps_the_rest_of_the_headline():
    head = {"null_reasons": {"gpu_span_ms_per_step": "old", "gpu": "kept"}, "kernel_classes": "kept"}
    a = {"pace_us": 1000.0, "wall_us": 900.0, "gpu_idle_us": 400.0, "input_gap_us": 100.0, "gpu_work_us": 500.0}
    b = {"pace_us": 3000.0, "wall_us": 2500.0, "gpu_idle_us": 600.0, "input_gap_us": 400.0, "gpu_work_us": 2000.0}
    pooled = distortion.pool_steps(head, [(1, {**a, "gpu_span_us": 600.0}), (2, {**b, "gpu_span_us": 2000.0})])
    assert pooled == {
        "null_reasons": {"gpu": "kept"},
        "kernel_classes": "kept",
        "profiled_step_ms": 2.0,
        "cpu_step_ms": 1.7,
        "gpu_idle_share": 0.25,
        "input_gap_share": 0.5,
        "gpu_work_ms_per_step": 1.25,
        "gpu_span_ms_per_step": 1.3,
    }
    assert head["null_reasons"] == {"gpu_span_ms_per_step": "old", "gpu": "kept"}, "the headline given is kept"
    idle = {"pace_us": 500.0, "wall_us": 500.0, "gpu_idle_us": 0.0, "input_gap_us": 0.0, "gpu_work_us": 500.0}
    pooled = distortion.pool_steps({"null_reasons": {}}, [(1, {**idle, "gpu_span_us": None}), (1, idle)])
    assert pooled == {
        "null_reasons": {"gpu_span_ms_per_step": "none of the headline steps has a complete GPU slot"},
        "profiled_step_ms": 0.5,
        "cpu_step_ms": 0.5,
        "gpu_idle_share": 0.0,
        "input_gap_share": 0.0,
        "gpu_work_ms_per_step": 0.5,
        "gpu_span_ms_per_step": None,
    }


FIGURES = {
    "unprofiled_step_ms": 20.0,
    "profiler_distortion": 1.5,
    "profiler_distortion_se": 0.02,
    "profiler_distortion_df": 2.0,
    "unprofiled_drift": 1.01,
    "distortion_low": 1.4,
    "distortion_high": 1.6,
    "distortion_uncertain": None,
}


def account(figures=FIGURES, steady=(19.0, 21.0), refilled_by=(), clean=True, **over):
    capture = {
        "detail": "full",
        "unprofiled": {"steps": 12},
        "workers": 4,
        "device_input": False,
        "queue_depth": 8,
        "queue": "4 workers x prefetch_factor 2",
        "run_label": "bench-1",
        "pauses_s": [0.1234567, 2.0],
    }
    capture.update(over)
    cycles = [
        {"cycle": 1, "refilled_by": list(refilled_by), "dump_before_step": 5, "dump_seconds": 1.5},
        {"cycle": 2, "refilled_by": [], "dump_before_step": None},
        {"cycle": 3, "refilled_by": [], "dump_before_step": 9},
    ]
    head = {"profiled_step_ms": 30.0, "headline_steps": [3, 4]}
    steady = list(steady) if steady else None
    return distortion.capture_account(
        capture, cycles, head, dict(figures), steady, [0.1234567, None], {3: 0.0123456}, [1], clean
    )


def test_the_capture_s_account_keeps_each_figure_and_rounds_the_loop_s_to_4_places():
    a = account()
    assert a == {
        "detail": "full",
        "unprofiled_step_ms": 20.0,
        "unprofiled_steps": 12,
        "profiled_step_ms": 30.0,
        "profiler_distortion": 1.5,
        "profiler_distortion_se": 0.02,
        "unprofiled_step_ms_each": [19.0, 21.0],
        "unprofiled_drift": 1.01,
        "distortion_low": 1.4,
        "distortion_high": 1.6,
        "distortion_uncertain": None,
        "distortion_sentence": "profiled steps take 1.50x the unprofiled ones, give or take 0.02 (one standard error, "
        "from the spread of the profiled and the unprofiled steps); 95% interval 1.40 to 1.60 against the steps "
        "before and after the capture: the profiler slows the main process while the 4 DataLoader workers run "
        "unprofiled in their own processes, so each profiled step gives them more time to load and input waits "
        "the bench feels may not show in the trace (compare --profile-detail lean)",
        "queue_depth": 8,
        "queue": "4 workers x prefetch_factor 2",
        "run_label": "bench-1",
        "pauses_s": [0.1235, 2.0],
        "compute_s": [0.1235, None],
        "waits_seen_s": {"3": 0.0123},
        "headline_cycles": [1],
        "headline_clean": True,
        "headline_steps": [3, 4],
        "dumps": [{"cycle": 1, "seconds": 1.5, "before_step": 5}, {"cycle": 3, "seconds": None, "before_step": 9}],
    }
    bare = account(unprofiled=None, run_label=None)
    assert bare["unprofiled_steps"] is None and bare["run_label"] is None


def sentence(figures, **kw):
    return account({**FIGURES, **figures}, **kw)["distortion_sentence"]


def test_the_account_s_sentence_reads_the_capture_s_workers_input_and_the_figures():
    # no workers, the input on the device: the trace's CPU times are inflated
    assert sentence({}, workers=0, device_input=True).endswith(
        "against the steps before and after the capture: the trace's CPU times are inflated; the GPU's figures are not"
    )
    # no interval: the standard error and its degrees of freedom decide (1.15 within 4.30 x 0.05 of 1)
    close = {"profiler_distortion": 1.15, "profiler_distortion_se": 0.05, "distortion_low": None}
    assert sentence(close, workers=0) == (
        "profiled steps take 1.15x the unprofiled ones, give or take 0.05 (one standard error, from the spread of "
        "the profiled and the unprofiled steps): too uncertain to tell the profiler's cost from none"
    )
    # faster profiled steps with a refill: the unprofiled steps' spread is said
    faster = {"profiler_distortion": 0.8, "profiler_distortion_se": None, "distortion_low": None}
    assert sentence(faster, refilled_by=[{"steps": [3]}]) == (
        "profiled steps take 0.80x the unprofiled ones, which the profiler cannot cause: the DataLoader workers "
        "had batches queued during the profiler's pauses (see refilled_by), so the trace understates the input "
        "wait; the unprofiled step (unprofiled steps 19.0 to 21.0 ms) is the closer figure of the loader-bound pace"
    )
    assert sentence(faster, steady=None).endswith(
        "changed between the two timings, so the ratio says nothing of the profiler's cost here"
    )
    assert sentence({"profiler_distortion": None}) is None


def traced(num, pace_us, input_us):
    """A traced step read on the CPU's steps: the GPU idle through its input, busy the rest."""
    return step(
        num,
        pace_us,
        input_us,
        pace_us=pace_us,
        gpu_idle_us=input_us,
        input_gap_us=input_us,
        gpu_work_us=pace_us - input_us,
        gpu_span_us=pace_us,
    )


def evidence(steps, basis):
    total = lambda key: sum(s[key] for s in steps)  # noqa: E731
    window = {
        "steps": len(steps),
        "wall_us": total("wall_us"),
        "pace_us": total("pace_us"),
        "gpu_null_reason": None,
        "gpu_idle_us": total("gpu_idle_us"),
        "input_gap_us": total("input_gap_us"),
        "gpu_span_null_reason": None,
        "gpu_slots": len(steps),
        "gpu_work_us": total("gpu_work_us"),
        "gpu_span_per_step_us": total("pace_us") / len(steps),
        "gpu_span_per_step_null_reason": None,
        "gpu_slots_span_us": total("pace_us"),
        "gpu_slots_work_us": total("gpu_work_us"),
    }
    return {
        "window": window,
        "has_gpu": True,
        "cpu_runs_ahead": basis == "gpu_timeline",
        "idle_basis": basis,
        "input_source": {"name": NEXT_BATCH, "kind": "scope", "null_reason": None},
        "scope_set": SCOPES,
        "steps": steps,
    }


def loop(pauses, **over):
    capture = {"detail": "full", "pauses_s": pauses, "queue_depth": 2, "workers": 2, "device_input": False}
    capture.update(queue="2 workers x prefetch_factor 1", **over)
    return capture


def test_a_cpu_that_runs_ahead_drops_a_slow_first_unprofiled_step_and_the_waits_weigh_against_that_pace():
    """The unprofiled steps 20, 10, 10, 10 ms: the first is left out where the cycles read the GPU's timeline,
    so the pace is 10 ms and a wait is seen from 2.5 ms. Step 0 waits just under that, step 1 (4 ms) 2 ms."""
    unprofiled = {"steps": 4, "step_ms": 12.5, "step_ms_each": [20.0, 10.0, 10.0, 10.0]}
    capture = loop([0.0] * 4, unprofiled=unprofiled, steps_s=[0.01, 0.004], inputs_s=[0.0024999, 0.002])
    cycles = [{"cycle": 1, "profiler_steps": [2, 3]}]
    evidences = {1: evidence([traced(2, 11_000.0, 1000.0), traced(3, 13_000.0, 1000.0)], "gpu_timeline")}
    head, account, picked = distortion.capture_headline(capture, cycles, evidences)
    assert picked is None and cycles[0]["refilled_by"] == []
    assert head["unprofiled_step_ms"] == 10.0 and head["unprofiled_step_ms_range"] == [10.0, 10.0]
    assert head["profiler_distortion"] == pytest.approx(1.2)
    # ratio_se: the profiled steps 11 and 13 ms alone spread (var 2 over 2 steps, over 12 squared): one
    # degree of freedom
    assert head["profiler_distortion_se"] == pytest.approx(0.1) and head["profiler_distortion_df"] == pytest.approx(1.0)
    assert account["waits_seen_s"] == {} and account["headline_clean"] is True and account["headline_cycles"] == [1]


def test_without_a_pace_the_steps_after_a_pause_are_flagged_but_the_one_seen_waiting():
    """No unprofiled block: no pace, no ratio. Step 3 waits half its 10 ms: seen, so not served by the pause
    before step 1; steps 2 and 4 are, each put down to the longest pause since the last step that waited."""
    inputs = [0.0, 0.0, 0.0, 0.005, 0.0]
    capture = loop([0.0, 0.5, 0.0, 0.0, 0.0], steps_s=[0.01] * 5, inputs_s=inputs)
    cycles = [{"cycle": 1, "profiler_steps": [2, 4], "dump_before_step": None}]
    steps = [traced(2, 10_000.0, 0.0), traced(3, 10_000.0, 5000.0), traced(4, 10_000.0, 0.0)]
    head, account, picked = distortion.capture_headline(capture, cycles, {1: evidence(steps, "cpu_steps")})
    served = {"batches": 2, "dump": False, "what": "profiler.step()"}
    assert cycles[0]["refilled_by"] == [
        {"before_step": 1, "seconds": 0.5, "steps": [2], **served, "what": "the profiler's start"},
        {"before_step": 4, "seconds": 0.0, "steps": [4], **served},
    ]
    assert picked == [(1, steps[1])] and head["headline_steps"] == [3] and head["input_gap_share"] == 1.0
    assert head["profiler_distortion"] is None and head["unprofiled_step_ms"] is None
    assert account["waits_seen_s"] == {"3": 0.005} and account["headline_clean"] is False


def test_when_every_traced_step_was_served_the_input_figures_are_withheld_and_say_why():
    capture = loop([0.0, 0.5, 0.0, 0.0, 0.0], steps_s=[0.01] * 5, inputs_s=[0.0] * 5)
    cycles = [{"cycle": 1, "profiler_steps": [2, 4], "dump_before_step": None}]
    steps = [traced(2, 10_000.0, 0.0), traced(3, 10_000.0, 0.0), traced(4, 10_000.0, 0.0)]
    head, account, picked = distortion.capture_headline(capture, cycles, {1: evidence(steps, "cpu_steps")})
    assert picked == [] and cycles[0]["refilled_by"][0]["steps"] == [2, 3, 4]
    assert head["gpu_idle_share"] is None and head["input_gap_share"] is None
    assert head["null_reasons"]["input_wait"] == (
        "every traced step found its batch queued by a refill during a pause (see refilled_by per cycle), or no "
        "step was read on the CPU's steps: the trace may hide input waits the bench feels"
    )
    assert account["headline_clean"] is False and head["headline_steps"] is None


def test_a_headline_pooled_over_the_steps_no_refill_served_reads_their_spread_alone():
    """The loader's pace 10 ms, each loop step 5 ms of compute: without pauses each would wait. A 0.5 s pause
    before step 1 fills the queue of 2: steps 1 to 3 find their batch ready, 4 to 6 wait. The headline is
    pooled over steps 4 to 6 (5, 6 and 7 ms profiled); the ratio's standard error reads their spread alone."""
    unprofiled = {"steps": 4, "step_ms": 10.0, "step_ms_each": [10.0, 9.0, 11.0, 10.0]}
    capture = loop([0.0, 0.5] + [0.0] * 5, unprofiled=unprofiled, steps_s=[0.005] * 7, inputs_s=[0.0] * 7)
    cycles = [{"cycle": 1, "profiler_steps": [1, 6], "dump_before_step": None}]
    paces = [8.0, 8.0, 8.0, 5.0, 6.0, 7.0]
    steps = [traced(i, ms * 1e3, 0.0) for i, ms in enumerate(paces, 1)]
    head, account, picked = distortion.capture_headline(capture, cycles, {1: evidence(steps, "cpu_steps")})
    assert cycles[0]["refilled_by"][0]["steps"] == [1, 2, 3] and head["headline_steps"] == [4, 5, 6]
    assert head["profiled_step_ms"] == 6.0 and head["profiler_distortion"] == 0.6
    assert (head["profiler_distortion_se"], head["profiler_distortion_df"]) == distortion.ratio_se(
        0.6, [5.0, 6.0, 7.0], [10.0, 9.0, 11.0, 10.0]
    )
