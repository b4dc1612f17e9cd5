"""evidence/flops.py: the model's FLOP count against an analytic count, the peaks table, MFU and its precision."""

import pytest
import torch

import train
from steplens.evidence import flops


def conv(cin, cout, k, out_size):
    """Forward FLOPs of one convolution per image: a multiply and an add per weight per output position."""
    return 2 * cin * cout * k * k * out_size * out_size


def analytic_resnet18_cifar():
    """Per image, from the architecture alone: a 3x3 stride-1 stem at 32x32 (no max-pool), four stages of two
    BasicBlocks (64, 128, 256, 512 channels; stages 2-4 halve the size and open with a 1x1 downsample), a
    10-way linear layer."""
    stem = conv(3, 64, 3, 32)
    body, cin, size = 0, 64, 32
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        size //= stride
        for block in range(2):
            first_in = cin if block == 0 else cout
            body += conv(first_in, cout, 3, size) + conv(cout, cout, 3, size)
            if block == 0 and (stride != 1 or cin != cout):
                body += conv(cin, cout, 1, size)
        cin = cout
    linear = 2 * 512 * 10
    forward = stem + body + linear
    # FlopCounterMode's backward: each convolution counts its weight gradient and its input gradient, each as
    # many FLOPs as its forward; the stem's input (the images) needs no gradient, so the stem counts once.
    # The linear layer: one matmul for the input gradient, one for the weight gradient. Bias gradients are
    # sums, not counted.
    backward = 2 * (body + linear) + stem
    return forward, backward, stem


@pytest.fixture(scope="module")
def counted():
    return flops.training_flops(train.build_model)


def test_flop_count_matches_the_analytic_count(counted):
    """Within 2% of the count from the architecture (it is exact), and NOTES.md's 1.11 / 3.33 GFLOP."""
    forward, backward, _ = analytic_resnet18_cifar()
    assert counted["forward_flops_per_sample"] == pytest.approx(forward, rel=0.02)
    assert counted["backward_flops_per_sample"] == pytest.approx(backward, rel=0.02)
    assert counted["flops_per_sample"] == pytest.approx(forward + backward, rel=0.02)
    assert counted["forward_flops_per_sample"] == pytest.approx(1.11e9, rel=0.01)
    assert counted["flops_per_sample"] == pytest.approx(3.33e9, rel=0.01)


def test_backward_is_twice_forward_less_the_stem_input_gradient(counted):
    """The invariant the count must obey, whatever the model: backward = 2 x forward - the first layer's input grad."""
    _, _, stem = analytic_resnet18_cifar()
    assert counted["backward_flops_per_sample"] == 2 * counted["forward_flops_per_sample"] - stem
    assert set(counted["forward_by_op"]) == {"aten.convolution", "aten.addmm"}
    assert set(counted["backward_by_op"]) == {"aten.convolution_backward", "aten.mm"}


def test_counting_touches_neither_the_random_state_nor_any_device():
    """The count runs on the meta device: the seeded generator the training draws from is left as it was."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    flops.training_flops(train.build_model)
    assert torch.equal(before, torch.get_rng_state())


def test_peaks_table_is_dense_and_sourced():
    """Every known GPU: bf16 >= tf32 >= fp32 > 0 (dense Tensor Core figures), and a datasheet named."""
    assert {"NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"} <= set(flops.PEAKS)
    for name, p in flops.PEAKS.items():
        assert p["bf16"] >= p["tf32"] >= p["fp32"] > 0, name
        assert "datasheet" in p["source"] and "sparsity" in p["source"], name
    h200 = flops.PEAKS["NVIDIA H200"]
    assert (h200["fp32"], h200["tf32"], h200["bf16"]) == (67.0, 989 / 2, 1979 / 2), "halved sparse figures"


def test_mfu_is_achieved_over_the_table_s_peak():
    c = flops.ceiling(3_328_997_376, 52_000.0, "NVIDIA H200", "bf16")
    assert c["model_tflops_per_sec"] == pytest.approx(3_328_997_376 * 52_000 / 1e12)
    assert c["peak_tflops"] == flops.PEAKS["NVIDIA H200"]["bf16"]
    assert c["mfu"] == pytest.approx(c["model_tflops_per_sec"] / c["peak_tflops"]) and 0 < c["mfu"] < 1
    a100 = flops.ceiling(3.3e9, 18_000.0, "NVIDIA A100-SXM4-80GB", "tf32")
    assert a100["mfu"] == pytest.approx(3.3e9 * 18e3 / 1e12 / 156)


@pytest.mark.parametrize("gpu,reason", [("cpu", "CPU run"), ("NVIDIA GeForce RTX 4090", "no dense peak known")])
def test_mfu_is_absent_with_the_reason_where_no_peak_applies(gpu, reason):
    c = flops.ceiling(3.3e9, 1000.0, gpu, "tf32")
    assert c["mfu"] is None and c["peak_tflops"] is None and reason in c["note"]
    assert c["model_tflops_per_sec"] == pytest.approx(3.3)


def test_an_mfu_above_one_is_refused_as_a_wrong_count_or_peak():
    c = flops.ceiling(3.3e9, 200_000.0, "NVIDIA L4", "bf16")  # 660 TFLOP/s on a 121 TFLOP/s card
    assert c["mfu"] is None and "no run can reach" in c["note"]


def test_precision_follows_autocast_and_the_tf32_switch(monkeypatch):
    """bf16 autocast: the bf16 peak; fp32 with torch's default cudnn.allow_tf32=True: the TF32 peak; off: FP32."""
    assert flops.math_precision("bf16")[0] == "bf16"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    precision, flags, why = flops.math_precision("off")
    assert precision == "tf32" and flags["cudnn_tf32"] is True and ("allow_tf32" in why or "fp32_precision" in why)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert flops.math_precision("off")[0] == "fp32"


def test_mfu_of_a_ddp_run_is_per_gpu():
    """A DDP bench reports the job's global rate; MFU divides one GPU's share of it by one GPU's peak."""
    import types

    results = {"samples_per_sec": 2 * 18_000.0}
    flops.add_ceiling(types.SimpleNamespace(type="cuda"), results, 3.329e9, "NVIDIA H200", "bf16", world_size=2)
    assert results["mfu"] == pytest.approx(3.329e9 * 18_000 / 1e12 / 989.5)
    assert results["ceiling"]["per_gpu_samples_per_sec"] == 18_000.0


def test_tf32_switched_off_below_torch_picks_the_fp32_peak(monkeypatch):
    """NVIDIA_TF32_OVERRIDE=0 turns TF32 off whatever torch's flags say: the FP32 peak applies."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    precision, flags, why = flops.math_precision("off")
    assert precision == "fp32" and "NVIDIA_TF32_OVERRIDE" in why


def test_a_ceiling_that_cannot_be_computed_keeps_the_rate(monkeypatch):
    """A failure while working out the peak leaves the rate and says why, never a lost run."""
    import types

    monkeypatch.setattr(flops, "math_precision", lambda amp: (_ for _ in ()).throw(RuntimeError("mixed TF32 APIs")))
    results = {"samples_per_sec": 1000.0}
    flops.add_ceiling(types.SimpleNamespace(type="cuda"), results, 3.329e9, "NVIDIA H200", "off")
    assert results["samples_per_sec"] == 1000.0 and results["mfu"] is None
    assert "mixed TF32 APIs" in results["ceiling"]["note"]
