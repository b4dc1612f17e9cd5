"""The headline figures and the verdict from evidence written out by hand: each expected figure is worked out
here from the figures given, each sentence checked word for word where its words are the rule."""

import pytest

from steplens.evidence import attribution, diagnosis
from steplens.scopes import EVAL_FORWARD, EVAL_SCOPES, EVAL_TO_DEVICE, NEXT_BATCH, PHASES, SAVE, SCOPES

OUTSIDE = attribution.OUTSIDE_SCOPES


def window(**over):
    """Two steps, 1000 us of pace each, the GPU idle 600 of them, 200 of which in the input gap."""
    w = {
        "steps": 2,
        "wall_us": 1800.0,
        "pace_us": 2000.0,
        "gpu_null_reason": None,
        "gpu_idle_us": 1200.0,
        "input_gap_us": 400.0,
        "gpu_span_null_reason": None,
        "gpu_slots": 1,
        "gpu_work_us": 900.0,
        "gpu_span_per_step_us": 1000.0,
        "gpu_span_per_step_null_reason": None,
        "gpu_slots_span_us": 1000.0,
        "gpu_slots_work_us": 450.0,
    }
    w.update(over)
    return w


def evidence(w=None, **over):
    ev = {
        "window": w if w is not None else window(),
        "has_gpu": True,
        "cpu_runs_ahead": False,
        "idle_basis": "cpu_steps",
        "input_source": {"name": NEXT_BATCH, "kind": "scope", "null_reason": None},
    }
    ev.update(over)
    return ev


def test_the_headline_of_one_gpu_trace():
    h = diagnosis.headline(evidence())
    assert h["profiled_step_ms"] == pytest.approx(1.0) and h["cpu_step_ms"] == pytest.approx(0.9)
    assert h["gpu_idle_share"] == pytest.approx(0.6) and h["input_gap_share"] == pytest.approx(400 / 1200)
    assert h["gpu_span_ms_per_step"] == pytest.approx(1.0) and h["gpu_work_ms_per_step"] == pytest.approx(0.45)
    assert h["cpu_runs_ahead"] is False and h["idle_basis"] == "cpu_steps" and h["null_reasons"] == {}
    assert h["kernel_classes"] is None and h["gpu_top_classes"] is None
    assert diagnosis.headline([evidence()]) == h, "one evidence or a list of one"


def test_the_headline_pools_windows_by_their_steps_and_slots():
    one = evidence()
    two = evidence(
        window(steps=3, wall_us=3300.0, pace_us=3600.0, gpu_idle_us=900.0, input_gap_us=0.0, gpu_slots=2),
        cpu_runs_ahead=True,
        idle_basis="gpu_timeline",
    )
    two["window"].update(gpu_slots_span_us=2400.0, gpu_slots_work_us=2000.0, gpu_work_us=2500.0)
    h = diagnosis.headline([one, two])
    assert h["profiled_step_ms"] == pytest.approx(5600 / 5 / 1e3) and h["cpu_step_ms"] == pytest.approx(5100 / 5e3)
    assert h["gpu_idle_share"] == pytest.approx(2100 / 5600) and h["input_gap_share"] == pytest.approx(400 / 2100)
    assert h["gpu_span_ms_per_step"] == pytest.approx(3400 / 3 / 1e3), "the complete slots' mean"
    assert h["gpu_work_ms_per_step"] == pytest.approx(3400 / 5 / 1e3), "over all steps"
    assert h["cpu_runs_ahead"] is True and h["idle_basis"] == "mixed"


def test_a_cpu_only_trace_has_no_gpu_figures_and_says_why():
    h = diagnosis.headline(evidence(has_gpu=False))
    assert h["null_reasons"] == {"gpu": attribution.NO_GPU}
    assert h["gpu_idle_share"] is h["input_gap_share"] is h["gpu_work_ms_per_step"] is None
    assert h["profiled_step_ms"] == pytest.approx(1.0), "the pace is still known"
    assert diagnosis.headline(evidence(window(pace_us=None), has_gpu=False))["profiled_step_ms"] is None


def test_gpu_null_reasons_are_given_once_each():
    a, b = evidence(window(gpu_null_reason="no kernels")), evidence(window(gpu_null_reason="no kernels"))
    c = evidence(window(gpu_null_reason="open slot"))
    h = diagnosis.headline([a, b, c])
    assert h["null_reasons"] == {"gpu": "no kernels; open slot"} and h["gpu_idle_share"] is None


def test_a_missing_input_figure_is_null_with_the_trace_s_reason_and_no_idle_gives_0():
    ev = evidence(window(input_gap_us=None))
    ev["input_source"] = {"name": None, "null_reason": "no --input-scope named 'x' in the trace"}
    h = diagnosis.headline(ev)
    assert h["input_gap_share"] is None and h["null_reasons"] == {"input_gap_share": ev["input_source"]["null_reason"]}
    assert h["gpu_idle_share"] == pytest.approx(0.6)
    assert diagnosis.headline(evidence(window(gpu_idle_us=0.0, input_gap_us=0.0)))["input_gap_share"] == 0.0
    no_source = evidence(window(input_gap_us=None), input_source=None)
    assert diagnosis.headline(no_source)["null_reasons"]["input_gap_share"] == attribution.NO_INPUT


def test_span_and_work_are_null_with_the_reason_where_the_slots_cannot_give_them():
    h = diagnosis.headline(evidence(window(gpu_span_null_reason="steps' GPU work overlaps")))
    assert h["gpu_span_ms_per_step"] is None and h["gpu_work_ms_per_step"] is None
    assert h["null_reasons"]["gpu_span_ms_per_step"] == h["null_reasons"]["gpu_work_ms_per_step"]
    assert h["null_reasons"]["gpu_work_ms_per_step"] == "steps' GPU work overlaps"
    over = diagnosis.headline(evidence(window(gpu_span_per_step_us=None, gpu_span_per_step_null_reason="crossed")))
    assert over["null_reasons"] == {"gpu_span_ms_per_step": "crossed", "gpu_work_ms_per_step": "crossed"}
    assert over["gpu_span_ms_per_step"] is None and over["gpu_work_ms_per_step"] is None
    none = diagnosis.headline(evidence(window(gpu_slots=0, gpu_span_per_step_null_reason="no complete slot")))
    assert none["null_reasons"] == {"gpu_span_ms_per_step": "no complete slot"}
    assert none["gpu_span_ms_per_step"] is None and none["gpu_work_ms_per_step"] == pytest.approx(0.45)


def test_work_beyond_its_span_is_refused_past_the_tolerance_only():
    eps = attribution.EPS_US
    fits = diagnosis.headline(evidence(window(gpu_slots_work_us=1000.0 + eps)))
    assert fits["gpu_work_ms_per_step"] == pytest.approx(0.45) and fits["null_reasons"] == {}
    over = diagnosis.headline(evidence(window(gpu_slots_work_us=1000.0 + 3 * eps)))
    assert over["gpu_work_ms_per_step"] is None and over["gpu_span_ms_per_step"] == pytest.approx(1.0)
    said = "GPU work per complete slot (1.000 ms) exceeds the GPU span per complete slot (1.000 ms)"
    assert over["null_reasons"] == {"gpu_work_ms_per_step": said}


def part(**over):
    """One window of a GPU trace: a 1000 us step, the GPU busy 300; it waits 400 in the input, 100 in each
    other scope after it, 50 outside them; 50 idle with work queued."""
    p = {
        "steps": 3,
        "wall_us": 900.0,
        "pace_us": 1000.0,
        "gpu_busy_us": 300.0,
        "gpu_idle_us": 700.0,
        "host_wait_us": 650.0,
        "gpu_null_reason": None,
        "input_gap_us": 400.0,
        "scopes_cpu_us": {
            NEXT_BATCH: 500.0,
            "input/to_device": 50.0,
            "train/forward_backward": 250.0,
            "train/optimizer": 60.0,
        },
        "waits_by_scope_us": {
            NEXT_BATCH: 400.0,
            "input/to_device": 100.0,
            "train/forward_backward": 100.0,
            "train/optimizer": 0.0,
        },
    }
    p.update(over)
    return p


def gpu_trace(p=None, source=NEXT_BATCH, scopes=SCOPES, **over):
    ev = {
        "has_gpu": True,
        "window": p if p is not None else part(),
        "scopes_present": list(scopes),
        "input_source": {"name": source, "null_reason": None if source else "no input source: the reason"},
    }
    ev.update(over)
    return ev


NEXT = {k: v[2] for k, v in diagnosis.STAGES.items()}


def test_the_largest_wait_holds_an_idle_gpu_and_the_sentence_says_it_word_for_word():
    v = diagnosis.verdict(gpu_trace())
    assert (v["stage"], v["part"], v["share"], v["runner_up"]) == ("waiting for input", "input", 0.4, None)
    assert v["next"] == NEXT["input"]
    assert v["sentence"] == (
        "The GPU idles for 70% of the step, and waiting for input is its largest wait: the GPU sits idle while "
        f"input/next_batch runs for 40% of the step (the input gap). Next: {NEXT['input']}."
    )


def test_the_shares_of_every_wait_add_up_to_the_step():
    """busy 300, input 400, to_device 100, forward_backward 100, optimizer 0, outside 50, queued 50: 1000."""
    shares, gap = diagnosis._gpu_shares([part(host_wait_us=650.0)], True)
    assert gap == 400.0 and shares == pytest.approx(
        {
            "busy": 0.3,
            "input": 0.4,
            "input/to_device": 0.1,
            "train/forward_backward": 0.1,
            "train/optimizer": 0.0,
            OUTSIDE: 0.05,
            "queued": 0.05,
        }
    )
    assert sum(shares.values()) == pytest.approx(1.0)
    comm, _ = diagnosis._gpu_shares([part(gpu_comm_only_us=100.0), part(gpu_comm_only_us=None)], False)
    assert comm == pytest.approx({"busy": 0.25, "communication": 0.05, "input": 0.4, OUTSIDE: 0.25, "queued": 0.05})
    none, gap = diagnosis._gpu_shares([part(input_gap_us=None, host_wait_us=600.0, gpu_idle_us=500.0)], False)
    assert gap is None and none == pytest.approx({"busy": 0.3, OUTSIDE: 0.6, "queued": 0.0}), "never below 0"


def test_a_busy_gpu_names_its_largest_wait_only_from_the_window_on():
    busy = part(gpu_busy_us=600.0, gpu_idle_us=400.0, host_wait_us=400.0, input_gap_us=100.0)
    busy["waits_by_scope_us"] = {NEXT_BATCH: 100.0, "input/to_device": 0.0, "train/forward_backward": 300.0}
    v = diagnosis.verdict(gpu_trace(busy))
    assert (v["stage"], v["share"], v["runner_up"]) == ("GPU compute", 0.6, None)
    assert v["sentence"] == (
        "GPU compute holds the step: the GPU is busy for 60% of the step; its largest wait is host-side launch "
        f"overhead (30%). Next: {NEXT['busy']}."
    )
    small = dict(busy, gpu_busy_us=910.0, gpu_idle_us=90.0, host_wait_us=90.0, input_gap_us=0.0)
    small["waits_by_scope_us"] = {NEXT_BATCH: 0.0, "train/forward_backward": 90.0}
    assert diagnosis.verdict(gpu_trace(small))["sentence"] == (
        f"GPU compute holds the step: the GPU is busy for 91% of the step. Next: {NEXT['busy']}."
    )
    edge = dict(small, gpu_busy_us=900.0, gpu_idle_us=100.0, host_wait_us=100.0)
    edge["waits_by_scope_us"] = {NEXT_BATCH: 0.0, "train/forward_backward": 100.0}
    assert "its largest wait is host-side launch overhead (10%)" in diagnosis.verdict(gpu_trace(edge))["sentence"]


def test_half_the_step_busy_is_gpu_compute_and_just_under_is_not():
    at = part(gpu_busy_us=500.0, gpu_idle_us=500.0, host_wait_us=500.0, input_gap_us=500.0)
    at["waits_by_scope_us"] = {NEXT_BATCH: 500.0}
    assert diagnosis.verdict(gpu_trace(at))["stage"] == "GPU compute"
    under = dict(at, gpu_busy_us=499.0, gpu_idle_us=501.0, host_wait_us=501.0, input_gap_us=501.0)
    assert diagnosis.verdict(gpu_trace(under))["stage"] == "waiting for input"


def test_a_runner_up_is_named_only_with_a_share_above_0():
    tiny = part(gpu_busy_us=400.0, gpu_idle_us=600.0, host_wait_us=600.0, input_gap_us=0.0)
    tiny["waits_by_scope_us"] = {NEXT_BATCH: 0.0, "train/optimizer": 0.0}
    v = diagnosis.verdict(gpu_trace(tiny, scopes=()))
    assert v["stage"] is None and v["sentence"] == (
        "Cannot tell which stage holds the step: the GPU sits idle waiting for the host for 60% of it outside the "
        "input, and the trace labels none of the step's stages, so it cannot say for what (wrap them in "
        "torch.profiler.record_function: input/next_batch, input/to_device, train/forward_backward, train/optimizer)."
    ), "outside the scopes with no scopes: cannot say for what"
    lone = part(gpu_busy_us=450.0, gpu_idle_us=550.0, host_wait_us=0.0, input_gap_us=0.0)
    lone["waits_by_scope_us"] = {}
    v = diagnosis.verdict(gpu_trace(lone))
    assert v["stage"] == "GPU-side gaps" and v["share"] == pytest.approx(0.55) and v["runner_up"] is None
    near = part(gpu_busy_us=400.0, gpu_idle_us=600.0, host_wait_us=600.0, input_gap_us=300.0)
    near["waits_by_scope_us"] = {NEXT_BATCH: 300.0, "input/to_device": 250.0}
    v = diagnosis.verdict(gpu_trace(near))
    assert v["runner_up"] == {"stage": "copying input to the GPU", "part": "input/to_device", "share": 0.25}
    assert "closely followed by copying input to the GPU (25%). Next:" in v["sentence"]


def test_the_input_source_is_named_and_a_missing_one_said():
    v = diagnosis.verdict(gpu_trace(source="enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"))
    assert "while the input (enumerate(DataLoader)" in v["sentence"]
    assert v["sentence"].endswith(
        " The input is read from enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__."
    )
    none = gpu_trace(part(input_gap_us=None), source=None)
    v = diagnosis.verdict(none)
    assert v["sentence"].endswith(" No input figure: no input source: the reason.")
    assert v["part"] == OUTSIDE and v["share"] == pytest.approx(0.45), "without a gap, the input wait is outside"


def test_steps_count_one_per_part_without_a_count():
    one = {k: v for k, v in part().items() if k != "steps"}
    v = diagnosis.verdict(gpu_trace(), parts=[one])
    assert v["stage"] == "waiting for input" and v["one_step"], "one step: read, and marked as one"
    assert v["sentence"].startswith("One profiled step, so no pattern across steps is claimed. ")
    assert diagnosis.verdict(gpu_trace(), parts=[one, dict(one)])["stage"] == "waiting for input"
    assert diagnosis.verdict(gpu_trace(part(steps=2)))["stage"] == "waiting for input"
    assert diagnosis.verdict([gpu_trace(), gpu_trace()])["share"] == pytest.approx(0.4), "two traces pooled"


def test_a_part_without_its_idle_figure_or_pace_gives_no_stage():
    for broken in (part(gpu_idle_us=None, gpu_null_reason="no kernels"), part(pace_us=0.0, gpu_null_reason="empty")):
        v = diagnosis.verdict(gpu_trace(), parts=[part(), broken])
        assert v["stage"] is None and v["sentence"].startswith("Cannot tell which stage holds the step: ")
    v = diagnosis.verdict(gpu_trace(), parts=[part(gpu_idle_us=None), part(gpu_idle_us=None)])
    assert v["sentence"] == "Cannot tell which stage holds the step: None."


def cpu_trace(scopes_cpu, wall=1000.0, scopes=SCOPES, source=NEXT_BATCH, **over):
    p = {"steps": 2, "wall_us": wall, "scopes_cpu_us": scopes_cpu, **over}
    return {
        "has_gpu": False,
        "window": p,
        "scopes_present": list(scopes),
        "input_source": {"name": source, "null_reason": None if source else "no loader in the trace"},
    }


def test_a_cpu_only_trace_is_held_by_its_largest_cpu_part():
    four = {NEXT_BATCH: 100.0, "input/to_device": 50.0, "train/forward_backward": 600.0, "train/optimizer": 200.0}
    v = diagnosis.verdict(cpu_trace(four))
    assert (v["stage"], v["part"], v["share"]) == ("CPU compute (forward and backward)", "train/forward_backward", 0.6)
    assert v["next"] == "profile on a GPU to see what the GPU would do" and v["runner_up"] is None
    assert v["sentence"] == (
        "CPU compute (forward and backward) holds the step: train/forward_backward takes 60% of the step's CPU time "
        "(a CPU-only trace has no GPU tracks: it cannot tell whether a GPU would wait). "
        "Next: profile on a GPU to see what the GPU would do."
    )
    slow_input = dict(four, **{NEXT_BATCH: 700.0})
    v = diagnosis.verdict(cpu_trace(slow_input))
    assert v["sentence"].startswith("Waiting for input holds the step: input/next_batch takes 70% of")
    v = diagnosis.verdict(cpu_trace(four, input_cpu_us=800.0))
    assert v["part"] == "input" and v["share"] == pytest.approx(0.8), "the input source's own time first"


def test_a_cpu_only_trace_without_the_scopes_weighs_its_input_against_the_rest():
    v = diagnosis.verdict(cpu_trace({n: None for n in SCOPES}, scopes=(), input_cpu_us=300.0, source="loader"))
    assert (v["part"], v["share"]) == (OUTSIDE, pytest.approx(0.7))
    assert v["sentence"].startswith("CPU work outside the input holds the step: the rest of the step takes 70%")
    v = diagnosis.verdict(cpu_trace({n: None for n in SCOPES}, scopes=(), input_cpu_us=800.0, source="loader"))
    assert v["sentence"].startswith("Waiting for input holds the step: the input (loader) takes 80%")
    v = diagnosis.verdict(cpu_trace({n: None for n in SCOPES}, scopes=(), source=None))
    assert v["stage"] is None and v["sentence"] == (
        "Cannot tell: a CPU-only trace without record_function scopes or an input source shows neither GPU tracks "
        "nor where the CPU's time goes (no loader in the trace)."
    )
    partial = cpu_trace(
        {NEXT_BATCH: 100.0, "input/to_device": None, "train/forward_backward": 900.0, "train/optimizer": 0.0}
    )
    v = diagnosis.verdict(partial)
    assert (v["part"], v["share"]) == ("train/forward_backward", 0.9), "a scope without a figure is left out"


def test_sum_known_and_the_reason_for_no_input():
    assert diagnosis.sum_known([{"a": 1.0}, {"a": 2.5}], lambda p: p["a"]) == 3.5
    assert diagnosis.sum_known([{"a": 1.0}, {"a": None}], lambda p: p["a"]) is None
    assert diagnosis.sum_known([], lambda p: p["a"]) == 0
    evs = [{"input_source": {"null_reason": "x"}}, {"input_source": {"null_reason": "x"}}, {"input_source": None}]
    assert diagnosis.no_input_reason(evs) == "x; " + attribution.NO_INPUT


HEADLINE_KEYS = {
    "profiled_step_ms",
    "gpu_idle_share",
    "input_gap_share",
    "gpu_work_ms_per_step",
    "gpu_span_ms_per_step",
    "cpu_step_ms",
    "cpu_runs_ahead",
    "null_reasons",
    "idle_basis",
    "kernel_classes",
    "gpu_top_classes",
}


def test_the_headline_has_its_keys_and_pools_the_kernel_classes_by_step():
    classes = {"busy_us": 1000.0, "classes": {"convolution forward": {"us": 600.0}, "optimizer": {"us": 400.0}}}
    h = diagnosis.headline(evidence(window(kernel_classes=classes)))
    assert set(h) == HEADLINE_KEYS
    assert h["kernel_classes"] == {
        "convolution forward": {"ms_per_step": pytest.approx(0.3), "share": pytest.approx(0.6)},
        "optimizer": {"ms_per_step": pytest.approx(0.2), "share": pytest.approx(0.4)},
    }
    assert set(diagnosis.headline(evidence(has_gpu=False))) == HEADLINE_KEYS


def test_a_zero_pace_gives_no_idle_share_and_reasons_are_joined_once_each():
    assert diagnosis.headline(evidence(window(pace_us=0.0, gpu_idle_us=0.0)))["gpu_idle_share"] is None
    two = [evidence(window(gpu_span_null_reason="a")), evidence(window(gpu_span_null_reason="b"))]
    assert diagnosis.headline(two)["null_reasons"]["gpu_work_ms_per_step"] == "a; b"
    crossed = [evidence(window(gpu_span_per_step_us=None, gpu_span_per_step_null_reason=r)) for r in ("a", "b", "a")]
    assert diagnosis.headline(crossed)["null_reasons"]["gpu_span_ms_per_step"] == "a; b"
    empty = [evidence(window(gpu_slots=0, gpu_span_per_step_null_reason=r)) for r in ("a", "b")]
    assert diagnosis.headline(empty)["null_reasons"] == {"gpu_span_ms_per_step": "a; b"}


def test_a_verdict_that_cannot_be_given_has_every_key_null():
    v = diagnosis.verdict(gpu_trace(part(steps=0)))
    assert v == {
        "stage": None,
        "part": None,
        "share": None,
        "runner_up": None,
        "next": None,
        "sentence": "Too short to tell: no profiled step.",
    }
    v = diagnosis.verdict(gpu_trace(), parts=[part(gpu_idle_us=None, gpu_null_reason="a"), part(gpu_idle_us=None)])
    assert v["sentence"] == "Cannot tell which stage holds the step: a; None." and v["next"] is None


def test_a_runner_up_exactly_at_the_window_is_named_and_a_busy_gpu_never_has_one():
    """Shares in tenths, exact in binary at this difference: input 0.2, the next wait 0.1 (0.2 - 0.1 == 0.1)."""
    edge = part(pace_us=10.0, gpu_busy_us=4.0, gpu_idle_us=6.0, host_wait_us=5.0, input_gap_us=2.0)
    edge["waits_by_scope_us"] = {NEXT_BATCH: 2.0, "input/to_device": 1.0, "train/forward_backward": 1.0}
    assert 0.2 - 0.1 == diagnosis.CLOSE
    v = diagnosis.verdict(gpu_trace(edge))
    assert v["part"] == "input" and v["runner_up"] is not None and v["runner_up"]["share"] == pytest.approx(0.1)
    busy = part(gpu_busy_us=500.0, gpu_idle_us=500.0, host_wait_us=450.0, input_gap_us=450.0)  # 0.05 behind
    busy["waits_by_scope_us"] = {NEXT_BATCH: 450.0}
    v = diagnosis.verdict(gpu_trace(busy))
    assert v["stage"] == "GPU compute" and v["runner_up"] is None and "closely followed" not in v["sentence"]
    assert v["next"] == NEXT["busy"]


def test_a_close_runner_up_sentence_word_for_word():
    near = part(gpu_busy_us=400.0, gpu_idle_us=600.0, host_wait_us=600.0, input_gap_us=300.0)
    near["waits_by_scope_us"] = {NEXT_BATCH: 300.0, "input/to_device": 250.0}
    assert diagnosis.verdict(gpu_trace(near))["sentence"] == (
        "The GPU idles for 60% of the step, and waiting for input is its largest wait: the GPU sits idle while "
        "input/next_batch runs for 30% of the step (the input gap), closely followed by copying input to the GPU "
        f"(25%). Next: {NEXT['input']}."
    )


def test_communication_is_no_idle_time_in_the_sentence():
    """Busy 400 of 1000, 200 of them communication alone: compute 20%, idle 60% (1 - 0.2 - 0.2)."""
    comm = part(gpu_busy_us=400.0, gpu_comm_only_us=200.0, gpu_idle_us=600.0, host_wait_us=600.0, input_gap_us=600.0)
    comm["waits_by_scope_us"] = {NEXT_BATCH: 600.0}
    v = diagnosis.verdict(gpu_trace(comm))
    assert v["part"] == "input" and v["sentence"].startswith("The GPU idles for 60% of the step, and waiting")


def test_a_scope_missing_from_the_waits_waits_0_and_nothing_outside_is_0():
    exact = part(host_wait_us=600.0)  # 400 + 100 + 100 + 0: nothing outside the scopes
    exact["waits_by_scope_us"] = {NEXT_BATCH: 400.0, "input/to_device": 100.0, "train/forward_backward": 100.0}
    shares, _ = diagnosis._gpu_shares([exact], True)
    assert shares["train/optimizer"] == 0.0 and shares[OUTSIDE] == 0.0 and shares["queued"] == pytest.approx(0.1)


def test_two_traces_with_different_input_sources_name_none():
    v = diagnosis.verdict([gpu_trace(source="loader-a"), gpu_trace(source="loader-b")])
    assert "while input/next_batch runs" in v["sentence"] and "read from" not in v["sentence"]


def test_a_trace_without_the_scopes_still_names_its_input_wait_and_a_missing_scope_list_means_all_four():
    bare = part(host_wait_us=650.0)
    v = diagnosis.verdict(gpu_trace(bare, scopes=()))
    assert v["stage"] == "waiting for input" and v["share"] == pytest.approx(0.4)
    unlisted = gpu_trace()
    del unlisted["scopes_present"]
    assert diagnosis.verdict(unlisted)["share"] == pytest.approx(0.4)
    shares, _ = diagnosis._gpu_shares([bare], False)
    assert OUTSIDE in shares and "train/optimizer" not in shares


def test_a_missing_input_figure_ends_the_full_sentence():
    v = diagnosis.verdict(gpu_trace(part(input_gap_us=None), source=None))
    assert v["sentence"].startswith(
        "The GPU idles for 70% of the step, and host work outside the four scopes is its largest wait"
    )
    assert v["sentence"].endswith(". No input figure: no input source: the reason.")


# The next steps written out word for word (not read from diagnosis), so that a changed word is seen.
SAVE_ADVICE = (
    "save less often (--checkpoint-every), or copy the state to host memory and write the file from a "
    "background thread, then measure the save with mode=bench"
)
MEASURE_BY_HAND = "then time the change without the profiler, a few runs each way"
LOADER_ADVICE = (
    "more DataLoader worker processes (num_workers) within the job's CPUs, or a cheaper transform, " + MEASURE_BY_HAND
)
NO_LOADER_ADVICE = (
    "prepare the next batch while the step runs (a DataLoader with worker processes, or a background thread), "
    "or make it cheaper, " + MEASURE_BY_HAND
)
CPU_ONLY = "(a CPU-only trace has no GPU tracks: it cannot tell whether a GPU would wait)"


def test_a_damaged_trace_withholds_the_verdict_and_names_each_damage():
    hurt = [gpu_trace(damage_withheld="steps cut"), gpu_trace(damage_withheld=None), gpu_trace(damage_withheld="x")]
    assert diagnosis.verdict(hurt) == {
        "stage": None,
        "part": None,
        "share": None,
        "runner_up": None,
        "next": None,
        "sentence": "Withheld: the trace is damaged where the verdict reads it (steps cut; x), so its figures may "
        "be wrong. Export the trace again, or repair it.",
    }
    assert diagnosis.verdict(gpu_trace(damage_withheld=None))["stage"] == "waiting for input"


def test_the_scopes_a_verdict_reads_are_the_traces_own_set_when_they_agree():
    checkpoint = list(PHASES["checkpoint"])  # as it is stored in the evidence's JSON
    assert diagnosis.scope_names([{"scope_set": checkpoint}]) == SCOPES + (SAVE,)
    assert diagnosis.scope_names([{"scope_set": list(EVAL_SCOPES)}, {"scope_set": list(EVAL_SCOPES)}]) == EVAL_SCOPES
    assert diagnosis.scope_names([{"scope_set": list(EVAL_SCOPES)}, {"scope_set": checkpoint}]) == SCOPES
    assert diagnosis.scope_names([{"scope_set": None}, {}]) == SCOPES
    assert diagnosis.scope_names([{"scope_set": list(EVAL_SCOPES)}, {}]) == SCOPES, "an old trace reads as training"


def saving(saves, trace, scopes=PHASES["checkpoint"]):
    """A checkpoint-phase GPU window: a 1000 us step, busy 300; the GPU waits 100 in the input, 50 in
    train/forward_backward, 450 in checkpoint/save, 50 outside the scopes; 50 idle with work queued."""
    p = part(host_wait_us=650.0, input_gap_us=100.0)
    p["scopes_cpu_us"] = dict(p["scopes_cpu_us"], **{SAVE: 300.0})
    p["waits_by_scope_us"] = {
        NEXT_BATCH: 100.0,
        "input/to_device": 0.0,
        "train/forward_backward": 50.0,
        "train/optimizer": 0.0,
        SAVE: 450.0,
    }
    return gpu_trace(p, scopes=scopes, scope_set=list(scopes), saves=saves, trace=trace)


def test_a_gpu_trace_held_by_its_saves_names_the_longest_save_word_for_word():
    """Three traces of one window each (the shares are those of one): save 45%, input 10%, the rest 5% or 0.
    The longest save is trace b's second: 150000 us, 120000 us of it with the GPU idle, 45.6% of its step."""
    a = saving([{"step": 3, "save_us": 90000.0, "share_of_step": 0.5, "gpu_idle_us": 80000.0}], "a.json")
    longest = {"step": 7, "save_us": 150000.0, "share_of_step": 0.456, "gpu_idle_us": 120000.0}
    b = saving([{"step": 5, "save_us": 1000.0, "share_of_step": 0.1, "gpu_idle_us": 0.0}, longest], "b.json")
    b["window"]["steps"] = 2
    c = saving(None, "c.json")
    v = diagnosis.verdict([a, b, c])
    assert (v["stage"], v["part"], v["share"], v["runner_up"]) == ("saving a checkpoint", SAVE, 0.45, None)
    assert v["next"] == SAVE_ADVICE
    assert v["save"] == {**longest, "trace": "b.json"}
    assert v["sentence"] == (
        "The GPU idles for 70% of the step, and saving a checkpoint is its largest wait: the GPU sits idle while "
        f"checkpoint/save runs for 45% of the step. Next: {SAVE_ADVICE}. The longest save, in ProfilerStep#7, "
        "took 150.0 ms, 46% of that step; the GPU sat idle for 120.0 ms of it."
    )
    without = diagnosis.verdict(saving(None, "c.json"))
    assert without["part"] == SAVE and without["save"] is None
    assert without["sentence"].endswith(f"Next: {SAVE_ADVICE}."), "no save found: nothing added"


def test_the_longest_save_sentence_word_for_word():
    assert diagnosis.save_sentence(None) == ""
    full = {"step": 12, "save_us": 150000.0, "share_of_step": 0.456, "gpu_idle_us": 120000.0}
    assert diagnosis.save_sentence(full) == (
        " The longest save, in ProfilerStep#12, took 150.0 ms, 46% of that step; the GPU sat idle for 120.0 ms of it."
    )
    bare = {"step": None, "save_us": 2500.0, "share_of_step": None, "gpu_idle_us": None}
    assert diagnosis.save_sentence(bare) == (
        " The longest save, in no profiled step, took 2.5 ms; no GPU figure (a CPU-only trace)."
    )
    assert diagnosis.longest_save([{"trace": "t", "saves": []}, {"trace": "u"}]) is None


def test_a_cpu_only_trace_held_by_its_saves_names_a_close_runner_up_by_its_value():
    """save 400 of a 1000 us step, forward_backward 350 (5% behind), the optimizer 200: the runner-up is the
    largest other part, not the last one by name."""
    cpu = {NEXT_BATCH: 30.0, "input/to_device": 10.0, "train/forward_backward": 350.0, "train/optimizer": 200.0}
    ev = cpu_trace(dict(cpu, **{SAVE: 400.0}), scopes=PHASES["checkpoint"])
    ev.update(scope_set=list(PHASES["checkpoint"]), trace="cpu.json")
    ev["saves"] = [{"step": None, "save_us": 150000.0, "share_of_step": None, "gpu_idle_us": None}]
    v = diagnosis.verdict(ev)
    assert (v["stage"], v["part"], v["share"], v["next"]) == ("saving a checkpoint", SAVE, 0.4, SAVE_ADVICE)
    assert v["runner_up"] == {
        "stage": "CPU compute (forward and backward)",
        "part": "train/forward_backward",
        "share": 0.35,
    }
    assert v["sentence"] == (
        "Saving a checkpoint holds the step: checkpoint/save takes 40% of the step's CPU time, closely followed by "
        f"train/forward_backward (35%) {CPU_ONLY}. Next: {SAVE_ADVICE}. The longest save, in no profiled step, "
        "took 150.0 ms; no GPU figure (a CPU-only trace)."
    )


def test_a_cpu_runner_up_exactly_ten_percent_behind_is_named_by_the_input_s_own_name():
    """A 10 us step: forward_backward 2 us, the input 1 us: (2 - 1) / 10 is CLOSE exactly in binary."""
    assert (2.0 - 1.0) / 10.0 == diagnosis.CLOSE
    cpu = {NEXT_BATCH: 1.0, "input/to_device": 0.5, "train/forward_backward": 2.0, "train/optimizer": 0.0}
    v = diagnosis.verdict(cpu_trace(cpu, wall=10.0))
    assert v["runner_up"] == {"stage": "waiting for input", "part": "input", "share": 0.1}
    assert v["sentence"] == (
        "CPU compute (forward and backward) holds the step: train/forward_backward takes 20% of the step's CPU "
        f"time, closely followed by input/next_batch (10%) {CPU_ONLY}. "
        "Next: profile on a GPU to see what the GPU would do."
    )


def test_a_cpu_runner_up_needs_a_share_above_0_and_a_lone_part_has_none():
    """The input 50 of a 1000 us step: a part of 0.5 us is within the window and named, parts of 0 are not."""
    tiny = {NEXT_BATCH: 50.0, "input/to_device": 0.0, "train/forward_backward": 0.5, "train/optimizer": 0.0}
    v = diagnosis.verdict(cpu_trace(tiny))
    assert v["runner_up"] == {
        "stage": "CPU compute (forward and backward)",
        "part": "train/forward_backward",
        "share": 0.0005,
    }
    zero = dict(tiny, **{"train/forward_backward": 0.0})
    v = diagnosis.verdict(cpu_trace(zero))
    assert (v["part"], v["share"], v["runner_up"]) == ("input", 0.05, None)
    lone = {NEXT_BATCH: 300.0, "input/to_device": None, "train/forward_backward": None, "train/optimizer": None}
    v = diagnosis.verdict(cpu_trace(lone))
    assert (v["part"], v["runner_up"]) == ("input", None)
    assert v["sentence"] == (
        f"Waiting for input holds the step: input/next_batch takes 30% of the step's CPU time {CPU_ONLY}. "
        "Next: more DataLoader workers within the job's CPUs (--workers 4; -P workers=4 on Polyaxon), then "
        "measure with mode=bench."
    )


def other_loop_input(loader):
    """The input_source of a loop without the four scopes: the loader seen, not seen, or not said (None)."""
    src = {"name": "my/fetch", "kind": "--input-scope", "null_reason": None}
    return src if loader is None else dict(src, dataloader_in_trace=loader)


@pytest.mark.parametrize("loader,advice", [(None, LOADER_ADVICE), (True, LOADER_ADVICE), (False, NO_LOADER_ADVICE)])
def test_a_cpu_only_trace_of_another_loop_gets_advice_without_flags(loader, advice):
    """No scopes: the input 600 of a 1000 us step against the rest 400 (20% behind: no runner-up)."""
    ev = cpu_trace({n: None for n in SCOPES}, scopes=(), input_cpu_us=600.0)
    ev["input_source"] = other_loop_input(loader)
    v = diagnosis.verdict(ev)
    assert (v["part"], v["share"], v["runner_up"], v["next"]) == ("input", 0.6, None, advice)
    assert v["sentence"] == (
        f"Waiting for input holds the step: the input (my/fetch) takes 60% of the step's CPU time {CPU_ONLY}. "
        f"Next: {advice}."
    )
    ev["window"]["input_cpu_us"] = 300.0
    rest = diagnosis.verdict(ev)
    assert (rest["part"], rest["next"]) == (OUTSIDE, "look in the trace at what the CPU runs between the scopes")


@pytest.mark.parametrize("loader,advice", [(None, LOADER_ADVICE), (True, LOADER_ADVICE), (False, NO_LOADER_ADVICE)])
def test_a_gpu_trace_of_another_loop_gets_advice_without_flags(loader, advice):
    """No scopes: busy 30%, the input gap 40%, the rest of the host's waits 25%, queued 5%."""
    ev = gpu_trace(part(), scopes=())
    ev["input_source"] = other_loop_input(loader)
    v = diagnosis.verdict(ev)
    assert (v["part"], v["share"], v["runner_up"], v["next"]) == ("input", 0.4, None, advice)
    assert v["sentence"] == (
        "The GPU idles for 70% of the step, and waiting for input is its largest wait: the GPU sits idle while the "
        f"input (my/fetch) runs for 40% of the step (the input gap). Next: {advice}. The input is read from my/fetch."
    )
    two = [dict(ev, input_source=other_loop_input(False)), dict(ev, input_source=other_loop_input(loader))]
    assert diagnosis.verdict(two)["next"] == advice, "a loader seen in any trace counts"


def test_the_advice_for_another_loop_never_names_a_flag():
    """Parts with an advice of their own; then the parts whose companion advice names a flag of train.py."""
    assert diagnosis._foreign_next("busy", False) == (
        "make the GPU's work cheaper or larger (bf16 autocast, channels_last, torch.compile, a larger batch), "
        + MEASURE_BY_HAND
    )
    assert diagnosis._foreign_next("input", True) == LOADER_ADVICE
    assert diagnosis._foreign_next("input", False) == NO_LOADER_ADVICE
    assert diagnosis._foreign_next(OUTSIDE, True) == "look in the trace at what the CPU runs between the scopes"
    assert diagnosis._foreign_next("queued", True) == "look for synchronizations in the trace (the sync calls row)"
    assert diagnosis._foreign_next(EVAL_TO_DEVICE, True) == (
        "pinned memory and a non-blocking copy of each held-out batch, then measure with mode=bench"
    )
    flagged = ("input/to_device", "train/forward_backward", "train/optimizer", EVAL_FORWARD, SAVE)
    for part_name in flagged:
        assert diagnosis._foreign_next(part_name, True) == "add the four scopes to the loop to tell it apart"
    for part_name in diagnosis.STAGES:
        assert "--" not in diagnosis._foreign_next(part_name, True), part_name
