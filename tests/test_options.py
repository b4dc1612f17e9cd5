"""The candidate fixes: refusals, plumbing on CPU, and the GPU-side augmentation's distribution."""

import json
import os

import pytest
import torch
from conftest import TINY, load_offline_run, run_train, single_run
from torchvision.transforms import functional as F

from steplens.job import data
from steplens.speedups import options
from steplens.speedups.gpu_input import DeviceBatches, augment

BAD_COMBINATIONS = [
    (["--gpu-input", "--workers", "3"], "--gpu-input"),
    (["--persistent-workers"], "--persistent-workers"),
    (["--prefetch-factor", "4"], "--prefetch-factor"),
    (["--workers", "2", "--prefetch-factor", "0"], "--prefetch-factor"),
    (["--gpu-input", "--prefetch-stream"], "--prefetch-stream"),
    (["--amp", "fp8"], "--amp"),
    (["--compile", "reduce-overhead", "--warmup-steps", "2"], "--warmup-steps"),
    (["--compile", "turbo"], "--compile"),
    (["--cuda-graph"], "--gpu-input"),
    (["--cuda-graph", "--gpu-input", "--compile", "reduce-overhead"], "--compile default"),
    (["--cuda-graph", "--gpu-input", "--compile", "max-autotune"], "--compile default"),
    (["--cuda-graph", "--gpu-input", "--warmup-steps", "2"], "--warmup-steps"),
    (["--inductor-tuning", "combo"], "--compile default"),
    (["--compile", "default", "--inductor-tuning", "turbo"], "--inductor-tuning"),
]


@pytest.mark.parametrize("argv,flag", BAD_COMBINATIONS, ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_senseless_combinations_are_refused(tmp_path, argv, flag):
    proc = run_train(["--mode", "bench", *argv], tmp_path / "offline", timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and flag in lines[0], proc.stderr
    assert not (tmp_path / "offline").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_prefetch_stream_without_cuda_is_refused(tmp_path):
    proc = run_train(["--mode", "bench", "--prefetch-stream", *TINY], tmp_path / "offline", timeout=120)
    assert proc.returncode == 2 and "needs a CUDA device" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "offline" / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_graph_without_cuda_is_refused(tmp_path):
    proc = run_train(
        ["--mode", "bench", "--gpu-input", "--cuda-graph", *TINY[:-1], "3"], tmp_path / "offline", timeout=120
    )
    assert proc.returncode == 2 and "needs a CUDA device" in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert not (tmp_path / "offline" / "runs").exists()


def test_options_are_recorded_in_run_json_and_polyaxon_inputs(tmp_path):
    """A CPU bench run with device-side input, NHWC, bf16 autocast and fused SGD; all of it recorded."""
    proc = run_train(
        [
            "--mode",
            "bench",
            "--bench-steps",
            "2",
            "--gpu-input",
            "--channels-last",
            "--amp",
            "bf16",
            "--fused-sgd",
            "--cudnn-benchmark",
            *TINY,
        ],
        tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    uuid, outputs = single_run(tmp_path)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    s = record["settings"]
    assert (s["gpu_input"], s["channels_last"], s["amp"], s["fused_sgd"], s["cudnn_benchmark"], s["cuda_graph"]) == (
        True,
        True,
        "bf16",
        True,
        True,
        False,
    )
    assert record["loader"]["kind"] == "device" and record["results"]["samples_per_sec"] > 0
    assert record["input_transform"].startswith("on the device"), "run.json must say which transform ran"
    inputs = load_offline_run(tmp_path, uuid)["inputs"]
    assert inputs["gpu_input"] is True and inputs["amp"] == "bf16" and inputs["cudnn_benchmark"] is True
    assert "gpu_bound_share" not in record["results"], "the GPU-bound share is measured with --cuda-graph only"


def norm():
    return (torch.tensor(data.CIFAR10_MEAN).view(1, 3, 1, 1), torch.tensor(data.CIFAR10_STD).view(1, 3, 1, 1))


def test_device_augmentation_draws_the_pil_chain_distribution():
    """Crop offsets uniform over 9x9 and flips at rate 1/2, from its own seeded generator."""
    g = torch.Generator().manual_seed(0)
    images = torch.zeros(81 * 400, 3, 32, 32, dtype=torch.uint8)
    _, (dy, dx), flip = augment(images, g, *norm())
    counts = torch.bincount(dy * 9 + dx, minlength=81)
    assert counts.numel() == 81 and counts.min() > 300 and counts.max() < 500, counts  # expected 400 each
    assert abs(flip.float().mean().item() - 0.5) < 0.015
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(augment(images, g2, *norm())[1][0], dy), "same seed, same draws"


def test_device_augmentation_equals_the_pil_chain_for_the_same_draws():
    """Pixel for pixel: pad 4 with zeros, crop at the drawn offset, flip, ToTensor, Normalize."""
    rng = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=rng)
    out, (dy, dx), flip = augment(images, torch.Generator().manual_seed(2), *norm())
    for i in range(16):
        pil = F.to_pil_image(images[i])
        ref = F.crop(F.pad(pil, 4), int(dy[i]), int(dx[i]), 32, 32)
        if flip[i]:
            ref = F.hflip(ref)
        ref = F.normalize(F.to_tensor(ref), data.CIFAR10_MEAN, data.CIFAR10_STD)
        assert torch.allclose(out[i], ref, atol=1e-5), f"image {i} (dy={dy[i]}, dx={dx[i]}, flip={flip[i]})"


def test_device_batches_shuffle_and_restart_epochs():
    ds = data.SyntheticCIFAR10(transform=None, size=10)
    batches = DeviceBatches(ds, 4, torch.device("cpu"), 0, data.CIFAR10_MEAN, data.CIFAR10_STD)
    seen = [next(batches)[1] for _ in range(5)]
    assert all(t.shape == (4,) for t in seen) and batches.epoch_restarts == 2
    images, _ = next(batches)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32


def test_capturable_assembly_gives_the_eager_batches():
    """The device-counter path that --cuda-graph captures yields the batches of the eager path, epochs included."""
    ds = data.SyntheticCIFAR10(transform=None, size=10)
    eager = DeviceBatches(ds, 4, torch.device("cpu"), 5, data.CIFAR10_MEAN, data.CIFAR10_STD)
    counted = DeviceBatches(ds, 4, torch.device("cpu"), 5, data.CIFAR10_MEAN, data.CIFAR10_STD)
    for i in range(7):  # 2 batches per epoch: crosses three epoch ends
        e_images, e_targets = next(eager)
        if i == 3:
            counted.sync_cursor()  # what a capture does first, mid-epoch
        if i >= 3:
            counted.advance()
            c_images, c_targets = counted.assemble_at_cursor()
        else:
            c_images, c_targets = next(counted)
        assert torch.equal(e_targets, c_targets) and torch.equal(e_images, c_images), f"batch {i}"
    assert counted.epoch_restarts == eager.epoch_restarts == 3
    assert int(counted.cursor) == counted.position


@pytest.mark.parametrize("choice", ["pointwise", "combo"])
def test_inductor_tuning_sets_its_torch_inductor_values_and_off_sets_none(choice, monkeypatch):
    import argparse

    import torch._inductor.config as config

    for k in options.INDUCTOR_TUNING[choice]:
        monkeypatch.setattr(config, k, False)  # restored after the test
    assert options.tune_inductor(argparse.Namespace(inductor_tuning="off")) == {}
    chosen = options.tune_inductor(argparse.Namespace(inductor_tuning=choice))
    assert chosen and all(getattr(config, k) == v for k, v in chosen.items())
