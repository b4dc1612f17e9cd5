"""GPU-only checks, run on the device machine (skipped without CUDA)."""

import glob
import json
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from conftest import load_offline_run, run_torchrun, run_train, single_run

import train
from steplens import scopes
from steplens.evidence import flops, snapshot, summarize
from steplens.job import data
from steplens.speedups.cuda_graph import CapturedStep
from steplens.speedups.gpu_input import DeviceBatches
from steplens.trace import reader

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SMALL = ["--device", "cuda", "--data", "synthetic", "--batch-size", "32", "--warmup-steps", "3"]


def test_gpu_profile_has_scopes_on_cpu_and_kernels_on_streams(tmp_path):
    """A CUDA trace: the four scopes on the CPU thread, kernels and H2D copies on stream tracks."""
    proc = run_train(["--mode", "profile", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    assert record["results"]["gpu_tracks"] is True and record["environment"]["gpu"] != "cpu"
    assert len(glob.glob(os.path.join(outputs, "operators", "cycle*-by-self-device.txt"))) == 2
    trace = sorted(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz")))[0]
    events = [e for e in reader.load_events(trace) if e.get("ph") == "X"]
    cpu_scopes = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert set(scopes.SCOPES) <= cpu_scopes
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and all("stream" in e.get("args", {}) for e in kernels)
    assert any(e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"] for e in events)
    assert {"input/to_device", "train/forward_backward"} <= {
        e["name"] for e in events if e.get("cat") == "gpu_user_annotation"
    }
    ev = summarize.summarize_file(trace)
    w = ev["window"]
    assert w["gpu_busy_us"] > 0 and w["gpu_busy_us"] + w["gpu_idle_us"] == pytest.approx(w["pace_us"]), w
    assert ev["gpu_idle_share"] == pytest.approx(w["gpu_idle_us"] / w["pace_us"]) and w["kernels"]["count"] > 100
    assert all(s["h2d"]["count"] == 2 for s in ev["steps"]), "one image and one target copy per step"
    assert ev["damage"] == [] and ev["window"]["gpu_work_launches"] > 100
    for c in record["results"]["cycles"]:  # Kineto's dropped records, per cycle, in run.json
        assert 0 <= c["launches_without_gpu_work"] <= c["gpu_work_launches"]


def test_gpu_bench_reports_a_rate(tmp_path):
    proc = run_train(["--mode", "bench", "--bench-steps", "10", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        results = json.load(f)["results"]
    assert results["samples_per_sec"] == pytest.approx(10 * 32 / results["window_seconds"])


def test_prefetch_stream_overlaps_the_copy_with_compute(tmp_path):
    """--prefetch-stream: the H2D copies run on a side stream, not on the stream of the kernels.

    Whether they then overlap kernels depends on the GPU having queued work at that moment: on the
    H200 this launch-bound step had none (overlap 0.0 ms), so only the separation is asserted.
    """
    proc = run_train(["--mode", "profile", "--workers", "4", "--prefetch-stream", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path)
    trace = sorted(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz")))[-1]
    events = [e for e in reader.load_events(trace) if e.get("ph") == "X"]
    copy_streams = {e["args"]["stream"] for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]}
    kernel_streams = {e["args"]["stream"] for e in events if e.get("cat") == "kernel"}
    assert copy_streams and not copy_streams & kernel_streams, (copy_streams, kernel_streams)
    assert all(st["h2d"]["count"] == 2 for st in summarize.summarize_file(trace)["steps"])


def test_captured_batch_assembly_draws_what_eager_draws():
    """--cuda-graph: each replay of the captured assembly draws new crops and flips, the same ones the
    eager path draws from the same seed, and epochs turn over on the host between replays."""
    cuda = torch.device("cuda")
    ds = data.SyntheticCIFAR10(transform=None, size=1000)  # 15 batches of 64 per epoch
    eager = DeviceBatches(ds, 64, cuda, 3, data.CIFAR10_MEAN, data.CIFAR10_STD)
    graphed = DeviceBatches(ds, 64, cuda, 3, data.CIFAR10_MEAN, data.CIFAR10_STD)
    expected = [tuple(t.clone() for t in next(eager)) for _ in range(20)]
    graphed.sync_cursor()
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(graphed.generator)
    with torch.cuda.graph(graph):
        images, targets = graphed.assemble_at_cursor()
    got = []
    for _ in range(20):
        graphed.advance()
        graph.replay()
        got.append((images.clone(), targets.clone()))
    assert graphed.epoch_restarts == eager.epoch_restarts == 1
    for i, ((ei, et), (gi, gt)) in enumerate(zip(expected, got)):
        assert torch.equal(et, gt) and torch.equal(ei, gi), f"replay {i} differs from the eager batch"
    assert not torch.equal(got[0][0], got[1][0]), "a replay must draw new numbers, not repeat the captured ones"


def test_cuda_graph_bench_reports_its_gpu_bound_share(tmp_path):
    """--cuda-graph bench: a rate, the GPU time per step of the replays, and the GPU-bound share."""
    proc = run_train(
        [
            "--mode",
            "bench",
            "--bench-steps",
            "20",
            "--gpu-input",
            "--cuda-graph",
            "--channels-last",
            "--amp",
            "bf16",
            "--fused-sgd",
            *SMALL,
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    results = record["results"]
    assert record["cuda_graph"]["graphs"] == list(scopes.SCOPES), "one graph per scope"
    assert results["gpu_time"]["replays_the_gpu_waited_for"] == 0, (
        "the step's GPU time must be timed with the GPU alone"
    )
    assert 0 < results["gpu_bound_share"] <= 1.05, results
    assert results["gpu_time_samples_per_sec"] == pytest.approx(32 / (results["gpu_ms_per_step"] / 1000))
    assert len(record["warmup_step_seconds"]) == 3 and results["loss_after_window"] > 0
    assert all(s > 0 for s in record["warmup_step_seconds"]), "warm-up steps timed by CUDA events"


@pytest.mark.parametrize("amp,precision", [("off", "tf32"), ("bf16", "bf16")])
def test_gpu_bench_logs_flops_tflops_and_mfu(tmp_path, amp, precision):
    """A CUDA bench run: FLOPs per sample, achieved TFLOP/s and MFU against the dense peak of the GPU's
    precision (torch's default cudnn.allow_tf32 makes fp32 convolutions TF32), with MFU in (0, 1);
    the driver version and the other comparable facts as Polyaxon outputs."""
    proc = run_train(["--mode", "bench", "--bench-steps", "30", "--amp", amp, *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    uuid, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    r, gpu = record["results"], record["environment"]["gpu"]
    out = load_offline_run(tmp_path, uuid)["outputs"]
    assert out["flops_per_sample"] == pytest.approx(3.33e9, rel=0.01)
    assert out["model_tflops_per_sec"] == pytest.approx(out["flops_per_sample"] * r["samples_per_sec"] / 1e12)
    assert out["env_gpu"] == gpu and out["env_driver"] == record["environment"]["driver"] is not None
    assert r["peak_precision"] == precision
    # the window's peak GPU memory: above nothing, within what the allocator reserved, logged as an output
    assert 0 < r["peak_allocated_mb"] <= r["peak_reserved_mb"] and r["peak_memory_note"] is None, r
    assert out["peak_allocated_mb"] == pytest.approx(r["peak_allocated_mb"])
    if gpu not in flops.PEAKS:
        pytest.skip(f"{gpu} has no dense peak in flops.PEAKS: MFU is null by design ({r['ceiling']['note']})")
    assert out["peak_tflops"] == flops.PEAKS[gpu][precision]
    assert out["mfu"] == pytest.approx(out["model_tflops_per_sec"] / out["peak_tflops"])
    assert 0 < out["mfu"] < 1, out
    if gpu == "NVIDIA H200":
        assert out["peak_tflops"] == {"tf32": 494.5, "bf16": 989.5}[precision]


def test_cuda_graph_profile_keeps_the_four_scopes(tmp_path):
    """Replayed graphs: the four scopes still on the CPU thread, the kernels still on the GPU tracks."""
    proc = run_train(["--mode", "profile", "--gpu-input", "--cuda-graph", "--compile", "default", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path)
    trace = sorted(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz")))[-1]
    events = [e for e in reader.load_events(trace) if e.get("ph") == "X"]
    assert set(scopes.SCOPES) <= {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert any(e.get("cat") == "cuda_runtime" and "GraphLaunch" in e["name"] for e in events)
    ev = summarize.summarize_file(trace)
    assert ev["window"]["kernels"]["count"] > 50 and all(s["h2d"]["count"] == 0 for s in ev["steps"])
    assert all(s["gpu_work_us"] > 0 for s in ev["steps"]), "graph kernels must be attributed to their step"


# --------------------------------------------------------------------------- DDP (torchrun) on GPUs
DDP_SMALL = ["--ddp", "--device", "cuda", "--data", "synthetic", "--batch-size", "32", "--warmup-steps", "3"]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def test_ddp_nccl_refuses_two_ranks_on_one_gpu(tmp_path):
    """One GPU, two ranks, NCCL: each rank exits 2 with one line saying what to do instead."""
    if torch.cuda.device_count() != 1:
        pytest.skip("needs a machine with exactly one GPU")
    proc = run_torchrun(["--mode", "bench", "--bench-steps", "5", *DDP_SMALL], tmp_path, timeout=300)
    assert proc.returncode != 0
    assert "NCCL refuses two ranks on one GPU" in proc.stderr and "--ddp-backend gloo" in proc.stderr


def test_ddp_two_ranks_share_one_gpu_through_gloo(tmp_path):
    """A smoke test, not a measurement: two ranks on cuda:0 through gloo (allreduce and broadcast of CUDA
    tensors), traces with GPU tracks per rank, the slow rank found through gloo's CPU events."""
    proc = run_torchrun(
        ["--mode", "profile", "--ddp-backend", "gloo", "--slow-rank", "1", "--slow-input-ms", "100", *DDP_SMALL],
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    assert record["distributed"]["backend"] == "gloo" and record["distributed"]["world_size"] == 2
    assert record["distributed"]["ranks_share_a_gpu"] == (torch.cuda.device_count() < 2)
    with open(os.path.join(outputs, "traces", "ranks.evidence.json")) as f:
        across = json.load(f)
    assert across["comm_source"]["0"].startswith("cpu"), "gloo communicates from the CPU side"
    assert across["per_rank"]["0"]["gpu_idle_us"] is not None, "GPU tracks expected in every rank's trace"
    assert (across["slowest_rank"], across["slow_stage"]) == (1, "input/next_batch"), across["verdict"]


@two_gpus
def test_ddp_nccl_profile_names_the_slow_rank_from_nccl_kernels(tmp_path):
    """Two GPUs, NCCL: each rank on its own device, NCCL kernels in each trace, the fast rank's exposed
    NCCL time holds the straggler's 200 ms, and steplens ranks names rank 1 and its input."""
    proc = run_torchrun(
        ["--mode", "profile", "--workers", "2", "--slow-rank", "1", "--slow-input-ms", "200", *DDP_SMALL],
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "traces", "ranks.evidence.json")) as f:
        across = json.load(f)
    assert across["comm_source"] == {"0": "nccl kernels", "1": "nccl kernels"}
    assert (across["slowest_rank"], across["slow_stage"]) == (1, "input/next_batch"), across["verdict"]
    fast, slow = across["per_rank"]["0"], across["per_rank"]["1"]
    assert fast["exposed_comm_us"] > 150_000 > slow["exposed_comm_us"], (fast, slow)
    assert slow["input_gap_us"] > 150_000, "the straggler's GPU idles while its input sleeps"
    for rank in (0, 1):
        with open(os.path.join(outputs, "ranks", "rank1.json") if rank else os.path.join(outputs, "run.json")) as f:
            assert json.load(f)["device"] == f"cuda:{rank}"


@two_gpus
@pytest.mark.parametrize("extra", [[], ["--compile", "default"]], ids=["eager", "compiled"])
def test_ddp_nccl_bench_global_rate(tmp_path, extra):
    """Global rate = world x window samples / the longest window, every rank on its own GPU."""
    n = torch.cuda.device_count()
    proc = run_torchrun(
        ["--mode", "bench", "--bench-steps", "30", "--workers", "2", *extra, *DDP_SMALL], tmp_path, nproc=n, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        r = json.load(f)["results"]
    longest = max(x["window_seconds"] for x in r["ranks"])
    assert r["world_size"] == n and r["samples_per_sec"] == pytest.approx(n * 30 * 32 / longest)
    assert sorted(x["device"] for x in r["ranks"]) == sorted(f"cuda:{i}" for i in range(n))


class TintedSet:
    """Test-only: each class a colour tint plus noise, uint8 (N, 32, 32, 3) like torchvision's CIFAR10:
    a set the model learns within a few dozen steps, so a falling loss means it trains."""

    def __init__(self, size, seed=0):
        rng = np.random.default_rng(seed)
        self.targets = rng.integers(0, 10, size=size).tolist()
        tints = rng.integers(0, 256, size=(10, 3))
        noise = rng.normal(0, 24, size=(size, 32, 32, 3))
        self.data = np.clip(tints[self.targets][:, None, None, :] + noise, 0, 255).astype(np.uint8)


@pytest.fixture
def deterministic():
    """fp32 with deterministic cuDNN algorithms, restored afterwards."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def training(dataset, batch, seed=0, lr=0.01):
    """The tutorial's model, loss and optimizer, device batches, and the eager step, all from one seed."""
    cuda = torch.device("cuda")
    torch.manual_seed(seed)
    model = train.build_model().to(cuda)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    batches = DeviceBatches(dataset, batch, cuda, seed, data.CIFAR10_MEAN, data.CIFAR10_STD)
    eager = train.make_step(batches, model, criterion, optimizer, lambda i, t: (i, t), nullcontext)
    return model, batches, criterion, optimizer, eager


def run_eager(dataset, batch, steps, **kw):
    model, _, _, _, eager = training(dataset, batch, **kw)
    losses = [float(eager().item()) for _ in range(steps)]
    return model, losses


def run_captured(dataset, batch, steps, warmup=3, **kw):
    """warmup - 1 eager steps, the capture, then replays: `steps` training steps in all."""
    model, batches, criterion, optimizer, eager = training(dataset, batch, **kw)
    captured = CapturedStep(
        torch.device("cuda"),
        eager,
        batches,
        model,
        criterion,
        optimizer,
        torch.contiguous_format,
        nullcontext,
        channels_last=False,
    )
    losses = []
    captured.warm_up(warmup, lambda: None)  # the last warm-up step is the first replay
    losses.append(float(captured.loss.item()))
    for _ in range(steps - warmup):
        losses.append(float(captured().item()))
    return model, losses, batches


def test_captured_step_trains_the_same_model_as_the_eager_step(deterministic):
    """Same seed, same batches (an epoch turns over on the host during the replays): after 8 steps the
    parameters of warm-up + capture + replays match those of 8 eager steps, and both moved from the start."""
    data = TintedSet(size=6 * 64)  # 6 batches of 64 per epoch
    torch.manual_seed(0)
    start = [p.detach().clone() for p in train.build_model().to("cuda").parameters()]
    eager_model, eager_losses = run_eager(data, 64, 8)
    graph_model, graph_losses, batches = run_captured(data, 64, 8)
    assert batches.epoch_restarts == 1
    for i, (a, b, s0) in enumerate(zip(eager_model.parameters(), graph_model.parameters(), start)):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4), f"parameter {i}: max diff {(a - b).abs().max():.2e}"
        assert not torch.equal(a, s0), f"parameter {i} never moved"
    assert graph_losses[-1] == pytest.approx(eager_losses[-1], rel=1e-3, abs=1e-4)


def test_loss_falls_on_a_learnable_set_eager_and_captured(deterministic):
    """Tinted classes: 40 steps take the loss well below its start under both paths (on a CPU, the eager
    path went from 2.25 to 0.09, mean of the first 3 to mean of the last 10)."""
    data = TintedSet(size=2048)
    _, eager_losses = run_eager(data, 64, 40)
    _, graph_losses, _ = run_captured(data, 64, 40)
    for name, losses in (("eager", eager_losses), ("captured", graph_losses)):
        early, late = np.mean(losses[:3]), np.mean(losses[-10:])
        assert late < 0.5 * early, f"{name}: loss {early:.3f} -> {late:.3f} did not fall"


def test_profiled_graph_replays_count_the_same_kernels_and_stay_within_the_event_timed_gpu_time(tmp_path):
    """--cuda-graph, batch 128 (GPU-bound): every profiled replay counts the same kernels in both cycles,
    the GPU work launched per step stays within the bench's event-timed GPU time per step (5% for the
    profiler's own slowdown, see test_summarize.PROFILED_GPU_SLOWDOWN), the idle share is read on the GPU's
    timeline and is small, and the profiler's distortion is stated."""
    flags = ["--gpu-input", "--cuda-graph", *SMALL, "--batch-size", "128"]
    bench = run_train(["--mode", "bench", "--bench-steps", "50", *flags], tmp_path / "bench")
    assert bench.returncode == 0, bench.stderr
    _, outputs = single_run(tmp_path / "bench")
    with open(os.path.join(outputs, "run.json")) as f:
        gpu_ms = json.load(f)["results"]["gpu_ms_per_step"]
    proc = run_train(["--mode", "profile", *flags], tmp_path / "profile")
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path / "profile")
    with open(os.path.join(outputs, "run.json")) as f:
        results = json.load(f)["results"]
    counts = []
    for trace in sorted(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz"))):
        ev = summarize.summarize_file(trace)
        counts += [s["kernels"]["count"] for s in ev["steps"]]
        assert ev["cpu_runs_ahead"] and ev["idle_basis"] == "gpu_timeline", trace
        assert ev["gpu_idle_share"] < 0.15 and ev["input_gap_share"] == 0, trace
    assert len(counts) == 6 and len(set(counts)) == 1, counts
    head = results["evidence"]
    assert head["gpu_work_ms_per_step"] <= head["gpu_span_ms_per_step"]
    assert head["gpu_work_ms_per_step"] <= gpu_ms * 1.05, (head["gpu_work_ms_per_step"], gpu_ms)
    assert head["profiler_distortion"] == pytest.approx(head["profiled_step_ms"] / head["unprofiled_step_ms"])


def test_memory_snapshot_records_three_steps_and_summarizes_them(tmp_path):
    """--memory-snapshot: the pickle and its summary beside run.json, logged; the summary's groups sum to its peak,
    which (the bytes asked for, less frees waiting on a stream) is at most torch's own allocated peak over the same
    steps (the allocator's blocks); parameters and activations are told apart;
    both timings recorded, and the bench window after it still measured."""
    proc = run_train(["--mode", "bench", "--bench-steps", "10", "--memory-snapshot", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    snap = record["memory_snapshot"]
    assert os.path.isfile(snap["file"]) and os.path.isfile(snap["summary"]) and snap["summary_error"] is None
    assert {os.path.relpath(snap[k], outputs) for k in ("file", "summary")} <= set(record["artifacts"])
    for timing in (snap["recorded"], snap["unrecorded"]):
        assert len(timing["step_seconds"]) == 3 and timing["wall_seconds"] > 0
    assert snap["recorded_over_unrecorded"] == pytest.approx(
        snap["recorded"]["wall_seconds"] / snap["unrecorded"]["wall_seconds"], rel=1e-3
    )
    assert 0 < snap["history_entries"] < snap["max_entries"]
    summary = snapshot.summarize(snapshot.load(snap["file"]), top=10_000)
    (d,) = summary["devices"]
    assert 0 < snap["peak_bytes"] - snap["pending_free_at_peak_bytes"] <= snap["torch_peak_allocated_bytes"], snap
    assert d["mismatches"] == 0 and d["end_bytes"] == d["end_state_bytes"] <= d["end_state_block_bytes"]
    assert sum(g["bytes"] for g in d["groups"]) == d["peak_bytes"] == snap["peak_bytes"]
    assert {"parameters", "activations"} <= set(d["by_class"]), d["by_class"]
    assert record["results"]["samples_per_sec"] > 0
