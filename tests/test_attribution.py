"""Attribution on timelines written out by hand: which idle time waits for the host, the input gap, the lanes of
a picture, the input source, each step's GPU slot and the kernel classes pooled over windows."""

from types import SimpleNamespace

import pytest

from steplens.evidence import attribution
from steplens.scopes import NEXT_BATCH, SCOPES

OUTSIDE = attribution.OUTSIDE_SCOPES


def kernel(s, e, corr=None, kind="kernel"):
    """A GPU event tuple as the timeline gives it: (kind, start, end, stream, correlation, bytes)."""
    return (kind, s, e, 7, corr, 0)


# The GPU is busy 10-30 and 50-60 of a 0-100 span. The work at 10 was launched at 5 (after the idle 0-10
# began: a wait for the host); the work at 50 at 20 (before the idle 30-50 began: queued, GPU-side); nothing
# ends 60-100 (a wait for the host). The host was in the input 0-8, the copy 8-10, forward/backward 60-90,
# the optimizer 90-95.
LAUNCHED = {1: 5.0, 2: 20.0}
GPU = [kernel(10.0, 30.0, 1), kernel(50.0, 60.0, 2)]
SCOPE_SLICES = {
    NEXT_BATCH: [[0.0, 8.0]],
    "input/to_device": [[8.0, 10.0]],
    "train/forward_backward": [[60.0, 90.0]],
    "train/optimizer": [[90.0, 95.0]],
}


def busy(gpu=GPU, launched=LAUNCHED):
    return attribution.Busy(gpu, lambda ev: launched.get(ev[4], float("inf")))


def test_idle_time_is_split_into_host_waits_by_scope_the_input_gap_and_queued_work():
    f = attribution.idle_figures(busy(), [[0.0, 100.0]], SCOPE_SLICES, [[0.0, 8.0]])
    assert f == {
        "span_us": 100.0,
        "busy_us": 30.0,
        "idle_us": 70.0,
        "comm_only_us": 0.0,
        "idle_share": 0.7,
        "host_wait_us": 50.0,
        "waits_by_scope_us": {
            NEXT_BATCH: 8.0,
            "input/to_device": 2.0,
            "train/forward_backward": 30.0,
            "train/optimizer": 5.0,
            OUTSIDE: 5.0,
        },
        "input_gap_us": 8.0,
        "input_gap_share": pytest.approx(8 / 70),
    }


def test_the_lanes_draw_busy_the_input_gap_the_other_host_waits_and_queued_idle_in_order():
    f = attribution.idle_figures(busy(), [[0.0, 100.0]], SCOPE_SLICES, [[0.0, 8.0]], lanes=True)
    assert f["segments"] == [
        ["input gap", 0.0, 8.0],
        ["waiting for the host", 8.0, 10.0],
        ["busy", 10.0, 30.0],
        ["other idle", 30.0, 50.0],
        ["busy", 50.0, 60.0],
        ["waiting for the host", 60.0, 100.0],
    ]
    assert "segments" not in attribution.idle_figures(busy(), [[0.0, 100.0]], SCOPE_SLICES, None)


def test_without_an_input_source_the_gap_is_null_and_every_host_wait_is_drawn_as_one():
    f = attribution.idle_figures(busy(), [[0.0, 100.0]], SCOPE_SLICES, None, lanes=True)
    assert f["input_gap_us"] is None and f["input_gap_share"] is None and f["host_wait_us"] == 50.0
    assert [s for s in f["segments"] if s[0] == "waiting for the host"] == [
        ["waiting for the host", 0.0, 10.0],
        ["waiting for the host", 60.0, 100.0],
    ]


def test_a_span_in_pieces_an_empty_span_and_a_busy_span():
    f = attribution.idle_figures(busy(), [[0.0, 20.0], [40.0, 60.0]], SCOPE_SLICES, [[0.0, 8.0]])
    assert (f["span_us"], f["busy_us"], f["idle_us"]) == (40.0, 20.0, 20.0)
    assert attribution.idle_figures(busy(), [], SCOPE_SLICES, None) is None
    full = attribution.idle_figures(busy(), [[10.0, 30.0]], SCOPE_SLICES, [[0.0, 8.0]])
    assert full["idle_us"] == 0.0 and full["input_gap_share"] == 0.0 and full["idle_share"] == 0.0
    assert attribution.idle_figures(busy(), [[5.0, 5.0]], SCOPE_SLICES, None)["idle_share"] is None


def test_communication_alone_is_busy_time_outside_the_compute_intervals():
    b = busy()
    b.compute = [[10.0, 20.0], [50.0, 60.0]]  # 20-30 runs communication kernels alone
    f = attribution.idle_figures(b, [[0.0, 100.0]], SCOPE_SLICES, None)
    assert f["comm_only_us"] == 10.0 and f["busy_us"] == 30.0


def test_busy_merges_overlapping_and_touching_work_and_keeps_the_launch_that_opened_it():
    b = busy(
        [kernel(20.0, 25.0, 3), kernel(0.0, 10.0, 1), kernel(10.0, 12.0, 2), kernel(5.0, 8.0, 4)],
        {1: -1.0, 2: 9.0, 3: 15.0, 4: 1.0},
    )
    assert (
        b.merged == [[0.0, 12.0], [20.0, 25.0]] and list(b.opened_by) == [-1.0, 15.0] and list(b.starts) == [0.0, 20.0]
    )
    assert b.compute is None
    assert b.host_wait([[12.0, 20.0]]) == [[12.0, 20.0]], "the work at 20 was launched at 15, after 12"
    assert b.host_wait([[15.0, 20.0]]) == [], "launched at 15, when the idle began: queued"
    assert b.host_wait([[25.0, 40.0]]) == [[25.0, 40.0]], "after the last work: the host"


def test_slice_finder_holds_a_time_from_a_slice_s_start_up_to_its_end():
    find = attribution.SliceFinder([(10.0, 20.0, "b"), (0.0, 5.0, "a")])
    assert [find(t) for t in (-1.0, 0.0, 4.9, 5.0, 7.0, 10.0, 19.9, 20.0)] == [
        None,
        "a",
        "a",
        None,
        None,
        "b",
        "b",
        None,
    ]


def trace(**over):
    t = SimpleNamespace(
        steps=[(1, 0.0, 100.0), (2, 100.0, 200.0)],
        scopes={n: [] for n in SCOPES},
        named={},
        loader=[],
        runtime=[],
        gpu=[],
        gpu_names={},
    )
    for k, v in over.items():
        setattr(t, k, v)
    return t


def test_attribute_charges_work_to_the_launching_step_and_scope_and_the_rest_to_their_buckets():
    runtime = [("cudaLaunchKernel", 60.0, 61.0, 1), ("cudaLaunchKernel", 150.0, 151.0, 2), ("cudaFree", 5.0, 6.0, None)]
    runtime += [("cudaLaunchKernel", 250.0, 251.0, 5)]
    gpu = [kernel(120.0, 130.0, 1), kernel(160.0, 170.0, 2), kernel(30.0, 40.0, 3), kernel(50.0, 55.0, None)]
    gpu += [kernel(260.0, 270.0, 5), kernel(300.0, 310.0, None)]
    t = trace(runtime=runtime, gpu=gpu, scopes={**trace().scopes, "train/forward_backward": [[55.0, 70.0]]})
    by_step, calls, before, outside, by_clock, launch_time = attribution.attribute(t)
    assert by_step == {1: [(gpu[0], "train/forward_backward"), (gpu[3], OUTSIDE)], 2: [(gpu[1], OUTSIDE)]}
    assert calls == {1: [runtime[0], runtime[2]], 2: [runtime[1]]}
    assert before == [gpu[2]] and outside == [gpu[4], gpu[5]] and by_clock == 2
    assert launch_time(gpu[0]) == 60.0 and launch_time(gpu[4]) == 250.0
    assert launch_time(gpu[2]) == float("-inf") and launch_time(gpu[3]) == float("inf")


def test_the_input_source_in_order_of_preference():
    t = trace(scopes={**trace().scopes, NEXT_BATCH: [[0.0, 5.0], [3.0, 8.0]]}, loader=[[1.0, 2.0]])
    t.named = {"my_loader": [[10.0, 12.0], [11.0, 13.0]]}
    assert attribution.input_source(t, "my_loader") == (
        {"name": "my_loader", "kind": "--input-scope", "null_reason": None},
        [[10.0, 13.0]],
    )
    assert attribution.input_source(t, "input/to_device") == (
        {
            "name": "input/to_device",
            "kind": "--input-scope",
            "null_reason": "no user annotation named 'input/to_device' in the trace",
        },
        None,
    )
    t.scopes["input/to_device"] = [[20.0, 21.0]]
    t.named["input/to_device"] = [[0.0, 1.0]]
    assert attribution.input_source(t, "input/to_device")[1] == [[20.0, 21.0]], "a scope before a named slice"
    assert attribution.input_source(t) == ({"name": NEXT_BATCH, "kind": "scope", "null_reason": None}, [[0.0, 8.0]])
    t.scopes[NEXT_BATCH] = []
    name = attribution.LOADER_PREFIX + "...__next__"
    assert attribution.input_source(t) == (
        {"name": name, "kind": "DataLoader annotation", "null_reason": None},
        [[1.0, 2.0]],
    )
    t.loader = []
    assert attribution.input_source(t) == ({"name": None, "kind": None, "null_reason": attribution.NO_INPUT}, None)


def test_gpu_slots_run_from_a_step_s_first_gpu_start_to_the_next_one_s():
    steps = [(1, 0.0, 100.0), (2, 100.0, 200.0), (3, 200.0, 300.0)]
    by_step = {1: [(kernel(40.0, 50.0), "s"), (kernel(30.0, 35.0), "s")], 3: [(kernel(230.0, 240.0), "s")]}
    assert attribution.gpu_slots(steps, by_step) == ({1: [30.0, 230.0], 3: None}, None)
    assert attribution.gpu_slots(steps, {}) == ({}, "no GPU work was launched inside the window")
    crossed = {1: [(kernel(240.0, 250.0), "s")], 2: [(kernel(230.0, 235.0), "s")]}
    assert attribution.gpu_slots(steps, crossed) == (
        {},
        "a later step's GPU work starts before an earlier step's: the steps' GPU stretches are undefined",
    )
    same = {1: [(kernel(230.0, 231.0), "s")], 2: [(kernel(230.0, 235.0), "s")]}
    assert attribution.gpu_slots(steps, same)[0] == {1: [230.0, 230.0], 2: None}


def test_the_cpu_lane_clips_the_scopes_to_the_step_and_adds_an_input_source():
    scopes = {**{n: [] for n in SCOPES}, NEXT_BATCH: [[-5.0, 10.0]], "train/optimizer": [[40.0, 60.0]]}
    assert attribution.cpu_lane(scopes, 0.0, 50.0, inputs=[[20.0, 30.0]]) == [
        [NEXT_BATCH, 0.0, 10.0],
        ["input", 20.0, 30.0],
        ["train/optimizer", 40.0, 50.0],
    ]
    assert attribution.cpu_lane(scopes, 0.0, 50.0) == [[NEXT_BATCH, 0.0, 10.0], ["train/optimizer", 40.0, 50.0]]


def classes(busy_us, by_class):
    return {"busy_us": busy_us, "classes": {k: {"us": v} for k, v in by_class.items()}}


def test_pooled_classes_are_per_step_and_shares_of_the_pooled_work():
    windows = [
        {"kernel_classes": classes(300.0, {"optimizer": 100.0, "batch-norm": 200.0})},
        {"kernel_classes": classes(100.0, {"optimizer": 100.0})},
    ]
    pooled = attribution.pooled_classes(windows, 4)
    assert pooled["kernel_classes"] == {
        "batch-norm": {"ms_per_step": pytest.approx(0.05), "share": pytest.approx(0.5)},
        "optimizer": {"ms_per_step": pytest.approx(0.05), "share": pytest.approx(0.5)},
    }
    assert list(pooled["kernel_classes"]) == ["batch-norm", "optimizer"], "in the classes' own order"
    assert pooled["gpu_top_classes"] == "optimizer 50%, batch-norm 50%"
    assert attribution.pooled_classes([{"kernel_classes": None}] + windows, 4) == {
        "kernel_classes": None,
        "gpu_top_classes": None,
    }
    assert attribution.pooled_classes([{"kernel_classes": classes(0.0, {})}], 4)["kernel_classes"] is None


def test_work_figures_count_each_kind_the_launches_and_the_syncs():
    fb, copy = "train/forward_backward", "input/to_device"
    mine = [
        (kernel(0.0, 10.0, 1), fb),  # 10 us: not under 10
        (kernel(12.0, 17.0, 2), fb),
        (("h2d", 5.0, 8.0, 7, 3, 4096), copy),
        (("memset", 30.0, 31.0, 7, 4, 0), OUTSIDE),
    ]
    runtime = [
        ("cudaLaunchKernel", 1.0, 3.0, 1),
        ("cudaGraphLaunch", 4.0, 5.0, 9),
        ("cudaDeviceSynchronize", 40.0, 50.0, None),
        ("cudaStreamSynchronize", 60.0, 61.0, None),
        ("cudaMalloc", 70.0, 75.0, None),
    ]
    f = attribution.work_figures(mine, runtime, [[0.0, 10.0], [12.0, 17.0]])
    assert f == {
        "gpu_work_us": 16.0,
        "gpu_work_by_scope_us": {OUTSIDE: 1.0, copy: 3.0, fb: 15.0},
        "h2d": {"count": 1, "bytes": 4096, "us": 3.0, "overlapped_with_kernels_us": 3.0},
        "kernels": {"count": 2, "median_us": 7.5, "share_under_10us": 0.5},
        "other_gpu_events": 1,
        "launch_cpu_us": 3.0,
        "graph_launches": 1,
        "sync": {"count": 2, "cpu_us": 11.0},
    }
    none = attribution.work_figures([], [], [])
    assert none["kernels"] == {"count": 0, "median_us": None, "share_under_10us": None} and none["gpu_work_us"] == 0


def test_kernel_classes_read_each_event_s_name_and_take_copies_by_their_kind():
    a, b, c = kernel(0.0, 10.0, 1), ("h2d", 20.0, 25.0, 7, 2, 64), kernel(30.0, 31.0, 3)
    t = trace(gpu_names={a: "sgemm_x", b: "sgemm_named_copy"})
    out = attribution.kernel_classes(t, [a, b, c], top=1)
    assert {cls: v["us"] for cls, v in out["classes"].items()} == {
        "matrix multiply": 10.0,
        "copies and memsets": 5.0,
        "other": 1.0,
    }
    assert out["other_names"] == [""] and out["busy_us"] == 16.0
    assert out["top"] == [{"name": "sgemm_x", "class": "matrix multiply", "count": 1, "us": 10.0}]
    assert "top" not in attribution.kernel_classes(t, [a])


def test_busy_orders_work_by_start_whatever_its_kind():
    b = busy([kernel(0.0, 10.0, 1), ("h2d", 5.0, 20.0, 7, 2, 64)], {1: -1.0, 2: 3.0})
    assert b.merged == [[0.0, 20.0]] and list(b.opened_by) == [-1.0]


def test_a_corr_less_event_belongs_to_the_step_it_starts_in_and_a_scope_holds_an_input_alone():
    t = trace(gpu=[kernel(90.0, 110.0, None)])
    by_step = attribution.attribute(t)[0]
    assert by_step == {1: [(t.gpu[0], OUTSIDE)]}
    t = trace(scopes={**trace().scopes, "input/to_device": [[20.0, 21.0]]})
    assert attribution.input_source(t, "input/to_device")[1] == [[20.0, 21.0]]


def test_the_cpu_lane_is_in_order_of_start_and_nothing_waits_outside_when_the_scopes_hold_every_wait():
    scopes = {**{n: [] for n in SCOPES}, "train/forward_backward": [[0.0, 30.0]]}
    lane = attribution.cpu_lane(scopes, 0.0, 50.0, inputs=[[10.0, 20.0]])
    assert lane == [["train/forward_backward", 0.0, 30.0], ["input", 10.0, 20.0]]
    f = attribution.idle_figures(busy(), [[0.0, 10.0]], SCOPE_SLICES, None)
    assert f["waits_by_scope_us"][OUTSIDE] == 0.0 and f["host_wait_us"] == 10.0
