"""The delays on loops without the companion's scopes, on traces written out by hand: input wait, copy, launch,
sync and GPU compute each named with its share, mixtures adding up to the step, ROCm names read as CUDA's,
launches from a second thread followed, a trace without steps read as one window and one step marked."""

import json
import os

import pytest

from steplens.evidence import delays, summarize
from steplens.scopes import KNOWN
from steplens.trace.reader import TraceError, iter_events

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


class Loop:
    """A trace built step by step: CPU slices on the main thread (tid 1), kernels on stream 7."""

    def __init__(self, launch="cudaLaunchKernel", sync="cudaStreamSynchronize", copy="cudaMemcpyAsync"):
        self.events, self.corr = [], 0
        self.launch_name, self.sync_name, self.copy_name = launch, sync, copy

    def cpu(self, name, s, e, cat="user_annotation", tid=1, **args):
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "ts": s, "dur": e - s, "pid": 1, "tid": tid, "args": args}
        )

    def step(self, n, s, e):
        self.cpu(f"ProfilerStep#{n}", s, e)

    def kernel(self, at, start, dur, tid=1, name="void gemm_kernel<float>"):
        """A launch call at `at` (5 µs long) whose kernel runs [start, start + dur)."""
        self.corr += 1
        self.cpu(self.launch_name, at, at + 5, cat="cuda_runtime", tid=tid, correlation=self.corr)
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "ts": start,
                "dur": dur,
                "pid": 0,
                "tid": 7,
                "args": {"correlation": self.corr, "stream": 7},
            }
        )

    def copy(self, s, e, gpu_s, gpu_e, nbytes, memory="Pageable"):
        self.corr += 1
        self.cpu(self.copy_name, s, e, cat="cuda_runtime", correlation=self.corr)
        self.events.append(
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": f"Memcpy HtoD ({memory} -> Device)",
                "ts": gpu_s,
                "dur": gpu_e - gpu_s,
                "pid": 0,
                "tid": 7,
                "args": {"correlation": self.corr, "stream": 7, "bytes": nbytes},
            }
        )

    def sync(self, s, e, op="aten::item"):
        if op:
            self.cpu(op, s - 1, e + 1, cat="cpu_op")
        self.cpu(self.sync_name, s, e, cat="cuda_runtime")

    def read(self, **kw):
        return summarize.summarize_events(list(self.events), **kw)


def shares(ev):
    return ev["verdict"]["delays"]


def input_bound():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.cpu(LOADER, t0, t0 + 700)
        loop.kernel(t0 + 700, t0 + 710, 280)
    return loop


def test_an_input_bound_loop_is_named_input_wait_with_its_share():
    ev = input_bound().read()
    v = ev["verdict"]
    assert v["part"] == "input" and v["stage"] == "waiting for input", v["sentence"]
    assert shares(ev)["input"] == pytest.approx(0.7, abs=0.001)
    assert "inside enumerate(DataLoader)" in v["sentence"] and "workers" in v["next"]


def pageable_copy_bound():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.copy(t0, t0 + 500, t0 + 300, t0 + 500, 10_000_000)  # the host stages 0-300, the GPU copies 300-500
        loop.sync(t0 + 500, t0 + 520, op=None)  # PyTorch's sync after a pageable copy: the copy's, not a sync
        loop.kernel(t0 + 600, t0 + 610, 300)
    return loop


def test_a_pageable_copy_bound_loop_is_named_copy_with_bytes_memory_and_rate():
    ev = pageable_copy_bound().read()
    v = ev["verdict"]
    assert v["part"] == "copy", v["sentence"]
    # idle 0-300 (host copying) + GPU copying alone 300-500 + the 20 µs the host waited in the copy's sync; the
    # 90 µs after it, until the next kernel, are the host's own pace
    assert shares(ev)["copy"] == pytest.approx(0.52, abs=0.001)
    assert shares(ev)["sync"] == 0.0
    assert "1 host-to-device copies a step, 10.0 MB from pageable memory at 50.0 GB/s" in v["sentence"]
    assert "pinned memory" in v["next"]


def test_a_launch_bound_loop_is_named_launch_with_its_kernels_and_launch_wait():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        for i in range(50):  # a launch every 20 µs, each kernel 2 µs long, starting 1 µs after its call returns
            loop.kernel(t0 + 20 * i + 1, t0 + 20 * i + 7, 2)
    ev = loop.read()
    v = ev["verdict"]
    assert v["part"] == "launch" and v["stage"] == "host-side launch overhead", v["sentence"]
    # all but the first step's opening 7 µs and the last step's closing 11 µs: nothing launched before or after
    assert shares(ev)["launch"] == pytest.approx((3000 - 300 - 7 - 11) / 3000)
    assert shares(ev)["compute"] == pytest.approx(0.1)
    d = ev["window"]["delay_details"]["launch"]
    assert d["kernels_per_step"] == 50 and d["kernel_median_us"] == 2 and d["launch_to_start_median_us"] == 1
    assert d["cpu_us_per_launch"] == 5
    assert "CUDA graphs" in v["next"]


def sync_bound(tid=1):
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.kernel(t0, t0 + 10, 390, tid=tid)  # the GPU runs 10-400
        loop.sync(t0 + 20, t0 + 402)  # .item(): the host waits 382 µs for the GPU, then runs on without launching
        loop.kernel(t0 + 990, t0 + 995, 5, tid=tid)
    return loop


def test_a_sync_bound_loop_is_named_sync_with_its_origin():
    ev = sync_bound().read()
    v = ev["verdict"]
    assert v["part"] == "sync" and v["stage"] == "synchronizing with the CPU", v["sentence"]
    # idle 400-995 follows the sync; it costs what the host waited in it, 382 µs a step
    assert shares(ev)["sync"] == pytest.approx(0.382)
    assert ev["window"]["delay_details"]["sync"]["origins"] == {"aten::item": 3}
    assert "from aten::item (1.0 a step)" in v["sentence"] and ".item()" in v["next"]


def test_a_sync_costs_no_more_than_the_host_waited_in_it():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.kernel(t0, t0 + 10, 190)  # the GPU runs 10-200
        loop.sync(t0 + 100, t0 + 202)  # the host waits 102 µs, then works 700 µs without launching
        loop.kernel(t0 + 900, t0 + 910, 80)
    s = shares(loop.read())
    assert s["sync"] == pytest.approx(3 * 102 / 3000)  # without the sync the host would have gone on 102 µs sooner
    assert s["launch"] >= 3 * 608 / 3000  # the rest of the idle after it: the host's own pace


def test_a_gpu_bound_loop_is_named_gpu_compute():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.kernel(t0, t0 + 10, 950)
    ev = loop.read()
    assert ev["verdict"]["part"] == "compute" and ev["verdict"]["stage"] == "GPU compute"
    assert shares(ev)["compute"] == pytest.approx(0.95, abs=0.001)


def test_a_long_stretch_without_launches_is_host_work_not_launch():
    loop = Loop()
    for n in range(3):
        t0 = n * 10_000
        loop.step(n + 1, t0, t0 + 10_000)
        loop.kernel(t0, t0 + 10, 1000)
        loop.kernel(t0 + 9000, t0 + 9010, 900)  # 9 ms without a launch: more than LAUNCH_GAP_US
    ev = loop.read()
    assert ev["verdict"]["part"] == "host"
    # 8 ms a step, the last step's tail after its last kernel (90 µs: nothing launched after it) and the first step's
    # opening 10 µs (its launch call was still running, and no launch came before it)
    assert shares(ev)["host"] == pytest.approx((3 * 8000 + 90 + 10) / 30_000)
    assert delays.LAUNCH_GAP_US < 9000


def test_a_mixture_s_shares_add_up_to_the_step_and_the_largest_names_the_verdict():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.cpu(LOADER, t0, t0 + 200)  # input 0-200
        loop.copy(t0 + 200, t0 + 300, t0 + 290, t0 + 300, 1_000_000)  # copy 200-300
        loop.kernel(t0 + 301, t0 + 310, 100)  # compute 310-410, launched after the copy: 300-310 is launch
        loop.sync(t0 + 320, t0 + 411)  # sync: idle 410-700
        for i in range(10):  # launch-bound 700-1000
            loop.kernel(t0 + 700 + 30 * i, t0 + 706 + 30 * i, 3)
    ev = loop.read()
    s = shares(ev)
    assert sum(s.values()) == pytest.approx(1.0, abs=1e-9)
    assert s["input"] == pytest.approx(0.2, abs=0.001)
    assert s["copy"] == pytest.approx(0.1)  # 200-300: the host's copy call (the GPU's copy inside it)
    assert s["sync"] == pytest.approx(0.091)  # the idle from 410 on, up to the 91 µs the host waited in the sync
    assert ev["verdict"]["part"] == max((c for c in s if c != "compute"), key=s.get)


def test_rocm_names_are_read_like_cuda_ones():
    cuda = sync_bound().read()
    loop = Loop(launch="hipLaunchKernel", sync="hipStreamSynchronize", copy="hipMemcpyWithStream")
    loop.events = [
        dict(
            e,
            name={"cudaLaunchKernel": "hipLaunchKernel", "cudaStreamSynchronize": "hipStreamSynchronize"}.get(
                e["name"], e["name"]
            ),
        )
        for e in sync_bound().events
    ]
    rocm = loop.read()
    assert rocm["window"]["gpu_work_launches"] == cuda["window"]["gpu_work_launches"] == 6
    assert shares(rocm) == shares(cuda)


def test_kernels_launched_from_a_second_thread_are_followed():
    main = sync_bound(tid=1).read()
    autograd = sync_bound(tid=2).read()  # the launches come from another thread of the process
    assert shares(autograd) == shares(main) and autograd["verdict"]["part"] == "sync"


def test_memsets_without_a_gpu_record_are_not_read_as_lost_launches():
    loop = input_bound()
    for n in range(3):  # cuDNN's internal memsets: a call, no GPU record
        loop.cpu("cudaMemsetAsync", n * 1000 + 705, n * 1000 + 706, cat="cuda_runtime", correlation=900 + n)
    ev = loop.read()
    assert ev["verdict"]["part"] == "input" and ev["window"]["delay_details"]["memsets_without_gpu_record"] == 3


def test_a_trace_without_steps_is_read_as_one_window_and_says_so():
    loop = input_bound()
    loop.events = [e for e in loop.events if not e["name"].startswith("ProfilerStep#")]
    ev = loop.read()
    v = ev["verdict"]
    assert ev["window_only"] and summarize.WINDOW_ONLY in ev["notes"]
    assert v["part"] == "input" and v["sentence"].startswith(
        "Read as one window (the trace has no steps), so no pattern"
    )


def test_a_named_scope_can_be_the_step():
    loop = input_bound()
    loop.events = [dict(e, name="iteration") if e["name"].startswith("ProfilerStep#") else e for e in loop.events]
    ev = loop.read(step_scope="iteration")
    assert [s["step"] for s in ev["steps"]] == [1, 2, 3] and ev["verdict"]["part"] == "input"
    with pytest.raises(TraceError, match="no user annotation named 'nope'"):
        loop.read(step_scope="nope")


def test_one_step_gets_its_reading_marked_as_one_step():
    loop = Loop()
    loop.step(1, 0, 1000)
    loop.cpu(LOADER, 0, 700)
    loop.kernel(700, 710, 280)
    v = loop.read()["verdict"]
    assert v["one_step"] and v["part"] == "input"
    assert v["sentence"].startswith("One profiled step, so no pattern across steps is claimed. ")


def test_a_trace_without_gpu_events_says_cannot_tell_rather_than_a_delay():
    loop = Loop()
    for n in range(3):
        loop.step(n + 1, n * 1000, n * 1000 + 1000)
    v = loop.read()["verdict"]
    assert v["stage"] is None and v["sentence"].startswith("Cannot tell") and "delays" not in v


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The smallest stored NVIDIA H200 trace of each verdict the scopes give (every stored GPU trace agrees: 72 of 72
# on 2026-12-06, and the 24 kept since; docs/DELAYS.md).
OWN = {
    "GPU compute": "results/h200-distortion/offline/runs/2499ffe8056546ceaafc18189664c00a/outputs/traces/"
    "trace-cycle1-steps2-4.pt.trace.json.gz",
    "host-side launch overhead": "results/h200-reprofile/eager/runs/5ad75ecce38942bb8a82409565c94b80/outputs/traces/"
    "trace-cycle1-steps2-4.pt.trace.json.gz",
    "waiting for input": "results/h200-reprofile/eager/runs/1b4a4006ba0d4b5289e90cc1d5cd54fc/outputs/traces/"
    "trace-cycle2-steps7-9.pt.trace.json.gz",
}


@pytest.mark.parametrize("stage", sorted(OWN))
def test_our_own_run_without_its_scopes_gets_the_verdict_it_gets_with_them(stage):
    events = list(iter_events(os.path.join(ROOT, OWN[stage])))
    labelled = summarize.summarize_events(events)
    stripped = [e for e in events if not (isinstance(e, dict) and e.get("name") in KNOWN)]
    bare = summarize.summarize_events(stripped)
    assert labelled["verdict"]["stage"] == bare["verdict"]["stage"] == stage, bare["verdict"]["sentence"]
    assert not bare["scopes_present"] and "four scopes" not in bare["verdict"]["sentence"]
    assert sum(bare["verdict"]["delays"].values()) == pytest.approx(1.0)


STUDY = os.path.join(ROOT, "results", "h100-delays")
EXPECTED = {"input": "input", "copy": "copy", "launch": "launch", "sync": "sync", "gpu": "compute"}


@pytest.mark.parametrize("loop", sorted(EXPECTED))
def test_each_stored_h100_loop_names_its_delay_within_0_15_of_its_truth(loop):
    """Five loops profiled on an NVIDIA H100 machine without labels (results/h100-delays): each is named by the
    delay it was built to have, and the share read lies within 0.15 of the share that removing it saved."""
    with open(os.path.join(STUDY, "truths.json")) as f:
        truth = json.load(f)["loops"][loop]["truth"]
    v = summarize.summarize_file(os.path.join(STUDY, f"{loop}.pt.trace.json.gz"))["verdict"]
    assert v["part"] == EXPECTED[loop], v["sentence"]
    assert abs(v["delays"][EXPECTED[loop]] - truth) <= 0.15, (v["delays"], truth)


def test_a_launch_call_still_running_when_the_gpu_goes_idle_is_a_wait_for_the_host_not_queued_work():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        for i in range(100):  # each call (5 µs) starts as the GPU finishes the kernel before it
            loop.kernel(t0 + 10 * i, t0 + 10 * i + 7, 3)
    ev = loop.read()
    assert ev["verdict"]["part"] == "launch" and shares(ev)["queued"] < 0.01, shares(ev)


def test_a_sync_is_charged_over_the_idle_after_it_and_never_more_than_the_host_waited():
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.kernel(t0, t0 + 10, 390)  # the GPU runs 10-400
        loop.sync(t0 + 20, t0 + 402)  # the host waits 382 µs
        for k in range(3):  # then three tiny kernels, and host work
            loop.kernel(t0 + 430 + 20 * k, t0 + 436 + 20 * k, 2)
        loop.kernel(t0 + 990, t0 + 994, 4)
    s = shares(loop.read())
    assert s["sync"] == pytest.approx(0.382), "the whole wait, spread over the idle after the sync"


def test_rocm_s_item_a_blocking_device_to_host_copy_is_a_sync():
    loop = Loop(launch="hipLaunchKernel")
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.kernel(t0, t0 + 10, 390)
        loop.corr += 1  # .item() on ROCm: hipMemcpyWithStream waits for the GPU, then copies 4 bytes back
        loop.cpu("aten::item", t0 + 19, t0 + 404, cat="cpu_op")
        loop.cpu("hipMemcpyWithStream", t0 + 20, t0 + 403, cat="cuda_runtime", correlation=loop.corr)
        loop.events.append(
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": "Memcpy DtoH (Device -> Pageable)",
                "ts": t0 + 400,
                "dur": 2,
                "pid": 0,
                "tid": 7,
                "args": {"correlation": loop.corr, "stream": 7, "bytes": 4},
            }
        )
        loop.kernel(t0 + 990, t0 + 995, 5)
    ev = loop.read()
    assert ev["verdict"]["part"] == "sync" and shares(ev)["sync"] == pytest.approx(0.383), shares(ev)


def test_a_tiny_pageable_copy_s_sync_costs_no_more_than_its_wait():
    loop = Loop()
    for n in range(3):
        t0 = n * 10_000
        loop.step(n + 1, t0, t0 + 10_000)
        loop.kernel(t0, t0 + 5, 100)
        loop.copy(t0 + 200, t0 + 210, t0 + 208, t0 + 210, 4)  # 4 bytes from pageable memory
        loop.sync(t0 + 210, t0 + 212, op=None)
        loop.kernel(t0 + 7300, t0 + 7305, 100)  # 7 ms of host work after it
    s = shares(loop.read())
    assert s["copy"] < 0.01 and s["host"] > 0.6, s


@pytest.mark.parametrize(
    "part,share,delays_seen,said",
    [
        ("train/forward_backward", 0.48, {"launch": 0.57}, "also counts the launch waits outside it"),
        # a sync inside the scope: the scope's idle is the larger, and the line says what else it holds
        ("train/forward_backward", 0.48, {"launch": 0.40, "sync": 0.08}, "counts launch waits alone"),
        ("eval/forward", 0.30, {"launch": 0.305}, None),  # within a point
        ("busy", 0.97, {"compute": 0.09, "copy": 0.89}, "its copies included"),
        ("busy", 0.97, {"compute": 0.965}, None),
        ("input", 0.30, {"input": 0.25}, None),  # different measures: no reason claimed
        ("input/to_device", 0.024, {"copy": 0.004}, None),
    ],
)
def test_the_verdict_s_share_beside_its_delay_is_explained_only_where_the_reason_is_known(
    part, share, delays_seen, said
):
    """A line beside the delays says why the verdict's share differs from the delay that reads the same time, only
    where the difference has one known cause: copies inside busy time, launch waits outside the forward scope,
    and (by definition) what else the forward scope's idle holds where it is the larger."""
    from steplens.evidence import formatting

    shares = dict.fromkeys(delays.CLASSES, 0.0) | delays_seen
    ev = {"verdict": {"part": part, "share": share, "delays": shares}, "window": {"steps": 3}}
    why = [line for line in formatting.delay_lines(ev) if line.startswith("  (the verdict's")]
    if said is None:
        assert why == []
    else:
        (line,) = why
        assert said in line and f"{share:.0%}" in line


def test_on_a_stored_scoped_trace_the_launch_wait_outside_the_forward_scope_is_said(stored_evidence):
    """The workers=4 re-profile trace: the verdict reads 48% inside train/forward_backward, launch-bound 57% over
    the whole step; the brief output says so beside the delays."""
    from steplens.evidence import formatting

    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "results/h200-reprofile/eager/runs/4220df20529845b38750930bef04749a/outputs/traces/"
        "trace-cycle1-steps2-4.pt.trace.json.gz",
    )
    ev = stored_evidence(path)
    v = ev["verdict"]
    assert v["part"] == "train/forward_backward" and v["delays"]["launch"] - v["share"] >= 0.01, v
    lines = formatting.delay_lines(ev)
    assert lines[1] == (
        f"  (the verdict's {v['share']:.0%} is the GPU's idle inside train/forward_backward alone; launch-bound "
        f"{v['delays']['launch']:.0%} also counts the launch waits outside it)"
    )


def test_a_delay_verdict_s_whole_sentence_says_the_measured_idle_the_copies_and_a_close_runner_up():
    """The whole sentence of two delay verdicts: a copy-bound loop (the GPU idle 50%, copying 20%, computing 30%:
    they add up to the step) and an input-bound one with launch waits within CLOSE of it (named as runner-up)."""
    v = pageable_copy_bound().read()["verdict"]
    assert v["sentence"] == (
        "The GPU idles for 50% of the step and copies for 20% of it; copying input to the GPU holds the step (52% of "
        "it): 1 host-to-device copies a step, 10.0 MB from pageable memory at 50.0 GB/s. Next: pinned memory with "
        "non_blocking=True copies, a prefetch stream, smaller inputs (uint8, not float), or decoding on the GPU, then "
        "time the change without the profiler, a few runs each way. The trace shows no input source (no DataLoader, "
        "no --input-scope): a wait for input would read as host work."
    )
    assert v["runner_up"] is None and v["delays"]["compute"] == pytest.approx(0.3)
    loop = Loop()
    for n in range(3):
        t0 = n * 1000
        loop.step(n + 1, t0, t0 + 1000)
        loop.cpu(LOADER, t0, t0 + 400)
        for i in range(18):
            loop.kernel(t0 + 400 + 20 * i + 1, t0 + 400 + 20 * i + 7, 2)
        loop.kernel(t0 + 800, t0 + 810, 180)
    v = loop.read()["verdict"]
    assert v["sentence"] == (
        "The GPU idles for 78% of the step; waiting for input holds the step (40% of it), closely followed by "
        "host-side launch overhead (38%): the main thread is inside enumerate(DataLoader)#...__next__ while the GPU "
        "idles, 0.40 ms a step. Next: more DataLoader workers within the job's CPUs, a cheaper transform, or input "
        "prepared on the GPU, then time the change without the profiler, a few runs each way."
    )
    assert v["runner_up"] == {
        "stage": "host-side launch overhead",
        "part": "launch",
        "share": pytest.approx(0.37833, abs=1e-4),
    }


class _NoCopies:
    """A host with no copies: every sync's origin is its operator (or none)."""

    class h2d:
        @staticmethod
        def clip(s, e):
            return iter(())

    @staticmethod
    def is_copy(s, e):
        return False


def _origins_by_scan(t):
    """_sync_origins as it read before: every operator of the thread scanned for each call."""
    ops = {}
    for name, s, e, tid in t.sync_ops:
        ops.setdefault(tid, []).append((s, e, name))
    out = {}
    for name, s, e, tid in t.sync_calls:
        if not any(a <= s < b for _, a, b in t.steps):
            continue
        around = [op for op in ops.get(tid, []) if op[0] <= s and e <= op[1]]
        origin = min(around)[2] if around else f"{name} (no operator around it)"
        out[origin] = out.get(origin, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def test_a_syncs_origin_is_the_outermost_operator_of_its_thread_around_it_on_random_traces():
    """The sync origins read in one pass over the operators are those of a scan of every operator for each call:
    nested operators (the outermost wins; at one start, the shorter end, then the name), other threads' operators,
    an operator that ends before the call does, calls outside every step, on 300 random traces."""
    import random

    from steplens.trace.timeline import Trace

    names = ("aten::item", "aten::equal", "aten::nonzero", "aten::_local_scalar_dense")
    seen = set()
    for seed in range(300):
        rng = random.Random(seed)
        t = Trace()
        t.steps = [(1, 0.0, 50.0), (2, 60.0, 100.0)]
        for _ in range(rng.randrange(0, 40)):
            s = float(rng.randrange(0, 110))
            t.sync_ops.append(rng.choice(names), s, s + rng.randrange(0, 30), rng.choice((1, 2, "w")))
        t.sync_calls = []
        for _ in range(rng.randrange(0, 12)):
            s = float(rng.randrange(0, 110))
            t.sync_calls.append(("cudaStreamSynchronize", s, s + rng.randrange(0, 5), rng.choice((1, 2, "w"))))
        want = _origins_by_scan(t)
        assert delays._sync_origins(t, _NoCopies()) == want, seed
        seen.update(want)
    assert "cudaStreamSynchronize (no operator around it)" in seen and len(seen) == len(names) + 1
