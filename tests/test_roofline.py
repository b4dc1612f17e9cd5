"""evidence/work.py and evidence/roofline.py: each kernel class's work, its rate and how far from the GPU's limit."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

import train
from steplens.evidence import flops, roofline, work

H200 = "NVIDIA H200"
STORED = sorted(
    p
    for p in glob.glob(os.path.join(ROOT, "results", "h200-*", "**", "*.pt.trace.json.gz"), recursive=True)
    if not os.path.islink(p)
)
EAGER_FULL = (  # batch 128, fp32, profiled with record_shapes
    "results/h200-reprofile/eager/runs/4220df20529845b38750930bef04749a/outputs/traces/trace-cycle1-steps2-4.pt.trace.json.gz"
)


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _op(name, ts, dur, dims, types, concrete=None, tid=1):
    return _x(
        name, "cpu_op", ts, dur, tid, **{"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or []}
    )


def _launch(corr, ts, kernel, start, dur, cat="kernel", tid=1, call="cudaLaunchKernel", **args):
    """A launch call on thread tid and the GPU event it started on stream 7, linked by correlation id."""
    gpu = {"ph": "X", "name": kernel, "cat": cat, "ts": start, "dur": dur, "pid": 0, "tid": 7}
    gpu["args"] = {"stream": 7, "correlation": corr, **args}
    return [_x(call, "cuda_runtime", ts, 1.0, tid, correlation=corr), gpu]


F, CONV = "float", [[8, 3, 32, 32], [16, 3, 3, 3]]
Y = [8, 16, 32, 32]  # the convolution's output: 131,072 elements, 524,288 bytes in fp32


def made_eager_trace():
    """One step: a convolution (inside a wrapper operator no rule knows: the innermost operator must be read)
    with a layout conversion beside its kernel, a batch-norm, an in-place add, an operator without a rule, a
    launch outside any operator, the optimizer's tensor lists, a memset, a host copy; on the autograd thread
    the convolution's backward (both gradients) and a bf16 matrix multiply."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0.0, 1000.0)]
    ev += [_op("aten::my_conv_wrapper", 10, 50, [], [])]
    ev += [_op("aten::cudnn_convolution", 12, 38, CONV, [F, F] + ["ScalarList"] * 3 + ["Scalar"] * 4,
               ["", "", "[1, 1]", "[1, 1]", "[1, 1]", "1", "False", "False", "True"])]  # fmt: skip
    ev += _launch(1, 20, "sm90_xmma_fprop_implicit_gemm_x", 100, 40)
    ev += _launch(2, 30, "void cudnn::engines_precompiled::nchwToNhwcKernel<float>", 140, 5)
    ev += [_op("aten::cudnn_batch_norm", 70, 20, [Y, [16], [16], [16], [16], [], [], []], [F] * 5 + ["Scalar"] * 3)]
    ev += _launch(3, 75, "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>", 150, 10)
    ev += [_op("aten::add_", 95, 10, [Y, Y, []], [F, F, "Scalar"])]
    ev += _launch(4, 97, "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", 160, 10)
    ev += [_op("aten::my_op", 110, 10, [Y], [F])]
    ev += _launch(5, 112, "void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>", 170, 5)
    ev += _launch(6, 125, "void at::native::vectorized_elementwise_kernel<4, relu>", 175, 5)
    ev += [_op("aten::_foreach_add_", 130, 10, [[], []], ["TensorList", "TensorList"])]
    ev += _launch(7, 132, "void at::native::multi_tensor_apply_kernel<foo>", 180, 10)
    ev += _launch(8, 142, "Memset (Device)", 190, 2, cat="gpu_memset", call="cudaMemsetAsync", bytes=4096)
    ev += _launch(
        9, 144, "Memcpy HtoD (Pinned -> Device)", 192, 8, cat="gpu_memcpy", call="cudaMemcpyAsync", bytes=98304
    )
    backward = ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    ev += [
        _op("aten::convolution_backward", 200, 60, [Y, *CONV] + [[]] * 8, [F, F, F] + ["ScalarList"] * 8, backward, 2)
    ]
    ev += _launch(10, 210, "sm90_xmma_dgrad_implicit_gemm_x", 300, 30, tid=2)
    ev += _launch(11, 220, "sm90_xmma_wgrad_indexed_implicit_gemm_x", 330, 50, tid=2)
    bf = "c10::BFloat16"
    ev += [_op("aten::mm", 270, 10, [[8, 16], [16, 4]], [bf, bf], tid=2)]
    ev += _launch(12, 272, "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16>", 380, 2, tid=2)
    return ev


# FLOPs 2 x 131,072 outputs x 27; bytes: input 98,304 + weight 1,728 + output 524,288
CONV_FLOPS, CONV_BYTES = 2 * 131072 * 27, 98304 + 1728 + 524288


def test_a_made_eager_trace_gives_the_known_flops_and_bytes_per_class():
    r = roofline.roofline_section(made_eager_trace(), gpu=H200)
    c = r["classes"]
    assert r["source"] == "operators" and r["steps"] == 1
    for cls, us in (
        ("convolution forward", 40),
        ("convolution data-gradient", 30),
        ("convolution weight-gradient", 50),
    ):
        assert (c[cls]["flops"], c[cls]["bytes"], c[cls]["us"], c[cls]["counted_us"]) == (
            CONV_FLOPS,
            CONV_BYTES,
            us,
            us,
        )
    # batch-norm: reads x and 4 channel vectors (64 bytes each), writes y and 4 vectors
    assert c["batch-norm"]["bytes"] == 524288 + 4 * 64 + 524288 + 4 * 16 * 4
    # add_ in place: reads both, writes the first; the unknown operator and the launch outside any are apart
    assert (c["elementwise and activation"]["bytes"], c["elementwise and activation"]["counted_us"]) == (3 * 524288, 10)
    assert c["elementwise and activation"]["us"] == 20
    assert (c["matrix multiply"]["flops"], c["matrix multiply"]["bytes"]) == (2 * 8 * 4 * 16, (128 + 64 + 32) * 2)
    assert c["matrix multiply"]["precision"] == "bf16" and c["convolution forward"]["precision"] == "tf32"
    assert (c["copies and memsets"]["bytes"], c["copies and memsets"]["counted_us"], c["copies and memsets"]["us"]) == (
        4096,
        2,
        15,
    )
    assert c["optimizer"]["counted_us"] == 0 and c["optimizer"]["of_limit"] is None
    apart = {k.split(" (")[0]: v["us"] for k, v in r["not_counted"].items()}
    assert apart == {
        "not in the work model of aten::cudnn_convolution": 5,
        "no work model for aten::my_op": 5,
        roofline.NO_OPERATOR.split(" (")[0]: 5,
        "tensor lists": 10,
        roofline.HOST_COPY: 8,
    }, apart
    assert r["total"]["us"] == 40 + 30 + 50 + 10 + 20 + 2 + 10 + 15


def test_the_limit_is_the_larger_of_the_compute_and_memory_floors():
    """The made convolution moves 624,320 bytes (0.130 us at 4.8 TB/s) for 7.1 MFLOP (0.014 us at the TF32 peak):
    memory binds, and its 40 us reach 0.130 / 40 of it."""
    c = roofline.roofline_section(made_eager_trace(), gpu=H200)["classes"]["convolution forward"]
    memory_us = CONV_BYTES / 4.8e6
    assert c["limit"] == "memory" and c["floor_us"] == pytest.approx(memory_us)
    assert c["of_limit"] == pytest.approx(memory_us / 40) and c["above_floor_us"] == pytest.approx(40 - memory_us)
    assert c["achieved_tflops"] == pytest.approx(CONV_FLOPS / 40e6) and c["achieved_gbps"] == pytest.approx(
        CONV_BYTES / 40e3
    )
    row = roofline.limit_row(10.0, 10.0, 1e9, 1e6, {"bf16", "tf32"}, flops.PEAKS[H200])  # 1 GFLOP, 1 MB in 10 us
    assert row["limit"] == "compute" and row["precision"] == "bf16"  # mixed precisions: the higher ceiling
    assert row["floor_us"] == pytest.approx(1e9 / 989.5e6) and row["of_limit"] == pytest.approx(1e9 / 989.5e6 / 10)


def test_a_rate_above_the_peak_is_refused_as_a_wrong_count_or_peak():
    row = roofline.limit_row(1.0, 1.0, 0, 10e6, set(), flops.PEAKS[H200])  # 10 TB/s on a 4.8 TB/s GPU
    assert row["of_limit"] is None and "wrong" in row["null_reason"]


def test_a_gpu_without_peaks_keeps_its_rates_and_says_why_it_has_no_limit():
    r = roofline.roofline_section(made_eager_trace(), gpu="NVIDIA GeForce RTX 4090")
    c = r["classes"]["convolution forward"]
    assert c["achieved_gbps"] == pytest.approx(CONV_BYTES / 40e3) and c["of_limit"] is None
    assert c["null_reason"] == "no peaks known for this GPU" and any("no peaks known" in n for n in r["notes"])


def test_a_cpu_only_trace_has_no_roofline_and_one_line_why(tmp_path, capsys):
    events = [_x("ProfilerStep#1", "user_annotation", 0.0, 10.0), _op("aten::mm", 1, 2, [[2, 2], [2, 2]], [F, F])]
    r = roofline.roofline_section(events)
    assert r["classes"] is None and r["null_reason"].startswith("no roofline: no GPU events")
    path = tmp_path / "cpu.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert roofline.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[1].startswith("no roofline: no GPU events"), out


def tiny_model():
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 2),
    )


def test_the_layers_of_a_small_model_give_their_known_work():
    """Batch 2 of 3x8x8 images, fp32: the convolution (no data-gradient: the images need none), batch-norm's
    3 passes of statistics and 5 of normalization, the pooling, the linear layer's three passes and bias
    gradient, the loss, and SGD without momentum (12 bytes a parameter)."""
    w = work.model_work(tiny_model, 2, "off", None, (3, 8, 8))
    conv = 2 * 512 * 27
    assert w["classes"] == {
        "convolution forward": {"flops": conv, "bytes": (384 + 108 + 512) * 4},
        "convolution weight-gradient": {"flops": conv, "bytes": (512 + 384 + 108) * 4},
        "batch-norm": {"flops": 0, "bytes": 3 * 512 * 4},
        "elementwise and activation": {"flops": 0, "bytes": 5 * 512 * 4},
        "reductions and the loss": {"flops": 0, "bytes": (512 + 8) * 4 + (4 + 2) * 4 + 2 * 4 * 4 + 2 * 8},
        "matrix multiply": {"flops": 3 * 32, "bytes": (8 + 8 + 2 + 4) * 4 + 2 * (4 + 8 + 8) * 4},
        "optimizer": {"flops": 0, "bytes": 12 * (108 + 8 + 10)},
    }
    bf16 = work.model_work(tiny_model, 2, "bf16", 0.9, (3, 8, 8))
    assert bf16["precision"] == "bf16" and bf16["classes"]["optimizer"]["bytes"] == 20 * 126
    assert bf16["classes"]["elementwise and activation"]["bytes"] == 5 * 512 * 2 + 12 * (108 + 10)  # and the casts


@pytest.mark.parametrize("batch", [128, 1024])
def test_the_graphed_path_s_class_flops_sum_to_flops_py_s_count_times_the_batch(batch):
    per_sample = flops.training_flops(train.build_model)["flops_per_sample"]
    w = work.model_work(train.build_model, batch, "bf16", 0.9)
    assert sum(c["flops"] for c in w["classes"].values()) == per_sample * batch
    assert w["layers_not_counted"] == {} and w["parameters"] == sum(p.numel() for p in train.build_model().parameters())


def test_the_eager_trace_s_operators_give_the_model_s_convolution_flops():
    """The stored eager H200 trace with shapes (batch 128, fp32) and the model's layers count the same FLOPs."""
    r = roofline.roofline_section(os.path.join(ROOT, EAGER_FULL))
    w = work.model_work(train.build_model, 128, "off")
    assert r["gpu"] == H200 and r["source"] == "operators"
    for cls in ("convolution forward", "convolution data-gradient", "convolution weight-gradient"):
        assert r["classes"][cls]["flops"] == w["classes"][cls]["flops"], cls


@pytest.fixture(scope="module")
def stored_rooflines():
    assert len(STORED) >= 50, f"{len(STORED)} stored traces under results/h200-*: did results/ move?"
    out = {}
    for path in STORED:
        graphed = roofline.run_settings(path).get("batch_size")
        model = roofline.model_for(path, train.build_model, None, None) if graphed else None
        out[path] = roofline.roofline_section(path, model=model)
    return out


def test_on_the_stored_h200_traces_no_class_runs_above_a_peak(stored_rooflines):
    """The invariant: no class's achieved TFLOP/s or GB/s exceeds the H200's peak, from the operators (eager
    traces with shapes) or the model (CUDA-graph traces), and none was refused as above one."""
    checked = {"operators": 0, "model": 0}
    for path, r in stored_rooflines.items():
        assert r["gpu"] == H200, path
        for cls, c in r["classes"].items():
            assert not (c["null_reason"] or "").endswith("is wrong"), f"{path} {cls}: {c['null_reason']}"
            if c["of_limit"] is None:
                continue
            checked[r["source"]] += 1
            assert 0 < c["of_limit"] <= 1, f"{path} {cls}: {c['of_limit']}"
            assert c["achieved_gbps"] is None or c["achieved_gbps"] <= c["peak_gbps"], f"{path} {cls}"
            assert c["achieved_tflops"] is None or c["achieved_tflops"] <= c["peak_tflops"], f"{path} {cls}"
    assert checked["operators"] >= 50 and checked["model"] >= 100, checked


def test_the_cli_prints_json_and_refuses_bad_input_in_one_line(tmp_path):
    trace = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"deviceProperties": [{"name": H200}], "traceEvents": made_eager_trace()}, f)
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "steplens", "roofline", *a], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    proc = run(str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["gpu"] == H200 and r["classes"]["convolution forward"]["flops"] == CONV_FLOPS
    text = run(str(trace)).stdout
    assert "convolution forward" in text and roofline.BYTES_NOTE in text and "of limit" in text
    for args, words in (
        (["missing.json"], "no such trace"),
        ([str(trace), "--model", "nocolon"], "MODULE:FUNCTION"),
        ([str(trace), "--model", "train:no_such_function"], "has no function"),
        ([str(trace), "--batch-size", "0"], "positive integer"),
    ):
        proc = run(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


def test_a_graph_step_without_its_batch_size_is_refused_in_one_line(tmp_path):
    """--model needs the batch size: from the flag or the run.json beside the trace."""
    graph = next(p for p in STORED if "h200-pictures" in p)  # stored without a run.json
    proc = subprocess.run(
        [sys.executable, "-m", "steplens", "roofline", graph, "--model", "train:build_model"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "give --batch-size" in proc.stderr and proc.stderr.count("\n") == 1


def test_every_gpu_with_a_compute_peak_has_its_memory_bandwidth_from_its_datasheet():
    for name, p in flops.PEAKS.items():
        assert p["memory_tb_per_s"] > 0 and "datasheet" in p["memory_source"], name
    assert flops.PEAKS[H200]["memory_tb_per_s"] == 4.8 and "4.8 TB/s" in flops.PEAKS[H200]["memory_source"]


def test_the_gpu_name_is_read_from_the_trace_s_device_properties(tmp_path):
    assert roofline.device_name(os.path.join(ROOT, EAGER_FULL)) == H200
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"traceEvents": [], "deviceProperties": [{"name": "late"}]}))
    assert roofline.device_name(str(bare)) is None  # written after the events: not read


def test_the_next_try_gives_more_rounds_only_to_levers_whose_first_3_pairs_gain_2_percent(tmp_path):
    """scripts/next_try_128.sh round 4, with a stand-in Python for the jobs: after round 3 pointwise's paired
    ratios have a median of 1.03 and combo's 1.01, so round 4 runs the best set and pointwise alone."""
    root = tmp_path / "root"
    (root / "comparison").mkdir(parents=True)
    groups = [
        {"group": "defaults", "pairs": []},
        {"group": "inductor_tuning=pointwise", "pairs": [{"ratio": r} for r in (1.03, 1.01, 1.04)]},
        {"group": "inductor_tuning=combo", "pairs": [{"ratio": r} for r in (1.01, 1.00, 1.05)]},
    ]
    (root / "comparison" / "comparison.json").write_text(json.dumps({"tables": [{"groups": groups}]}))
    stub = tmp_path / "py"  # runs the script's own Python snippet, logs every other call
    stub.write_text(f'#!/bin/sh\n[ "$1" = - ] && exec {sys.executable} "$@"\necho "$*" >> {tmp_path}/calls\n')
    stub.chmod(0o755)
    script = os.path.join(ROOT, "scripts", "next_try_128.sh")
    env = {**os.environ, "PY": str(stub), "PIN": ""}
    proc = subprocess.run(["bash", script, str(root), "4"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (root / "levers-after-round-3.txt").read_text() == "pointwise\n"
    jobs = [c for c in (tmp_path / "calls").read_text().splitlines() if "train.py" in c]
    assert len(jobs) == 2 and all("--repeat 4" in j and "--batch-size 128" in j for j in jobs), jobs
    assert sum("--inductor-tuning pointwise" in j for j in jobs) == 1 and not any("combo" in j for j in jobs)
    bad = subprocess.run(["bash", script, str(root), "7"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_class_table_adds_each_class_s_share_of_its_limit_and_draws_it(tmp_path):
    """scripts/class_table.py --roofline on the made eager trace: the roofline table follows the class table,
    with the convolution's share of the memory limit; --roofline-png draws it; --model alone is refused."""
    pytest.importorskip("matplotlib")
    traces = tmp_path / "run" / "outputs" / "traces"
    traces.mkdir(parents=True)
    trace = traces / "t.pt.trace.json"
    trace.write_text(json.dumps({"deviceProperties": [{"name": H200}], "traceEvents": made_eager_trace()}))
    (traces.parent / "run.json").write_text(json.dumps({"settings": {"batch_size": 8}, "environment": {"gpu": H200}}))
    script = os.path.join(ROOT, "scripts", "class_table.py")
    out, png = tmp_path / "t.md", tmp_path / "r.png"
    run = lambda *a: subprocess.run([sys.executable, script, *a], cwd=ROOT, capture_output=True, text=True, timeout=300)  # noqa: E731
    proc = run(str(trace), "--roofline", "--out", str(out), "--roofline-png", str(png))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    share = CONV_BYTES / 4.8e6 / 40
    assert "Roofline by kernel class" in text and f"| convolution forward | {share:.1%} (memory); 0.040 |" in text, text
    assert png.stat().st_size > 0
    refused = run(str(trace), "--model", "train:build_model")
    assert refused.returncode == 2 and "--roofline" in refused.stderr
