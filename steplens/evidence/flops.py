"""The hardware ceiling: the model's FLOPs per training sample, the GPUs' dense peaks, achieved TFLOP/s and MFU.

Model FLOPs are what torch.utils.flop_counter.FlopCounterMode counts over one forward and backward:
the convolutions (forward: 2 x Cin x Cout x k x k x Hout x Wout per image; backward: the same again for
the weight gradient and again for the input gradient, except the first convolution, whose input needs
no gradient) and the matmuls of the linear layer. Batch norm, activations, pooling, the loss, the
optimizer and the input pipeline are not counted, as in the usual MFU definition. For the CIFAR
ResNet18 variant: about 1.11 GFLOP forward and 3.33 GFLOP per training image.

MFU = achieved model FLOP/s (FLOPs per sample x samples/s of the bench window) / the GPU's dense peak
for the precision the step's convolutions may use. It says how close the step comes to the hardware's
arithmetic limit; the GPU-bound share (--cuda-graph) says how GPU-bound the step is, which is another thing.
In a DDP run the rate is the job's and the peak one GPU's: MFU uses the rate per GPU (global / world size).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Dense peaks (no 2:4 structured sparsity) in TFLOP/s, keyed by torch.cuda.get_device_name(). The vendor
# datasheets print the Tensor Core figures with sparsity and say dense is one half: those are halved here.
# memory_tb_per_s: the datasheet's GPU memory bandwidth (HBM, or GDDR on the L4), the roofline's memory peak.
PEAKS = {
    "NVIDIA H200": {
        "model": "H200 SXM 141GB",
        "fp32": 67.0,
        "tf32": 494.5,
        "bf16": 989.5,
        "source": "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), H200 SXM: "
        "FP32 67, TF32 Tensor Core 989*, BF16 Tensor Core 1,979* TFLOPS (*with sparsity)",
        "memory_tb_per_s": 4.8,
        "memory_source": "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), H200 SXM: "
        "GPU memory bandwidth 4.8 TB/s",
    },
    "NVIDIA H100 80GB HBM3": {
        "model": "H100 SXM5 80GB",
        "fp32": 67.0,
        "tf32": 494.5,
        "bf16": 989.5,
        "source": "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), H100 SXM: "
        "FP32 67, TF32 Tensor Core 989*, BF16 Tensor Core 1,979* TFLOPS (*with sparsity)",
        "memory_tb_per_s": 3.35,
        "memory_source": "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), H100 SXM: "
        "GPU memory bandwidth 3.35 TB/s",
    },
    "NVIDIA A100-SXM4-80GB": {
        "model": "A100 SXM4 80GB",
        "fp32": 19.5,
        "tf32": 156.0,
        "bf16": 312.0,
        "source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), A100 80GB SXM: "
        "FP32 19.5, TF32 Tensor Core 156 | 312*, BF16 Tensor Core 312 | 624* TFLOPS (*with sparsity)",
        "memory_tb_per_s": 2.039,
        "memory_source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), A100 80GB SXM: "
        "GPU memory bandwidth 2,039 GB/s",
    },
    "NVIDIA A100-SXM4-40GB": {
        "model": "A100 SXM4 40GB",
        "fp32": 19.5,
        "tf32": 156.0,
        "bf16": 312.0,
        "source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), A100 40GB SXM: "
        "FP32 19.5, TF32 Tensor Core 156 | 312*, BF16 Tensor Core 312 | 624* TFLOPS (*with sparsity)",
        "memory_tb_per_s": 1.555,
        "memory_source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), A100 40GB SXM: "
        "GPU memory bandwidth 1,555 GB/s",
    },
    "NVIDIA L4": {
        "model": "L4",
        "fp32": 30.3,
        "tf32": 60.0,
        "bf16": 121.0,
        "source": "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4): "
        "FP32 30.3, TF32 Tensor Core 120*, BF16 Tensor Core 242* TFLOPS (*with sparsity)",
        "memory_tb_per_s": 0.3,
        "memory_source": "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4): "
        "GPU memory bandwidth 300 GB/s",
    },
}


def training_flops(
    build_model: Callable[[], torch.nn.Module], image_shape: tuple[int, ...] = (3, 32, 32), batch: int = 2
) -> dict[str, Any]:
    """FLOPs of one forward and one backward per sample, counted on a fresh model on the meta device.

    The meta device holds shapes only: building the model there allocates nothing, computes nothing
    and draws nothing from the seeded random generators, so the training model, its data order and its
    augmentation are exactly what they would have been without the count. The count depends on shapes
    alone, so it holds for the trained model whatever its memory format, precision or compilation.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model()
        images = torch.empty(batch, *image_shape)
        targets = torch.zeros(batch, dtype=torch.long)
    model.train()
    with FlopCounterMode(display=False) as forward:
        loss = torch.nn.functional.cross_entropy(model(images), targets)
    with FlopCounterMode(display=False) as backward:
        loss.backward()

    def by_op(counter):
        # Named "aten.convolution" or "aten.convolution.default" depending on the torch version.
        counts = counter.get_flop_counts().get("Global", {})
        return {str(op).removesuffix(".default"): n // batch for op, n in counts.items()}

    fwd, bwd = forward.get_total_flops(), backward.get_total_flops()
    if fwd <= 0 or fwd % batch or bwd % batch:
        raise RuntimeError(
            f"FlopCounterMode counted {fwd} forward and {bwd} backward FLOPs for {batch} samples: "
            "not a whole positive number per sample"
        )
    return {
        "flops_per_sample": (fwd + bwd) // batch,
        "forward_flops_per_sample": fwd // batch,
        "backward_flops_per_sample": bwd // batch,
        "forward_by_op": by_op(forward),
        "backward_by_op": by_op(backward),
        "counted_on": f"meta device, fresh model, batch of {batch} {'x'.join(map(str, image_shape))} images",
        "counter": "torch.utils.flop_counter.FlopCounterMode",
    }


def _cudnn_tf32():
    """Whether cuDNN may run fp32 convolutions in TF32, and from which setting: the newer fp32_precision API
    where it exists (reading allow_tf32 after it was used raises), NVIDIA_TF32_OVERRIDE=0 (which turns TF32
    off below torch, whatever its flags say), else the allow_tf32 flag."""
    import torch

    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return False, "NVIDIA_TF32_OVERRIDE=0"
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if conv is not None and conv != "none":
        return conv == "tf32", f"torch.backends.cudnn.conv.fp32_precision={conv!r}"
    try:
        return bool(
            torch.backends.cudnn.allow_tf32
        ), f"torch.backends.cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}"
    except RuntimeError as e:  # mixed use of the old and new TF32 APIs
        return None, f"unreadable TF32 setting ({e})"


def math_precision(amp: str) -> tuple[str | None, dict[str, Any], str]:
    """Which peak bounds the step's convolutions (all but about 30 kFLOP of this model's FLOPs per training
    sample: the linear layer's 512 x 10 matmul, about 10 kFLOP forward and twice that backward), and why."""
    tf32, source = _cudnn_tf32()
    flags = {"cudnn_tf32": tf32, "source": source}
    if amp == "bf16":
        return "bf16", flags, "autocast to bfloat16: convolutions and matmuls run in bf16"
    if tf32 is None:
        return None, flags, f"fp32, but whether cuDNN uses TF32 is unknown ({source}): no peak applies"
    if tf32:
        return (
            "tf32",
            flags,
            (
                f"fp32 tensors, but {source} (torch's default allows it), so cuDNN may run the "
                "convolutions on TF32 Tensor Cores: the TF32 peak is their ceiling (the linear "
                "layer's matmuls hold about 30 kFLOP of 3.3 GFLOP)"
            ),
        )
    return "fp32", flags, f"fp32 with TF32 off ({source}): the FP32 (non-Tensor Core) peak"


def ceiling(flops_per_sample: float, samples_per_sec: float, gpu: str, precision: str | None) -> dict[str, Any]:
    """Achieved model TFLOP/s and MFU against the dense peak of the GPU for the precision used.

    mfu is None with the reason where no peak applies (a CPU run, a GPU missing from PEAKS), and where
    it would exceed 1, which no real run can: then the FLOP count or the peak is wrong, not the run.
    """
    achieved = flops_per_sample * samples_per_sec / 1e12
    out = {
        "model_tflops_per_sec": achieved,
        "peak_tflops": None,
        "peak_precision": precision,
        "mfu": None,
        "peak_source": None,
        "note": None,
    }
    peaks = PEAKS.get(gpu)
    if gpu == "cpu":
        out["note"] = "CPU run: no GPU peak to compare with"
    elif precision is None:
        out["note"] = "the precision of the convolutions is unknown: no peak applies"
    elif peaks is None:
        out["note"] = (
            f"no dense peak known for {gpu!r} (flops.PEAKS holds {', '.join(sorted(PEAKS))}): "
            "add its datasheet figures to get MFU"
        )
    else:
        out.update(peak_tflops=peaks[precision], peak_source=peaks["source"])
        mfu = achieved / peaks[precision]
        if mfu > 1:
            out["note"] = (
                f"MFU would be {mfu:.2f} > 1, which no run can reach: the FLOP count or the "
                f"{peaks['model']} {precision} peak is wrong"
            )
        else:
            out["mfu"] = mfu
    return out


def add_ceiling(
    device: torch.device, results: dict[str, Any], flops_per_sample: float, gpu: str, amp: str, world_size: int = 1
) -> None:
    """Model TFLOP/s and MFU of the window, per GPU, against the dense peak for the precision the step used.

    In a DDP run samples_per_sec is the job's global rate: one GPU's share is that over world_size.
    Never fatal: the measured rate is kept even if the ceiling cannot be worked out.
    """
    results["flops_per_sample"] = flops_per_sample
    try:
        if device.type == "cuda":
            precision, flags, why = math_precision(amp)
        else:
            precision, flags, why = None, None, "CPU run"
        per_gpu = results["samples_per_sec"] / world_size
        results["ceiling"] = {
            **ceiling(flops_per_sample, per_gpu, gpu, precision),
            "per_gpu_samples_per_sec": per_gpu,
            "world_size": world_size,
            "precision_reason": why,
            "precision_flags": flags,
        }
    except Exception as e:  # a figure absent with its reason, never a lost run
        results["ceiling"] = {
            "model_tflops_per_sec": None,
            "mfu": None,
            "peak_tflops": None,
            "peak_precision": None,
            "note": f"ceiling not computed ({type(e).__name__}: {e})",
        }
    results.update(
        {k: results["ceiling"].get(k) for k in ("model_tflops_per_sec", "mfu", "peak_tflops", "peak_precision")}
    )
