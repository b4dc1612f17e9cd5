"""The delay verdict (a GPU trace without the scopes) on figures written out by hand: its sentence word for word at
each of its edges (GPU compute at exactly half the step, a largest wait exactly CLOSE, copies at exactly 1% of the
step, a runner-up exactly CLOSE behind), the pace per step its line reads, and the shares of classes a part lacks."""

import pytest

from steplens.evidence import delays, diagnosis
from steplens.scopes import NEXT_BATCH

MEASURE = "then time the change without the profiler, a few runs each way"
NO_SOURCE = (
    " The trace shows no input source (no DataLoader, no --input-scope): a wait for input would read as host work."
)


def window(delays_us, pace=2000.0, steps=2, busy=0.0, details=None, gap=0.0):
    """A window of a loop without the scopes: its delays (µs over the window), the GPU busy `busy` µs of it."""
    return {
        "steps": steps,
        "wall_us": pace,
        "pace_us": pace,
        "gpu_null_reason": None,
        "gpu_busy_us": busy,
        "gpu_idle_us": pace - busy,
        "input_gap_us": gap,
        "scopes_cpu_us": {NEXT_BATCH: 0.0},
        "delays_us": delays_us,
        "delay_details": details or {},
    }


def trace(w, reason=None, **over):
    ev = {"has_gpu": True, "window": w, "scopes_present": [], "input_source": {"name": None, "null_reason": reason}}
    ev.update(over)
    return ev


def test_gpu_compute_at_exactly_half_the_step_holds_it_and_names_a_largest_wait_of_exactly_close():
    d = {"compute": 1000.0, "input": 200.0, "copy": 200.0, "launch": 200.0, "sync": 200.0, "host": 200.0}
    v = diagnosis.verdict(trace(window(d, busy=1000.0)))
    assert v == {
        "stage": "GPU compute",
        "part": "compute",
        "share": 0.5,
        "runner_up": None,
        "next": f"{delays.FIXES['compute']}, {MEASURE}",
        "delays": {c: d.get(c, 0.0) / 2000 for c in delays.CLASSES},
        "sentence": "GPU compute holds the step (50% of it); its largest wait is waiting for input (10%). Next: "
        f"{delays.FIXES['compute']}, {MEASURE}.",
    }
    below = {"compute": 1200.0, "input": 160.0, "copy": 160.0, "launch": 160.0, "sync": 160.0, "host": 160.0}
    assert "its largest wait" not in diagnosis.verdict(trace(window(below, busy=1000.0)))["sentence"]


def test_copies_of_exactly_1_percent_of_the_step_are_said_and_a_typo_d_input_scope_names_itself():
    """The GPU only copies, 20 µs of 2000: 1% of the step busy with no kernel beside it."""
    reason = "--input-scope data/nxt matched no slice"
    v = diagnosis.verdict(trace(window({"copy": 1200.0, "host": 800.0}, busy=20.0, gap=None), reason=reason))
    assert (v["part"], v["share"], v["runner_up"]) == ("copy", 0.6, None)
    assert v["sentence"] == (
        "The GPU idles for 99% of the step and copies for 1% of it; copying input to the GPU holds the step (60% of "
        f"it). Next: {delays.FIXES['copy']}, {MEASURE}. The trace shows no input source ({reason}): a wait for input "
        "would read as host work."
    )


def test_the_copies_said_leave_out_the_communication_kernels_busy_time():
    d = {"compute": 600.0, "communication": 200.0, "copy": 1000.0, "input": 200.0}
    v = diagnosis.verdict(trace(window(d, busy=900.0)))  # busy 45%: 30% compute, 10% communication, 5% copying
    assert v["sentence"] == (
        "The GPU idles for 55% of the step and copies for 5% of it; copying input to the GPU holds the step (50% of "
        f"it). Next: {delays.FIXES['copy']}, {MEASURE}."
    )


def test_a_runner_up_exactly_close_behind_is_named_and_the_line_reads_the_pace_per_step():
    d = {"compute": 900.0, "input": 500.0, "launch": 300.0, "host": 300.0}  # input 25%, launch and host 15%
    v = diagnosis.verdict(trace(window(d, busy=900.0, details={"input": {}})))
    assert v["runner_up"] == {"stage": "host-side launch overhead", "part": "launch", "share": 0.15}
    assert v["sentence"] == (
        "The GPU idles for 55% of the step; waiting for input holds the step (25% of it), closely followed by "
        "host-side launch overhead (15%): the main thread is inside the input while the GPU idles, 0.25 ms a step. "
        f"Next: {delays.FIXES['input']}, {MEASURE}."
    )
    # one step of 2000 µs: 0.50 ms of it in the input
    one = diagnosis.verdict(trace(window(d, steps=1, busy=900.0, details={"input": {}})))
    assert one["one_step"] is True and "idles, 0.50 ms a step. Next:" in one["sentence"]


def test_a_trace_read_as_one_window_is_marked_one_step():
    d = {"compute": 600.0, "input": 1400.0}
    v = diagnosis.verdict(trace(window(d, busy=600.0), window_only=True))
    assert v["one_step"] is True
    assert v["sentence"].startswith("Read as one window (the trace has no steps), so no pattern across steps is")


def test_a_class_a_part_lacks_has_a_share_of_0():
    parts = [window({"input": 500.0}, pace=1000.0), window({"compute": 500.0}, pace=1000.0)]
    assert diagnosis.delay_shares(parts) == {c: {"input": 0.25, "compute": 0.25}.get(c, 0.0) for c in delays.CLASSES}
    assert diagnosis.delay_shares([window({}, pace=1000.0)]) is None
    assert diagnosis.delay_shares([]) is None


@pytest.mark.parametrize("reason", [None, diagnosis.NO_INPUT])
def test_no_input_figure_says_the_trace_shows_no_input_source(reason):
    v = diagnosis.verdict(trace(window({"compute": 1200.0, "input": 800.0}, busy=1200.0, gap=None), reason=reason))
    assert v["sentence"].endswith(f"{MEASURE}.{NO_SOURCE}")
