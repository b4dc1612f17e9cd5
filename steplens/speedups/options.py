"""The candidate fixes' flags, their refusals, and the step parts they choose (copy to the device, precision)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, NoReturn

from steplens.errors import UserError

if TYPE_CHECKING:
    import torch

COMPILE_MODES = ["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
# --inductor-tuning: torch._inductor.config values set before torch.compile, aimed at the batch-norm and
# elementwise kernels the roofline finds far from the memory limit (docs/RESULTS.md, the roofline by class).
INDUCTOR_TUNING = {
    "off": {},
    "pointwise": {"max_autotune_pointwise": True, "coordinate_descent_tuning": True},
    "combo": {"combo_kernels": True, "benchmark_combo_kernel": True},  # keeps a combo only where it is faster
}


def add_arguments(p: argparse.ArgumentParser, positive_int: Callable[[str], int]) -> None:
    """The candidate-fix flags; defaults keep the tutorial's workload exactly."""
    g = p.add_argument_group("candidate fixes (all off by default: the tutorial's workload)")
    g.add_argument(
        "--persistent-workers",
        action="store_true",
        help="keep DataLoader workers alive across epochs (needs --workers > 0) (default: off)",
    )
    g.add_argument(
        "--prefetch-factor",
        type=positive_int,
        default=None,
        help="batches each worker loads ahead (needs --workers > 0) (default: torch's, 2)",
    )
    g.add_argument(
        "--prefetch-stream",
        action="store_true",
        help="copy the next batch to the GPU on a side CUDA stream while this step computes "
        "(needs CUDA; not with --gpu-input) (default: off)",
    )
    g.add_argument(
        "--gpu-input",
        action="store_true",
        help="keep the uint8 training set on the device and crop/flip/normalize batches there, "
        "no DataLoader (needs --workers 0) (default: off)",
    )
    g.add_argument("--channels-last", action="store_true", help="NHWC model and inputs (default: off)")
    g.add_argument(
        "--amp", choices=["off", "bf16"], default="off", help="autocast forward and loss to bfloat16 (default: off)"
    )
    g.add_argument("--fused-sgd", action="store_true", help="torch's fused SGD kernel (default: off)")
    g.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="off",
        help="torch.compile the model with this mode; reduce-overhead and max-autotune replay CUDA "
        "graphs of their own; max-autotune* time kernel choices while compiling (minutes). "
        "Compilation happens in the warm-up, which must then be >= 3 steps (default: off)",
    )
    g.add_argument(
        "--inductor-tuning",
        choices=list(INDUCTOR_TUNING),
        default="off",
        help="with --compile: pointwise times the block sizes of each pointwise and reduction kernel while "
        "compiling (max_autotune_pointwise, coordinate_descent_tuning); combo fuses independent small "
        "kernels into one launch where that times faster (combo_kernels, benchmark_combo_kernel) (default: off)",
    )
    g.add_argument(
        "--cuda-graph",
        action="store_true",
        help="capture each scope's GPU work (batch assembly, layout, forward+backward, optimizer) once "
        "as CUDA graphs at the end of the warm-up and replay them every step; bench mode then "
        "also measures the GPU time per step (needs CUDA, --gpu-input, --warmup-steps >= 3; "
        "combine with --compile default for fused kernels) (default: off)",
    )
    g.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="let cuDNN time its convolution algorithms during the warm-up (default: off)",
    )


def check(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """Refuse senseless combinations before torch is imported; error() prints one line and exits 2."""
    if args.workers == 0 and (args.persistent_workers or args.prefetch_factor is not None):
        error("--persistent-workers and --prefetch-factor need --workers > 0 (they configure worker processes)")
    if args.gpu_input and args.workers:
        error(f"--gpu-input builds batches on the device without a DataLoader: use --workers 0, not {args.workers}")
    if args.compile != "off" and args.warmup_steps < 3:
        error(
            f"--compile {args.compile} compiles (and captures) during the warm-up: give --warmup-steps >= 3, "
            f"not {args.warmup_steps}, so none of it lands in the measured steps"
        )
    if args.inductor_tuning != "off" and args.compile == "off":
        error(f"--inductor-tuning {args.inductor_tuning} tunes torch.compile's kernels: add --compile default")
    if args.gpu_input and args.prefetch_stream:
        error("--prefetch-stream has nothing to copy with --gpu-input (the data is already on the device)")
    if args.cuda_graph:
        if not args.gpu_input:
            error(
                "--cuda-graph captures the batch assembly too, which only --gpu-input does on the device: "
                "add --gpu-input"
            )
        if args.compile in ("reduce-overhead", "max-autotune"):
            error(
                f"--cuda-graph with --compile {args.compile}: that mode captures CUDA graphs of its own, "
                "which cannot nest in the step's graphs; use --compile default"
            )
        if args.warmup_steps < 3:
            error(
                f"--cuda-graph warms up eagerly, captures and replays during the warm-up: give "
                f"--warmup-steps >= 3, not {args.warmup_steps}"
            )


def check_device(args: argparse.Namespace, device: torch.device) -> None:
    """Options that only make sense on CUDA, refused once the device is known."""
    import torch

    if args.prefetch_stream and device.type != "cuda":
        raise UserError("--prefetch-stream overlaps host-to-device copies with compute: it needs a CUDA device")
    if args.cuda_graph and device.type != "cuda":
        raise UserError("--cuda-graph captures CUDA graphs: it needs a CUDA device")
    if args.cuda_graph and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        raise UserError(
            f"--cuda-graph replays the augmentation's own seeded generator, which needs "
            f"CUDAGraph.register_generator_state (torch >= 2.5); this is torch {torch.__version__}"
        )


def tune_inductor(args: argparse.Namespace) -> dict[str, Any]:
    """Set --inductor-tuning's torch._inductor.config values (before torch.compile reads them); returns them.
    A torch without one of them is refused, never silently compiled without it."""
    import torch
    import torch._inductor.config as config

    chosen = INDUCTOR_TUNING[args.inductor_tuning]
    missing = [k for k in chosen if not hasattr(config, k)]
    if missing:
        raise UserError(
            f"--inductor-tuning {args.inductor_tuning}: torch {torch.__version__} has no "
            f"torch._inductor.config.{', '.join(missing)}"
        )
    for k, v in chosen.items():
        setattr(config, k, v)
    return chosen


def precision(
    device: torch.device, args: argparse.Namespace
) -> tuple[torch.memory_format, Callable[[], AbstractContextManager[Any]]]:
    """The memory format and the autocast context of the step, settled once."""
    import torch

    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    if args.amp != "bf16":
        return memory_format, nullcontext
    # A captured graph must not keep autocast's cache of cast weights (torch.cuda.graph's docs).
    return memory_format, lambda: torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, cache_enabled=not args.cuda_graph
    )


def to_device_fn(
    device: torch.device, args: argparse.Namespace, prefetcher: Any = None
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The body of input/to_device: the tutorial's non-blocking copies, or the side-stream prefetcher's swap;
    then the NHWC layout where asked for."""
    memory_format, _ = precision(device, args)

    def to_device(images, targets):
        if prefetcher is not None:
            images, targets = prefetcher.swap((images, targets))
        else:
            images = images.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
        if args.channels_last:
            images = images.contiguous(memory_format=memory_format)
        return images, targets

    return to_device
