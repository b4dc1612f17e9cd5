"""trace/kernels.py: each GPU event's class from its name, and the GPU time by class that steplens summarize reports."""

import glob
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from steplens.atomic import run_record_near
from steplens.evidence import attribution, diagnosis, formatting, summarize
from steplens.job import runrecord
from steplens.project import compare, runs
from steplens.trace import kernels

STORED = sorted(
    p
    for p in glob.glob(os.path.join(ROOT, "results", "h200-*", "**", "*.pt.trace.json.gz"), recursive=True)
    if not os.path.islink(p)
)


def test_the_stored_h200_traces_are_there():
    """The loops below over STORED would pass on no trace at all: 24 stored H200 traces are files today (fewer since
    2026-12-06: results/ keeps the traces a test or a page cites)."""
    assert len(STORED) >= 20, f"{len(STORED)} stored traces found under results/h200-*: did results/ move?"


OTHER_AT_MOST = 0.01  # the share of "other" allowed on the stored H200 traces (it is 0 on each of them today)

# Real names from the stored H200 traces (results/h200-reprofile, results/h200-pictures), then hand-made ones
# for the rules the stored traces do not reach (nvjet, NCCL, triton templates and combo kernels).
NAMES = [
    (
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_"
        "execute_segment_k_off_kernel__5x_cudnn",
        "convolution forward",
    ),
    (
        "sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize256x64x8_stage3_warpsize2x2x1_g1_ffma_"
        "aligna4_alignc4_execute_kernel__5x_cudnn",
        "convolution forward",
    ),
    (
        "void convolve_common_engine_float_NHWC<__nv_bfloat16, __nv_bfloat16, 1024, 6, 7, 3, 3, 5, true, false, false, "
        "false, false>(int, int, int)",
        "convolution forward",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>"
        "(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8::Params)",
        "convolution forward",
    ),
    (
        "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::fprop::"
        "Warp_specialized_params_non_template<xmma__5x_cudnn::Grid_constant_params> >",
        "convolution forward",
    ),
    (
        "sm90_xmma_dgrad_implicit_gemm_indexed_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1_g1_"
        "strided_execute_kernel__5x_cudnn",
        "convolution data-gradient",
    ),
    (
        "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*)",
        "convolution data-gradient",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_256x64_16x4_nhwc_unity_stride_align4>"
        "(cutlass_tensorop_s1688dgrad_optimized_tf32_256x64_16x4_nhwc_unity_stride_align4::Params)",
        "convolution data-gradient",
    ),
    (
        "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_warpgroupsize1x1x1_g1_"
        "execute_split_k_kernel__5x_cudnn",
        "convolution weight-gradient",
    ),
    (
        "void wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, float const*, int, float*)",
        "convolution weight-gradient",
    ),
    (
        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMultistage"
        "INS_4gemm9GemmShapeILi64ELi64ELi32EEENS4_52Conv2dWgradOutputGradientTileAccessIteratorOp",
        "convolution weight-gradient",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<cutlass__5x_cudnn::"
        "MatrixShape<4, 256>, cutlass__5x_cudnn::epilogue::thread::LinearCombination<float, 4> > >",
        "convolution weight-gradient",
    ),
    (
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(cutlass_80_simt_sgemm_128x64_8x5_nn_align1::"
        "Params)",
        "matrix multiply",
    ),
    ("void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, 34>(float*, float const*)", "matrix multiply"),
    (
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, true, "
        "false, false, false>(cublasLt::cublasSplitKParams<float>, float const*)",
        "matrix multiply",
    ),
    (
        "void scal_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*)",
        "matrix multiply",
    ),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "matrix multiply"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float)", "batch-norm"),
    ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)", "batch-norm"),
    (
        "void cudnn::batchnorm_bwtr_nhwc_semiPersist<float, float, float, 512, 16, 3, 4, 1, 1, true, 2>"
        "(cudnn::NhwcBatchNormBwdParams<float, float>)",
        "batch-norm",
    ),
    (
        "void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, float, float, float, int>",
        "batch-norm",
    ),
    (
        "triton_red_fused__native_batch_norm_legit_functional_add_native_batch_norm_backward_threshold_backward_28",
        "batch-norm",
    ),
    ("triton_per_fused__native_batch_norm_legit_functional_copy__19", "batch-norm"),
    ("triton_poi_fused__native_batch_norm_legit_functional_relu_5", "elementwise and activation"),
    ("triton_poi_fused__to_copy_49", "elementwise and activation"),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
        "at::native::(anonymous namespace)::threshold_kernel_impl<float>",
        "elementwise and activation",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >",
        "elementwise and activation",
    ),
    (
        "void at::native::index_elementwise_kernel<128, 4, at::native::flip_kernel_impl<at::native::OpaqueType<8> >",
        "elementwise and activation",
    ),
    (
        "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
        "elementwise and activation",
    ),
    (
        "void cudnn::engines_precompiled::scalePackedTensor_kernel<float, float>(long, float*, float)",
        "elementwise and activation",
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
        "float>, unsigned int, float, 4, 4> >",
        "reductions and the loss",
    ),
    (
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*)",
        "reductions and the loss",
    ),
    (
        "void (anonymous namespace)::softmax_warp_backward<float, float, float, 4, true, false>(float*)",
        "reductions and the loss",
    ),
    ("triton_red_fused_sum_37", "reductions and the loss"),
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<3>, at::native::(anonymous namespace)::FusedSgdMathFunctor<float, 3>, double>",
        "optimizer",
    ),
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>",
        "optimizer",
    ),
    ("triton_for_fused_0", "optimizer"),
    ("triton_poi_fused__foreach_add_0", "optimizer"),
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>",
        kernels.COPIES,
    ),
    (
        "void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true, (cudnnKernelDataType_t)0>(int)",
        kernels.COPIES,
    ),
    ("memset32", kernels.COPIES),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("triton_tem_fused_convolution_0", "convolution forward"),
    ("triton_tem_fused_addmm_1", "matrix multiply"),
    ("triton_tem_fused_convolution_backward_2", kernels.OTHER),
    ("some_vendor_kernel_v2", kernels.OTHER),
]


@pytest.mark.parametrize("name,expected", NAMES, ids=[n[:60] for n, _ in NAMES])
def test_a_kernel_name_falls_in_its_class(name, expected):
    assert kernels.classify(name) == expected, f"{name!r}: {kernels.classify(name)!r}, expected {expected!r}"


def test_the_copy_engine_s_events_are_copies_whatever_their_name():
    assert kernels.classify("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == kernels.COPIES
    assert kernels.classify("Memset (Unknown)", "gpu_memset") == kernels.COPIES
    assert kernels.classify("anything", "gpu_memcpy") == kernels.COPIES


def test_overlapping_kernels_are_counted_once_for_the_one_that_started_first():
    """Two streams: a convolution [0, 10) and an elementwise kernel [4, 14), and a nested copy [5, 6): the busy
    time is 14, the convolution keeps its 10, the elementwise kernel gets only its 4 past the end of it, the copy
    none; the plain kernel time (21) exceeds the busy time by the overlap (7)."""
    events = [
        ("sm90_xmma_fprop_implicit_gemm_x", "kernel", 0.0, 10.0),
        ("triton_poi_fused_relu_0", "kernel", 4.0, 14.0),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 5.0, 6.0),
    ]
    b = kernels.breakdown(events)
    assert b["busy_us"] == pytest.approx(14.0)
    assert b["classes"]["convolution forward"]["us"] == pytest.approx(10.0)
    assert b["classes"]["elementwise and activation"]["us"] == pytest.approx(4.0)
    assert b["classes"][kernels.COPIES]["us"] == pytest.approx(0.0)
    assert b["classes"][kernels.COPIES]["kernel_us"] == pytest.approx(1.0)
    assert b["kernel_us"] == pytest.approx(21.0) and b["overlap_us"] == pytest.approx(7.0)
    assert sum(c["us"] for c in b["classes"].values()) == pytest.approx(b["busy_us"])
    assert sum(c["share"] for c in b["classes"].values()) == pytest.approx(1.0)
    # a reader that streams passes a function giving the events afresh (read twice): the same breakdown
    assert kernels.breakdown(lambda: iter(events), top=2) == kernels.breakdown(events, top=2)


def _ev(name, cat, ts, dur, **args):
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": ts,
        "dur": dur,
        "pid": 0 if "stream" in args else 1,
        "tid": args.get("stream", 1),
        "args": args,
    }


def test_a_step_s_classes_sum_to_its_gpu_work_when_kernels_overlap_across_streams():
    """A hand-made trace: two steps, each launching a convolution on stream 7 and a batch-norm on stream 8
    that overlaps it; step 2's copy runs inside its convolution. Each step's classes sum to its gpu_work_us."""
    evs = []
    for n, t0, c in ((1, 0.0, 10), (2, 100.0, 20)):
        evs.append(_ev(f"ProfilerStep#{n}", "user_annotation", t0, 100.0))
        for i, (name, cat, start, dur, stream) in enumerate(
            [
                ("sm90_xmma_wgrad_indexed_implicit_gemm_x", "kernel", t0 + 10, 30.0, 7),
                ("void cudnn::bn_bw_1C11_kernel_new<float>", "kernel", t0 + 25, 30.0, 8),
                ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", t0 + 12, 5.0 if n == 2 else 0.0, 9),
            ]
        ):
            evs.append(_ev("cudaLaunchKernel", "cuda_runtime", t0 + 1 + i, 1.0, correlation=c + i))
            evs.append(_ev(name, cat, start, dur, stream=stream, correlation=c + i))
    ev = summarize.summarize_events(evs)
    for s in ev["steps"]:
        kc = s["kernel_classes"]
        assert s["gpu_work_us"] == pytest.approx(45.0)
        assert sum(c["us"] for c in kc["classes"].values()) == pytest.approx(s["gpu_work_us"], abs=attribution.EPS_US)
        assert kc["classes"]["convolution weight-gradient"]["us"] == pytest.approx(30.0)
        assert kc["classes"]["batch-norm"]["us"] == pytest.approx(15.0)
    assert ev["steps"][1]["kernel_classes"]["overlap_us"] == pytest.approx(15.0 + 5.0)
    h = diagnosis.headline(ev)
    assert h["kernel_classes"]["convolution weight-gradient"]["share"] == pytest.approx(30.0 / 45.0)
    assert h["gpu_top_classes"] == "conv wgrad 67%, batch-norm 33%"
    text = formatting.format_table([ev])
    assert "GPU time by kernel class" in text and "convolution weight-gradient" in text


def test_a_cpu_only_trace_has_no_kernel_classes():
    ev = summarize.summarize_events([_ev("ProfilerStep#1", "user_annotation", 0.0, 10.0)])
    assert diagnosis.headline(ev)["kernel_classes"] is None
    assert "GPU time by kernel class" not in formatting.format_table([ev])


@pytest.fixture(scope="module")
def stored(stored_evidence):
    assert STORED, "no stored H200 traces under results/h200-*"
    return {p: stored_evidence(p) for p in STORED}


def test_on_the_stored_h200_traces_the_classes_sum_to_each_step_s_gpu_work(stored):
    """Eager and CUDA-graph steps alike: the classes of each step (and each window) sum to its gpu_work_us."""
    for path, ev in stored.items():
        for s in ev["steps"] + [ev["window"]]:
            got = sum(c["us"] for c in s["kernel_classes"]["classes"].values())
            assert got == pytest.approx(s["gpu_work_us"], abs=attribution.EPS_US), (
                f"{path} step {s.get('step', 'window')}: classes {got} us, GPU work {s['gpu_work_us']} us"
            )
            assert s["kernel_classes"]["kernel_us"] == pytest.approx(got + s["kernel_classes"]["overlap_us"])


def test_on_the_stored_h200_traces_other_stays_below_its_bound(stored):
    for path, ev in stored.items():
        kc = ev["window"]["kernel_classes"]
        other = kc["classes"].get(kernels.OTHER, {"us": 0.0})["us"] / kc["busy_us"]
        assert other <= OTHER_AT_MOST, f"{path}: other is {other:.1%}: {kc['other_names'][:5]}"


def test_a_graph_replay_s_kernels_are_classified_like_eager_ones(stored):
    """The fp32 CUDA-graph run and an eager run of the same model: the same three convolution passes and
    batch-norm appear in both, and the graph's kernels are kernel events charged to the replaying step."""
    graph = next(ev for p, ev in stored.items() if "b91a1616" in p)
    eager = next(ev for p, ev in stored.items() if "4220df20" in p)
    assert graph["window"]["graph_launches"] > 0
    for ev in (graph, eager):
        classes = ev["window"]["kernel_classes"]["classes"]
        for cls in ("convolution forward", "convolution data-gradient", "convolution weight-gradient", "batch-norm"):
            assert classes.get(cls, {}).get("share", 0) > 0.05, f"{ev['trace']}: {cls} missing"


def test_compare_shows_the_top_classes_of_gpu_bound_groups_only():
    """steplens compare's evidence section: a GPU-bound group's matching profile run gives its top classes (read from
    its run.json); a group waiting for input gets no line; an older profile run says n/a."""
    run_json = {"results": {"evidence": {"gpu_top_classes": "conv wgrad 21%, conv fwd 18%, batch-norm 16%"}}}
    r = runs.record_from(
        "u1", "p", "2026-12-03T10:00:00", "succeeded", {"mode": "profile"}, {"verdict_stage": "GPU compute"}, run_json
    )
    assert r["gpu_top_classes"] == "conv wgrad 21%, conv fwd 18%, batch-norm 16%"
    groups = [
        {
            "group": "graph",
            "gpu_bound": None,
            "evidence": {"verdict_stage": "GPU compute", "gpu_top_classes": r["gpu_top_classes"]},
        },
        {"group": "workers=0", "gpu_bound": None, "evidence": {"verdict_stage": "waiting for input"}},
        {"group": "old graph", "gpu_bound": {"median_share": 0.9}, "evidence": {"gpu_top_classes": None}},
    ]
    text = compare.kernel_class_lines(groups)
    assert "- graph: conv wgrad 21%, conv fwd 18%, batch-norm 16%" in text
    assert "workers=0" not in text
    assert "- old graph: n/a" in text


def _class_trace(folder, batch, conv_us, bn_us, steps=2):
    """A trace of `steps` steps, each a convolution then a batch-norm on stream 7, under folder/outputs/traces,
    with the run.json beside it that names the batch size (batch None: no run.json)."""
    evs = []
    for n in range(steps):
        t0 = n * 1000.0
        evs.append(_ev(f"ProfilerStep#{n + 1}", "user_annotation", t0, 1000.0))
        for i, (name, start, dur) in enumerate(
            [
                ("sm90_xmma_fprop_implicit_gemm_x", t0 + 10, conv_us),
                ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>", t0 + 20 + conv_us, bn_us),
            ]
        ):
            evs.append(_ev("cudaLaunchKernel", "cuda_runtime", t0 + 1 + i, 1.0, correlation=10 * n + i + 1))
            evs.append(_ev(name, "kernel", start, dur, stream=7, correlation=10 * n + i + 1))
    traces = folder / "outputs" / "traces"
    traces.mkdir(parents=True)
    if batch:
        (folder / "outputs" / "run.json").write_text(
            json.dumps({"settings": {"batch_size": batch}, "environment": {"gpu": "NVIDIA H200"}})
        )
    path = traces / "trace.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    return str(path)


def test_the_class_table_shows_each_class_per_step_and_per_sample_against_the_first_trace(tmp_path):
    """Batch 128 (conv 100 us, bn 50 us a step) against batch 512 (conv 200, bn 150): per sample the conv went
    from 0.781 to 0.391 us, the batch-norm from 0.391 to 0.293, the total to 350/512 / (150/128) = 0.583x."""
    script = os.path.join(ROOT, "scripts", "class_table.py")
    a = _class_trace(tmp_path / "a", 128, 100.0, 50.0)
    b = _class_trace(tmp_path / "b", 512, 200.0, 150.0)
    out = tmp_path / "classes.md"
    proc = subprocess.run(
        [sys.executable, script, a, b, "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line for line in out.read_text().splitlines() if line.startswith("| ")}
    assert "| 0.100; 0.78 | 0.200; 0.39 (0.50x) |" in rows["convolution forward"]
    assert "| 0.050; 0.39 | 0.150; 0.29 (0.75x) |" in rows["batch-norm"]
    assert "| 0.150; 1.17 | 0.350; 0.68 (0.58x) |" in rows["**total (GPU work a step launched)**"]
    assert (
        "total per sample 0.583x trace 1's" in proc.stdout and "batch_size=512 on NVIDIA H200 (2 steps" in proc.stdout
    )
    png = tmp_path / "classes.png"
    proc = subprocess.run(
        [sys.executable, script, a, b, "--png", str(png)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr
    assert not glob.glob(str(tmp_path / ".partial-*"))
    proc = subprocess.run(
        [sys.executable, script, a, "--png", str(tmp_path / "no" / "x.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "its folder does not exist" in proc.stderr and proc.stderr.count("\n") == 1
    c = _class_trace(tmp_path / "c", None, 100.0, 50.0)  # no run.json: per step only
    proc = subprocess.run([sys.executable, script, a, c], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "| 0.100; 0.78 | 0.100 (1.00x) |" in proc.stdout, proc.stdout
    assert "(no batch size: no run.json with one beside the trace)" in proc.stdout


def test_the_class_table_refuses_a_cpu_only_or_missing_trace_in_one_line(tmp_path):
    script = os.path.join(ROOT, "scripts", "class_table.py")
    cpu = tmp_path / "cpu.pt.trace.json"
    cpu.write_text(json.dumps({"traceEvents": [_ev("ProfilerStep#1", "user_annotation", 0.0, 10.0)]}))
    for args, rc, words in (
        ([str(cpu)], 1, "no GPU kernels"),
        ([str(tmp_path / "none.json")], 2, "no such trace"),
        ([str(tmp_path)], 2, "is a folder: give the trace files in it"),
    ):
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == rc and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_profile_run_logs_its_top_classes_as_outputs_for_compare_from_a_server():
    """steplens compare on a Polyaxon project reads outputs, not run.json: the top classes must be among them."""

    class Record:
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    evidence = {
        "profiled_step_ms": 2.6,
        "gpu_top_classes": "conv wgrad 22%, elementwise 22%, conv fwd 17%",
        "verdict": {"sentence": "GPU compute holds the step", "stage": "GPU compute"},
    }
    cycle = {
        "cycle": 1,
        "trace": "t",
        "operator_tables": {},
        "evidence_json": "e",
        "evidence_txt": "x",
        "step_wall_ms": {2: 2.6},
        "evidence": dict(evidence),
    }
    outputs = runrecord.log_cycles(Record(), {"cycles": [cycle], "evidence": evidence})
    assert outputs["gpu_top_classes"] == outputs["cycle1_gpu_top_classes"] == evidence["gpu_top_classes"]
    record = runs.record_from("u", "profile-u", "2026-12-04T01:00:00", "succeeded", {"mode": "profile"}, outputs, None)
    assert record["gpu_top_classes"] == evidence["gpu_top_classes"]


def test_the_class_table_stops_where_the_classes_do_not_sum_to_the_gpu_work(tmp_path):
    """The guard behind every table: evidence whose classes miss part of the GPU work is refused, naming both
    sums; a run.json that is not a record, or holds no usable batch size, leaves the batch unknown."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import class_table

    evidence = {
        "has_gpu": True,
        "window": {
            "steps": 2,
            "gpu_work_us": 300.0,
            "kernel_classes": {
                "busy_us": 300.0,
                "classes": {"batch-norm": {"us": 100.0}, "convolution forward": {"us": 150.0}},
            },
        },
    }
    with pytest.raises(class_table.TableError, match="sum to 250.0 us but its steps launched 300.0 us"):
        class_table.classes_of("t.json", evidence, {})
    evidence["window"]["kernel_classes"]["classes"]["convolution forward"]["us"] = 200.0
    for run in ({"settings": {"batch_size": "128"}}, {"settings": "x"}, {"settings": {"batch_size": True}}):
        assert class_table.classes_of("t.json", evidence, run)["batch"] is None, run
    assert class_table.classes_of("t.json", evidence, {"settings": {"batch_size": 64}})["batch"] == 64
    (tmp_path / "outputs" / "traces").mkdir(parents=True)
    (tmp_path / "outputs" / "run.json").write_text("[1, 2]")
    assert class_table.run_of(str(tmp_path / "outputs" / "traces" / "t.json")) == {}


def test_the_class_picture_names_bars_by_what_differs_and_whose_machine():
    """A run recorded before --lr-warmup-steps existed reads as lr_warmup_steps=0, not None; bars from two
    machines say which; bars from one machine do not repeat it."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import class_table

    rows = [
        {"settings": {"batch_size": 128, "lr_warmup_steps": 80}, "machine": "boot aaaa, GPU bbbb", "label": "x"},
        {"settings": {"batch_size": 512}, "machine": "boot cccc, GPU dddd", "label": "y"},
    ]
    assert class_table.bar_names(rows) == [
        "1. batch_size=128, lr_warmup_steps=80 (boot aaaa, GPU bbbb)",
        "2. batch_size=512, lr_warmup_steps=0 (boot cccc, GPU dddd)",
    ]
    rows[1]["machine"] = rows[0]["machine"]
    rows[1]["settings"]["lr_warmup_steps"] = 80
    assert class_table.bar_names(rows) == ["1. batch_size=128", "2. batch_size=512"]


def test_breakdown_counts_each_class_s_share_of_the_union_and_names_the_unknown_longest_first():
    """Worked out by hand: matmul 0-10 and 50-56; elementwise 5-15 (5 past the matmul); "mystery" 20-30 with a
    kernel 22-25 inside it (0 past it); a copy 40-44; "enigma" 60-61. Busy 36 of 44 kernel us (overlap 8)."""
    events = [
        ("sgemm_a", "kernel", 0.0, 10.0),
        ("vectorized_elementwise_b", "kernel", 5.0, 15.0),
        ("mystery", "kernel", 20.0, 30.0),
        ("mystery", "kernel", 22.0, 25.0),
        ("copy", "gpu_memcpy", 40.0, 44.0),
        ("sgemm_a", "kernel", 50.0, 56.0),
        ("enigma", "kernel", 60.0, 61.0),
    ]
    out = kernels.breakdown(events, top=2)
    assert (out["busy_us"], out["kernel_us"], out["overlap_us"]) == (36.0, 44.0, 8.0)
    assert out["classes"] == {
        "matrix multiply": {"count": 2, "us": 16.0, "kernel_us": 16.0, "median_us": 8.0, "share": 16 / 36},
        "elementwise and activation": {"count": 1, "us": 5.0, "kernel_us": 10.0, "median_us": 10.0, "share": 5 / 36},
        kernels.COPIES: {"count": 1, "us": 4.0, "kernel_us": 4.0, "median_us": 4.0, "share": 4 / 36},
        kernels.OTHER: {"count": 3, "us": 11.0, "kernel_us": 14.0, "median_us": 3.0, "share": 11 / 36},
    }
    assert list(out["classes"]) == ["matrix multiply", "elementwise and activation", kernels.COPIES, kernels.OTHER]
    assert out["other_names"] == ["mystery", "enigma"]
    assert out["top"] == [
        {"name": "sgemm_a", "class": "matrix multiply", "count": 2, "us": 16.0},
        {"name": "mystery", "class": kernels.OTHER, "count": 2, "us": 13.0},
    ]
    assert "top" not in kernels.breakdown(events)
    empty = kernels.breakdown([])
    assert empty == {
        "busy_us": 0,
        "kernel_us": 0,
        "overlap_us": 0,
        "classes": {},
        "other_names": [],
        "signs": kernels.signs([]),
    }
    assert out["signs"]["gemm_us"] == 16.0 and not any(kernels.signs([]).values())


def test_the_union_is_shared_out_in_order_of_start_the_longer_first():
    events = [("a", "kernel", 0.0, 4.0), ("b", "kernel", 0.0, 10.0), ("c", "kernel", 12.0, 13.0)]
    assert kernels.breakdown(events, top=3)["top"][0] == {"name": "b", "class": kernels.OTHER, "count": 1, "us": 10.0}
    assert kernels.breakdown(events)["classes"][kernels.OTHER]["us"] == 11.0
    assert kernels.exclusive(events) == [0.0, 10.0, 1.0]
    assert kernels.exclusive([("a", "kernel", -5.0, -1.0)]) == [4.0], "before 0 too"


def test_top_classes_names_the_three_largest_shares_in_short_words():
    shares = {"optimizer": 0.1, "matrix multiply": 0.4, "batch-norm": 0.2, kernels.COPIES: 0.3, kernels.OTHER: None}
    classes = {cls: {"share": s} for cls, s in shares.items()} | {"communication": {"share": 0.0}}
    assert kernels.top_classes(classes) == "matmul 40%, copies 30%, batch-norm 20%"
    assert kernels.top_classes(classes, n=1) == "matmul 40%" and kernels.top_classes({}) == ""
    assert kernels.top_classes({"optimizer": {}}) == ""


def test_instants_only_have_no_share():
    out = kernels.breakdown([("sgemm_a", "kernel", 5.0, 5.0)])
    assert out["busy_us"] == 0.0 and out["classes"]["matrix multiply"]["share"] is None


def test_signs_add_each_kernel_s_time_to_what_its_name_shows():
    """kernels.signs: convolutions and matmuls, those in half precision; convolutions whose output is NHWC (not the
    filter layout nhwckrsc of an NCHW output); cuDNN's layout conversions; torch.compile's triton kernels; the
    compute kernels (neither copies nor communication). Each name counts its own time, once per sign it shows."""
    rows = [
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tile", "convolution forward", 10.0),
        ("sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tile", "convolution data-gradient", 4.0),
        ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tile", "convolution forward", 6.0),
        ("ampere_fp16_s16816gemm_fp16_128x128", "matrix multiply", 2.0),
        ("volta_h884gemm_64x64_nn", "matrix multiply", 1.0),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<float>", kernels.COPIES, 3.0),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication", 7.0),
        ("triton_poi_fused_relu_0", "elementwise and activation", 5.0),
        (None, kernels.OTHER, 1.0),
    ]
    by_name = [{"name": n, "class": c, "us": us} for n, c, us in rows]
    assert kernels.signs(by_name) == {
        "gemm_us": 23.0,
        "half_us": 13.0,
        "conv_us": 20.0,
        "nhwc_us": 14.0,
        "conversion_us": 3.0,
        "triton_us": 5.0,
        "compute_us": 29.0,
    }


def test_on_the_stored_h200_traces_the_fixes_the_kernels_show_are_the_run_s_settings(stored):
    """Where a stored trace's run.json is at hand, the fixes its kernels show applied (diagnosis.applied_fixes)
    are the run's own: --amp bf16, --channels-last, --compile. Eager NCHW runs, channels-last alone and CUDA
    graphs alone (which change no kernel) all occur among them."""
    seen = set()
    for path, ev in stored.items():
        found = run_record_near(path)
        if not found:
            continue
        s = found[1]["settings"]
        truth = [k for k, on in (("bf16", s.get("amp") == "bf16"), ("channels_last", s.get("channels_last")),
                                 ("compile", s.get("compile") not in (None, "off"))) if on]  # fmt: skip
        assert diagnosis.applied_fixes([ev]) == truth, (path, ev["window"]["kernel_classes"]["signs"], s)
        seen.add(tuple(truth))
    assert {(), ("channels_last",), ("bf16", "channels_last", "compile")} <= seen, seen


def test_gpu_compute_s_advice_leaves_out_the_fixes_the_kernels_show_applied(stored):
    """The best option set's trace is GPU-bound in bf16, NHWC and compiled kernels: its advice keeps a larger batch
    and names the three it left out and why; an eager NCHW fp32 trace that is GPU-bound keeps all four."""
    best = next(p for p in STORED if "best-set" in p)
    v = stored[best]["verdict"]
    assert v["part"] == "busy" and v["applied"] == ["bf16", "channels_last", "compile"], v
    assert "a larger batch" in v["next"] and not any(w in v["next"] for w in ("bf16", "channels", "compile")), v
    assert v["sentence"].endswith(
        "Left out: bf16 autocast, channels-last and torch.compile, which the kernels show applied (bf16 or fp16 "
        "convolutions and matrix multiplies, NHWC convolutions without layout conversions and triton kernels)."
    ), v["sentence"]
    eager = summarize.summarize_file(os.path.join(ROOT, "results", "h100-delays", "gpu.pt.trace.json.gz"))["verdict"]
    assert eager["part"] == "compute" and "applied" not in eager, eager
    assert all(w in eager["next"] for w in ("bf16 autocast", "channels_last", "torch.compile", "a larger batch"))
