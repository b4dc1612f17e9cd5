"""train.py's command line: every flag with its type, default and help, checked once, before torch is imported.

A bad flag exits 2 with one line (`train.py: error: ... (see --help)`), before any data download,
Polyaxon run or CUDA start. Nothing here imports torch, nor any module that does.
"""

import argparse
import math
from collections.abc import Callable
from typing import NoReturn, TypeVar

from steplens import scopes
from steplens.job import distributed, phases
from steplens.job.data import SYNTHETIC_SIZE
from steplens.job.learning import REFERENCE_BATCH
from steplens.job.memory_snapshot import MAX_ENTRIES, NEEDS_CUDA, STEPS
from steplens.job.paths import DEFAULT_DATA_DIR
from steplens.speedups import options

DESCRIPTION = "Profile a slow PyTorch training run, then measure a change without the profiler."


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, exit 2, before any heavy import: argparse's usage block hides the message.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


_Number = TypeVar("_Number", int, float)  # the kind of number an argparse type converts to


def number(kind: Callable[[str], _Number], ok: Callable[[_Number], bool], need: str) -> Callable[[str], _Number]:
    """An argparse type: kind(text) that must satisfy ok(value); need names the rule in errors."""

    def convert(text):
        value = kind(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {need}, got {text}")
        return value

    convert.__name__ = f"{'integer' if kind is int else 'number'} {need}"  # argparse names a failed type by it
    return convert


non_negative_int = number(int, lambda v: v >= 0, ">= 0")
positive_int = number(int, lambda v: v >= 1, ">= 1")
non_negative_float = number(float, lambda v: v >= 0 and math.isfinite(v), ">= 0")
block_steps = number(int, lambda v: v >= 3, ">= 3 (a block's first step may be left out; two remain for its spread)")


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The workload: mode, loader, batch, steps, data, device and seed."""
    p.add_argument(
        "--mode",
        required=True,
        choices=["profile", "bench"],
        help="profile: scheduled profiler capture; bench: synchronized throughput window (required)",
    )
    p.add_argument(
        "--workers",
        type=non_negative_int,
        default=0,
        help="DataLoader num_workers; 0 loads in the main process (default: 0)",
    )
    p.add_argument("--batch-size", type=positive_int, default=128, help="images per step (default: 128)")
    p.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=20,
        help="plain training steps before the profiler or the timed window (default: 20)",
    )
    p.add_argument(
        "--bench-steps", type=positive_int, default=100, help="batches in the timed window of mode=bench (default: 100)"
    )
    p.add_argument(
        "--data",
        choices=["cifar10", "synthetic", "learnable"],
        default="cifar10",
        help="cifar10: the real training set, downloaded into --data-dir when missing; "
        "synthetic: 50,000 CIFAR-shaped uint8 images (fixed seed) through the same "
        "transforms, for machines without network; learnable: the same, but each class "
        "has its own colour tint plus noise, so the loss falls towards zero when the model "
        "learns (the learning check) (default: cifar10)",
    )
    p.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help="where CIFAR-10 is (or is downloaded to) (default: ./data)"
    )
    p.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="auto: CUDA when available, else CPU, said loudly; cuda: fail without it (default: auto)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="model, shuffle and augmentation seed (default: 0)")


def add_optimizer_arguments(p: argparse.ArgumentParser) -> None:
    """SGD and its learning rate: the rate, its scaling with the batch, its ramp."""
    p.add_argument(
        "--lr",
        type=non_negative_float,
        default=0.1,
        help="SGD learning rate; 0 trains nothing, on purpose (default: 0.1)",
    )
    p.add_argument(
        "--scale-lr",
        action="store_true",
        help=f"the linear scaling rule: lr x global batch / {REFERENCE_BATCH} (global batch: "
        f"--batch-size x the DDP world size) (default: off, lr as given)",
    )
    p.add_argument(
        "--lr-warmup-steps",
        type=non_negative_int,
        default=0,
        help="ramp the learning rate linearly over the first N training steps, step k at "
        "lr x k / N (gradual warm-up, for large batches with --scale-lr); with --cuda-graph "
        "the ramp must end inside the warm-up, N < --warmup-steps (default: 0, no ramp)",
    )
    p.add_argument("--momentum", type=non_negative_float, default=0.9, help="SGD momentum (default: 0.9)")
    p.add_argument("--weight-decay", type=non_negative_float, default=5e-4, help="SGD weight decay (default: 5e-4)")


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """What profile mode records, where the files go, and the study's bookkeeping."""
    p.add_argument(
        "--profile-detail",
        choices=sorted(scopes.DETAIL),
        default="full",
        help="mode=profile: full records shapes, memory and Python stacks (the tutorial's capture); "
        "lean records none of them, so the profiled main process runs closer to its "
        "unprofiled pace (default: full)",
    )
    p.add_argument(
        "--unprofiled-steps",
        type=block_steps,
        default=None,
        help="mode=profile: the steps timed without the profiler just before the capture, and again just after "
        "it; the profiler's slow-down is read against them (fewer where each step takes seconds; more for a "
        "narrower interval); with --profile-phase checkpoint a multiple of --checkpoint-every "
        f"(default: {scopes.UNPROFILED_STEPS}, or the largest multiple of --checkpoint-every not above it)",
    )
    p.add_argument(
        "--memory-snapshot",
        action="store_true",
        help=f"after the warm-up, record the CUDA caching allocator's history over {STEPS} steps (Python stacks, "
        f"at most {MAX_ENTRIES} entries), then time {STEPS} steps without it; the snapshot "
        "(memory-snapshot.pickle, for pytorch.org/memory_viz) and its text summary go beside run.json; "
        "outside the bench window and the profiler's steps (needs CUDA) (default: off)",
    )
    p.add_argument(
        "--trace-format",
        choices=["json.gz", "json"],
        default="json.gz",
        help="Chrome trace files: gzipped (about ten times smaller; Perfetto opens both) or plain (default: json.gz)",
    )
    p.add_argument(
        "--output-dir", default=None, help="where artifacts are written (default: the Polyaxon run's outputs folder)"
    )
    p.add_argument(
        "--force-workers", action="store_true", help="allow --workers above 4x the CPU budget (default: refused)"
    )
    p.add_argument(
        "--repeat",
        type=non_negative_int,
        default=None,
        help="index of this job in an alternating series; only recorded and tagged (default: none)",
    )


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="train.py", description=DESCRIPTION)
    add_workload_arguments(p)
    add_optimizer_arguments(p)
    add_output_arguments(p)
    phases.add_arguments(p, positive_int)
    options.add_arguments(p, positive_int)
    distributed.add_arguments(p, non_negative_int, non_negative_float)
    return p


def parse_settings(argv: list[str] | None = None) -> argparse.Namespace:
    """The settings, validated once: a bad flag or a senseless combination exits 2 in one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.momentum >= 1:
        parser.error(f"argument --momentum: must be < 1, got {args.momentum}")
    if args.data in ("synthetic", "learnable") and args.batch_size > SYNTHETIC_SIZE:
        parser.error(
            f"argument --batch-size: {args.batch_size} is more than the {args.data} set's "
            f"{SYNTHETIC_SIZE} images (one step would need more than the whole set)"
        )
    options.check(args, parser.error)
    if args.memory_snapshot and args.device == "cpu":
        parser.error(f"argument --memory-snapshot: {NEEDS_CUDA}, not --device cpu")
    if args.cuda_graph and args.lr_warmup_steps >= max(args.warmup_steps, 1):
        parser.error(
            f"argument --lr-warmup-steps: with --cuda-graph the captured step keeps the rate it was "
            f"captured with, so the ramp must end in the warm-up's eager steps: give "
            f"--lr-warmup-steps < --warmup-steps ({args.warmup_steps}), not {args.lr_warmup_steps}"
        )
    phases.check(args, parser.error)  # after the options' own refusals: a phase names the option it cannot use
    if args.unprofiled_steps is None:  # the checkpoint phase has set its own
        args.unprofiled_steps = scopes.UNPROFILED_STEPS
    distributed.check(args, parser.error)
    return args
