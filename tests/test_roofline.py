"""evidence/work.py and evidence/roofline.py: each kernel class's work, its rate and how far from the GPU's limit."""

import builtins
import glob
import gzip
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

import train
from steplens.evidence import flops, roofline, summarize, work
from steplens.project import compare
from steplens.trace import reader

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
    # 24 since 2026-12-06: results/ keeps the traces a test or a page cites
    assert len(STORED) >= 20, f"{len(STORED)} stored traces under results/h200-*: did results/ move?"
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
    # 31 and 112 since 2026-12-06, when results/ kept fewer eager traces with shapes (it was 50 or more before)
    assert checked["operators"] >= 30 and checked["model"] >= 100, checked


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


def test_the_gpu_name_is_read_from_the_trace_s_device_properties_in_the_same_pass(tmp_path):
    """iter_events keeps deviceProperties as the stream passes it, before or after the events."""
    meta = {}
    assert sum(1 for _ in reader.iter_events(os.path.join(ROOT, EAGER_FULL), meta=meta)) > 0
    assert roofline.device_of(meta) == H200
    late = tmp_path / "late.json"
    late.write_text(json.dumps({"traceEvents": [], "deviceProperties": [{"name": "late"}]}))
    meta = {}
    assert list(reader.iter_events(str(late), meta=meta)) == [] and roofline.device_of(meta) == "late"
    assert roofline.device_of({}) is None and roofline.device_of({"deviceProperties": "x"}) is None


def write_trace(path, events):
    path.write_text(json.dumps({"deviceProperties": [{"name": H200}], "traceEvents": events}))
    return str(path)


def figures(r):
    """A roofline's figures, without the trace's name and the reader's damage report."""
    return {k: v for k, v in r.items() if k not in ("trace", "damage", "damage_withheld")}


def test_a_kernel_and_an_operator_written_twice_give_the_clean_roofline_and_a_damage_line(tmp_path, capsys):
    """The roofline reads as summarize does: the second copies are removed (operators too, in the second pass)
    and one line says so; the figures equal the clean trace's."""
    clean = made_eager_trace()
    kernel = next(e for e in clean if e["name"] == "sm90_xmma_fprop_implicit_gemm_x")
    op = next(e for e in clean if e["name"] == "aten::cudnn_batch_norm")
    dup = write_trace(tmp_path / "dup.pt.trace.json", clean + [dict(kernel), dict(op)])
    r, ref = roofline.roofline_section(dup), roofline.roofline_section(write_trace(tmp_path / "c.json", clean))
    assert figures(r) == figures(ref) and r["classes"]["convolution forward"]["us"] == 40
    assert [d["kind"] for d in r["damage"]] == ["duplicate"] and r["damage"][0]["count"] == 2
    assert r["damage_withheld"] is None and r["null_reason"] is None
    assert roofline.main([dup]) == 0
    out = capsys.readouterr().out
    assert "damaged: 2 complete events written twice (same name, track, start, duration and ids) (removed" in out
    assert out.replace(out.splitlines()[1] + "\n", "", 1).replace(dup, "T") == roofline.format_roofline(
        {**ref, "trace": "T"}
    ), "the same table as the clean trace's, the damage line aside"


def test_damage_to_a_gpu_event_withholds_the_roofline_with_the_reason(tmp_path, capsys):
    """A kernel with a negative duration is skipped: its class would read too little time, so no roofline."""
    events = made_eager_trace()
    next(e for e in events if e["cat"] == "kernel")["dur"] = -1
    path = write_trace(tmp_path / "bad.pt.trace.json", events)
    r = roofline.roofline_section(path)
    assert r["classes"] is None and r["null_reason"].startswith(roofline.WITHHELD), r["null_reason"]
    assert "1 complete events with a negative dur" in r["null_reason"]
    assert roofline.main([path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("damaged: 1 complete events with a negative dur") and lines[2] == r["null_reason"]


def test_summarize_roofline_reads_the_file_once_and_equals_steplens_roofline(tmp_path, monkeypatch, capsys):
    """One open of the trace for the evidence, the GPU's name and the roofline; three where events were written
    twice (the one-pass read finds two alike, the exact read finds them and reads without them), as summarize
    needs without --roofline. The roofline is steplens roofline's; the damage line once."""
    clean = write_trace(tmp_path / "clean.pt.trace.json", made_eager_trace())
    dup = write_trace(tmp_path / "dup.pt.trace.json", made_eager_trace() + [made_eager_trace()[3]])
    expected = {p: roofline.roofline_section(p) for p in (clean, dup)}
    opened, real_open = [], builtins.open

    def counting(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    for path, opens in ((clean, 1), (dup, 3)):
        opened.clear()
        ev = summarize.summarize_file(path, with_roofline=True)
        assert opened.count(path) == opens, opened
        assert ev["roofline"] == expected[path] and ev["roofline"]["gpu"] == H200
        opened.clear()
        assert summarize.summarize_file(path)["damage"] == ev["damage"] and opened.count(path) == opens
    opened.clear()
    assert summarize.main([dup, "--roofline"]) == 0
    out = capsys.readouterr().out
    assert opened.count(dup) == 3 and out.count("complete events written twice") == 1, out
    assert roofline.format_roofline(expected[dup], damage=False) in out


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


# --------------------------------------------------------------------------- compare's evidence section

FACTS = {"env_host": "vm", "env_gpu": H200, "env_driver": "580", "env_torch": "2.11.0+cu130", "env_cuda": "13.0"}


def offline_run(root, uuid, minute, settings, outputs, trace_events=None, trace_name="trace-cycle1.pt.trace.json"):
    """An offline run folder; a profile run's run.json lists its trace at the path of the machine that wrote it
    (/elsewhere/...), and the trace lies in the folder's outputs/traces unless trace_events is None."""
    base = root / "runs" / uuid
    (base / "outputs" / "traces").mkdir(parents=True)
    plx = {"uuid": uuid, "name": uuid, "created_at": f"2026-12-05T10:{minute:02d}:00+00:00", "status": "succeeded"}
    (base / "run.plx.json").write_text(json.dumps({**plx, "inputs": settings, "outputs": {**FACTS, **outputs}}))
    if settings["mode"] == "profile":
        cycles = [{"cycle": 1, "trace": f"/elsewhere/runs/{uuid}/outputs/traces/{trace_name}"}]
        (base / "outputs" / "run.json").write_text(json.dumps({"settings": settings, "results": {"cycles": cycles}}))
        if trace_events is not None:
            write_trace(base / "outputs" / "traces" / trace_name, trace_events)


def made_study(root, profile_events, **profile):
    """Bench runs of workers 0 and 4 (two each) and one profile run of workers 0 with the given trace."""
    for i in range(2):
        for w, workers in enumerate((0, 4)):
            settings = {"mode": "bench", "workers": workers, "batch_size": 8, "repeat": i}
            offline_run(root, f"b{i}{w}", 2 * i + w, settings, {"samples_per_sec": 1000.0 + 100 * w + i})
    settings = {"mode": "profile", "workers": 0, "batch_size": 8}
    outputs = {"profiled_step_ms": 1.0, "gpu_idle_share": 0.1, "input_gap_share": 0.0}
    offline_run(root, "p0", 30, settings, outputs, profile_events, **profile)
    return root / "runs" / "p0" / "outputs" / "traces" / profile.get("trace_name", "trace-cycle1.pt.trace.json")


def compared(root, out, *args):
    assert compare.main(["--offline", str(root), "--out", str(out), *args]) == 0
    groups = json.loads((out / "comparison.json").read_text())["tables"][0]["groups"]
    return {g["group"]: g for g in groups}, (out / "comparison.md").read_text()


def test_compare_shows_the_roofline_of_a_group_s_profile_trace(tmp_path, capsys):
    """The made eager trace as the profile run of workers=0: the group's roofline is steplens roofline's on it,
    each class's rate against its peak and its share of the limit; workers=4 has no profile run, so no line."""
    trace = made_study(tmp_path / "offline", made_eager_trace())
    groups, text = compared(tmp_path / "offline", tmp_path / "out")
    r = groups["workers=0"]["evidence"]["roofline"]
    assert figures(r) == figures(roofline.roofline_section(str(trace))) and r["gpu"] == H200
    assert groups["workers=4"]["evidence"] is None
    share = CONV_BYTES / 4.8e6 / 40
    assert f"| convolution forward | {CONV_BYTES / 40e3:.3g} of 4,800 GB/s ({share:.1%}) |" in text, text
    assert f"  - not counted: 0.008 ms per step, 1 kernels: {roofline.HOST_COPY}" in text, "each reason, as roofline's"
    assert "| optimizer | - |" in text, "a class with no work counted"
    assert f"Note: {roofline.BYTES_NOTE}." in text and "- workers=4" not in text.split("Roofline by kernel")[1]
    capsys.readouterr()


def test_compare_says_why_a_group_has_no_roofline(tmp_path, capsys):
    """A CPU-only trace, a trace not on this machine, a graph trace without --model, a damaged trace: one line
    each, with the reason the roofline gives elsewhere."""
    cpu = [_x("ProfilerStep#1", "user_annotation", 0.0, 10.0), _op("aten::mm", 1, 2, [[2, 2], [2, 2]], [F, F])]
    duplicated = made_eager_trace() + [made_eager_trace()[5]]
    graph = [_x("ProfilerStep#1", "user_annotation", 0.0, 1000.0)]
    graph += _launch(1, 10, "sm90_xmma_fprop_implicit_gemm_x", 100, 40, call="cudaGraphLaunch")
    for name, events, words in (
        ("cpu", cpu, "no roofline: no GPU events"),
        ("absent", None, "no roofline: the run's traces are not on this machine (1 listed in its run.json)"),
        ("graph", graph, "no roofline: no work counted (launched by a CUDA graph replay"),
        ("dup", duplicated, "damaged: 1 complete events written twice"),
    ):
        made_study(tmp_path / name, events)
        groups, text = compared(tmp_path / name, tmp_path / f"out-{name}")
        section = text.split("Roofline by kernel class")[1]
        assert words in section, (name, section)
        r = groups["workers=0"]["evidence"]["roofline"]
        assert (r["classes"] is None or r["null_reason"] is not None) == (name != "dup"), name
    capsys.readouterr()


def test_compare_refuses_a_bad_model_in_one_line(tmp_path, capsys):
    made_study(tmp_path / "offline", made_eager_trace())
    assert compare.main(["--offline", str(tmp_path / "offline"), "--out", str(tmp_path / "o"), "--model", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MODULE:FUNCTION" in err and not (tmp_path / "o").exists()


def test_compare_s_roofline_on_the_stored_h200_runs_equals_steplens_roofline(tmp_path, monkeypatch, capsys):
    """results/h200-warmup: batch 128 and 256 have a lean profile run with its CUDA-graph trace. compare
    --model train:build_model gives each the roofline steplens roofline --model gives the same trace, and its
    table shows the same share of the limit per class."""
    monkeypatch.chdir(ROOT)
    runs = os.path.join("results", "h200-warmup", "offline", "runs")
    cycle = os.path.join("outputs", "traces", "trace-cycle1-steps2-4.pt.trace.json.gz")
    traces = {
        g: glob.glob(os.path.join(runs, u + "*", cycle))[0]
        for g, u in (("batch_size=128", "800f5572"), ("batch_size=256", "ea5ded09"))
    }
    groups, text = compared(
        os.path.join("results", "h200-warmup", "offline"), tmp_path, "--per-host", "--model", "train:build_model"
    )
    capsys.readouterr()
    assert roofline.main([*traces.values(), "--model", "train:build_model", "--json"]) == 0
    alone = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    section = text.split("Roofline by kernel class")[1]
    for (group, trace), r in zip(traces.items(), alone):
        mine = groups[group]["evidence"]["roofline"]
        assert mine["trace"] == trace == r["trace"] and figures(mine) == figures(r), group
        assert mine["source"] == "model" and sum(c["of_limit"] is not None for c in mine["classes"].values()) >= 6
    for cls in ("convolution forward", "batch-norm", "optimizer"):
        row = next(line for line in section.splitlines() if line.startswith(f"| {cls} |"))
        assert [f"({r['classes'][cls]['of_limit']:.1%})" in cell for r, cell in zip(alone, row.split(" | ")[1:])] == [
            True,
            True,
        ], row
    assert "batch_size=512" not in section, "no profile run of batch 512 in this study: no roofline line"
