"""summarize.py on small hand-built traces with known answers, and on a real CPU trace."""
import glob
import gzip
import json
import os
import subprocess
import sys

import pytest

import summarize
from conftest import ROOT

CPU = {"pid": 1, "tid": 1}


def x(name, cat, ts, dur, **args):
    ev = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, **CPU}
    if cat in summarize.GPU_CATS:
        ev.update(pid=0, tid=args.get("stream", 7))
    if args:
        ev["args"] = args
    return ev


def step(n, ts, dur):
    return x(f"ProfilerStep#{n}", "user_annotation", ts, dur)


def kernel(ts, dur, stream=7, correlation=None):
    return x("void gemm()", "kernel", ts, dur, stream=stream, correlation=correlation)


def write(tmp_path, events, name="t.json", gz=False):
    path = tmp_path / name
    data = json.dumps({"traceEvents": events})
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(data)
    else:
        path.write_text(data)
    return str(path)


def test_busy_is_the_union_over_streams():
    """Kernels on two streams that overlap count once: busy 50 of 100, idle share 0.5."""
    ev = summarize.summarize_events([step(1, 0, 100), kernel(10, 30, stream=7), kernel(30, 30, stream=8)])
    w = ev["window"]
    assert w["gpu_busy_us"] == 50 and w["gpu_idle_us"] == 50 and ev["gpu_idle_share"] == 0.5


def test_input_gap_is_idle_time_inside_next_batch():
    """next_batch [0,30] while the GPU idles [0,40] and [90,100]: gap 30 of 50 idle."""
    ev = summarize.summarize_events([step(1, 0, 100), x("input/next_batch", "user_annotation", 0, 30),
                                     kernel(40, 50)])
    w = ev["window"]
    assert w["input_gap_us"] == 30 and w["gpu_idle_us"] == 50
    assert ev["input_gap_share"] == pytest.approx(0.6)
    assert w["scopes_cpu_us"]["input/next_batch"] == 30


def test_copy_overlapping_a_kernel():
    """A 10 us H2D copy, 5 us of it under a kernel: counted, sized and its overlap measured."""
    ev = summarize.summarize_events([
        step(1, 0, 100),
        x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 20, 10, stream=9, bytes=1000, correlation=1),
        x("cudaMemcpyAsync", "cuda_runtime", 5, 2, correlation=1),
        kernel(25, 25, correlation=2), x("cudaLaunchKernel", "cuda_runtime", 8, 3, correlation=2)])
    h2d = ev["window"]["h2d"]
    assert h2d == {"count": 1, "bytes": 1000, "us": 10, "overlapped_with_kernels_us": 5}
    assert ev["window"]["gpu_busy_us"] == 30
    assert ev["window"]["launch_cpu_us"] == 3 and ev["window"]["launch_to_busy"] == pytest.approx(0.1)


def test_counts_follow_the_launching_step_and_time_follows_the_clock():
    """A kernel launched in step 1 that runs in step 2 counts for step 1, its busy time for step 2."""
    ev = summarize.summarize_events([
        step(1, 0, 100), step(2, 100, 100),
        x("cudaLaunchKernel", "cuda_runtime", 90, 2, correlation=5), kernel(120, 40, correlation=5),
        x("cudaStreamSynchronize", "cuda_runtime", 150, 12)])
    s1, s2 = ev["steps"]
    assert (s1["kernels"]["count"], s2["kernels"]["count"]) == (1, 0)
    assert (s1["gpu_busy_us"], s2["gpu_busy_us"]) == (0, 40)
    assert s2["sync"] == {"count": 1, "cpu_us": 12} and s1["sync"]["count"] == 0
    assert ev["window"]["steps"] == 2 and ev["window"]["wall_us"] == 200


def test_small_kernel_share_and_median():
    ev = summarize.summarize_events([step(1, 0, 1000)] + [kernel(10 * i, d) for i, d in
                                                           enumerate([2, 4, 8, 20, 50], start=1)])
    k = ev["window"]["kernels"]
    assert k["count"] == 5 and k["median_us"] == 8 and k["share_under_10us"] == pytest.approx(0.6)


def test_nested_scopes_are_not_crossing_but_crossing_ones_are_counted():
    """A slice inside another is fine; one that starts inside and ends outside is a crossing slice."""
    events = [step(1, 0, 100), x("train/forward_backward", "user_annotation", 10, 40),
              x("aten::conv2d", "cpu_op", 12, 3)]
    assert summarize.summarize_events(events)["crossing_slices"]["count"] == 0
    events.append(x("model.py(12): forward", "python_function", 5, 15))  # forward_backward 10..50 crosses 5..20
    events.append(x("torch/nn/module.py: _call_impl", "python_function", 40, 30))  # 40..70 crosses 10..50
    crossing = summarize.summarize_events(events)["crossing_slices"]
    assert crossing["count"] == 2 and crossing["by_thread"] == {"1/1": 2}


def test_cpu_only_trace_gives_null_gpu_figures_with_a_reason():
    ev = summarize.summarize_events([step(1, 0, 100), x("input/next_batch", "user_annotation", 0, 30)])
    assert ev["has_gpu"] is False and ev["gpu_idle_share"] is None
    assert ev["steps"][0]["kernels"] is None and "CPU-only" in ev["gpu_null_reason"]
    table = summarize.format_table([ev])
    assert "gpu idle" not in table and "CPU-only" in table


def test_gzip_and_plain_traces_read_the_same(tmp_path):
    events = [step(1, 0, 100), kernel(10, 30), x("input/next_batch", "user_annotation", 0, 10)]
    a = summarize.summarize_file(write(tmp_path, events, "a.json"))
    b = summarize.summarize_file(write(tmp_path, events, "b.json.gz", gz=True))
    assert {k: v for k, v in a.items() if k != "trace"} == {k: v for k, v in b.items() if k != "trace"}


def test_headline_pools_windows():
    one = summarize.summarize_events([step(1, 0, 100), kernel(0, 50)])
    two = summarize.summarize_events([step(1, 0, 300), kernel(0, 50)])
    h = summarize.headline([one, two])
    assert h["gpu_idle_share"] == pytest.approx((50 + 250) / 400) and h["profiled_step_ms"] == pytest.approx(0.2)
    assert h["gpu_work_ms_per_step"] == pytest.approx(0.05), "uncorrelated kernels count where they ran"


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "summarize.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_side_by_side_shows_the_ratio(tmp_path):
    a = write(tmp_path, [step(1, 0, 100), kernel(0, 20)], "a.json")
    b = write(tmp_path, [step(1, 0, 50), kernel(0, 20)], "b.json")
    proc = run_cli(a, b)
    assert proc.returncode == 0, proc.stderr
    row = next(l for l in proc.stdout.splitlines() if l.startswith("step wall ms"))
    assert row.split()[-1] == "0.50"
    assert "B/A" in proc.stdout and "profiled steps run slower" in proc.stdout


def test_cli_json_is_one_object_per_trace(tmp_path):
    a = write(tmp_path, [step(1, 0, 100), step(2, 100, 100), kernel(0, 20)], "a.json")
    proc = run_cli(a, a, "--json")
    objs = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(objs) == 2 and objs[0]["gpu_idle_share"] == pytest.approx(0.9) and len(objs[0]["steps"]) == 2


def test_cli_refuses_a_file_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("not json")
    proc = run_cli(str(bad))
    assert proc.returncode == 1 and proc.stderr.startswith("summarize.py: error:")
    assert len(proc.stderr.strip().splitlines()) == 1
    empty = write(tmp_path, [kernel(0, 1)], "noprof.json")
    assert "no ProfilerStep" in run_cli(empty).stderr


def test_real_cpu_trace_from_profile_mode(profile_run):
    """A trace train.py wrote: three steps, every scope timed, GPU figures null."""
    trace = sorted(glob.glob(os.path.join(profile_run["outputs"], "traces", "*.pt.trace.json.gz")))[0]
    ev = summarize.summarize_file(trace)
    assert [s["step"] for s in ev["steps"]] == [2, 3, 4]
    for s in ev["steps"]:
        assert all(v > 0 for v in s["scopes_cpu_us"].values()), s["scopes_cpu_us"]
        assert sum(s["scopes_cpu_us"].values()) <= s["wall_us"]
    assert ev["gpu_idle_share"] is None
    assert ev["crossing_slices"]["count"] > 0, "with_stack=True traces have crossing python slices"


def test_gpu_work_follows_the_launching_step_when_the_cpu_runs_ahead():
    """CUDA-graph-like: steps of 10 us on the CPU launch 40 us of kernels each, which run later.

    Clipped to the steps, the GPU looks half idle; the work launched per step (40 us) and the lag
    say the GPU is the bottleneck, and the evidence flags it."""
    events = [step(1, 0, 10), step(2, 10, 10),
              x("cudaGraphLaunch", "cuda_runtime", 2, 1, correlation=1),
              x("cudaGraphLaunch", "cuda_runtime", 12, 1, correlation=2),
              kernel(5, 40, correlation=1), kernel(45, 40, correlation=2)]
    ev = summarize.summarize_events(events)
    first, second = ev["steps"]
    assert first["gpu_work_us"] == 40 and second["gpu_work_us"] == 40
    assert first["gpu_lag_us"] == 35 and second["gpu_lag_us"] == 65
    assert ev["window"]["gpu_work_us"] == 80 and ev["cpu_runs_ahead"] is True
    assert "runs ahead" in summarize.format_table([ev])


def test_cpu_bound_steps_are_not_flagged_as_running_ahead():
    ev = summarize.summarize_events([step(1, 0, 100), x("cudaLaunchKernel", "cuda_runtime", 1, 1, correlation=3),
                                     kernel(10, 30, correlation=3)])
    assert ev["window"]["gpu_work_us"] == 30 and ev["steps"][0]["gpu_lag_us"] == 0 and ev["cpu_runs_ahead"] is False
