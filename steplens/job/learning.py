"""The learning check: the learning-rate rule, and the loss of every bench-window step, read after the window.

A change that makes the step faster must still let the model learn. On --data learnable the loss falls towards
zero when it does; bench mode records each window step's loss (loss_first, loss_final, the metric
window_loss) and steplens compare sets each group's final loss beside its rate.
Torch is imported only inside the functions that use it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from steplens.job.runrecord import RunRecord

REFERENCE_BATCH = 128  # the tutorial's batch: --scale-lr keeps lr / batch what it is there
LAST_STEPS = 10  # loss_final: the mean loss of the window's last 10 steps (fewer when the window is shorter)


def learning_rate(args: argparse.Namespace, world_size: int) -> dict[str, Any]:
    """The SGD learning rate the run uses and how it was set (run.json's learning_rate).

    --scale-lr: the linear scaling rule, lr x global batch / 128, where the global batch is --batch-size
    on every rank together (DDP averages the ranks' gradients, so one optimizer step sees all of them).
    --lr-warmup-steps N: the first N steps ramp the rate, step k at effective_lr x k / N. They count the
    warm-up steps first, then what follows it: bench mode's timed window, or profile mode's unprofiled
    steps before its capture, then the profiled ones. ramp_steps_after_warm_up says how many fall after
    the warm-up, and ramp_note says so in a sentence (train.py prints it as a warning).
    """
    global_batch = args.batch_size * world_size
    effective = args.lr * global_batch / REFERENCE_BATCH if args.scale_lr else args.lr
    rule = f"linear scaling: {args.lr:g} x {global_batch} / {REFERENCE_BATCH}" if args.scale_lr else "as given by --lr"
    ramp = args.lr_warmup_steps
    after = max(0, ramp - args.warmup_steps)
    note = (
        f"{after} of the {ramp} --lr-warmup-steps fall after the {args.warmup_steps} warm-up steps: those "
        f"steps run below the full rate (give --warmup-steps {ramp} or more to keep them out)"
        if after
        else None
    )
    return {
        "lr": args.lr,
        "scale_lr": args.scale_lr,
        "global_batch": global_batch,
        "reference_batch": REFERENCE_BATCH,
        "effective_lr": effective,
        "rule": rule,
        "ramp_steps": ramp,
        "ramp_steps_after_warm_up": after,
        "ramp_note": note,
        "warmup": f"linear: step k of the first {ramp} at effective_lr x k / {ramp}" if ramp else None,
    }


def ramped(
    step: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer, lr: float, steps: int
) -> Callable[[], torch.Tensor]:
    """--lr-warmup-steps: the step, with every parameter group's rate set to lr x k / steps before its k-th call
    for k <= steps, then left at lr. A plain float in the optimizer's groups: no device work, no sync.
    A captured step (--cuda-graph) keeps the rate of its capture: steplens/job/settings.py makes the ramp end before it.
    """
    if not steps:
        return step
    calls = 0

    def step_with_rate():
        nonlocal calls
        if calls < steps:
            calls += 1
            for group in optimizer.param_groups:
                group["lr"] = lr * calls / steps
        return step()

    return step_with_rate


class LossCurve:
    """Each window step's loss, kept on the device until the window is over.

    add() copies the step's loss into a preallocated buffer in place: a copy queued on the device behind
    the step, with no synchronization and no host read. values() reads the buffer once; call it after the
    window's closing synchronization. A captured step (--cuda-graph) returns the same static loss tensor
    at every replay: the copy, queued right after the replay, keeps each value before the next replay
    overwrites it.
    """

    def __init__(self, device: torch.device, steps: int):
        import torch

        self.buffer = torch.full((steps,), float("nan"), dtype=torch.float32, device=device)
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        self.buffer[self.count].copy_(loss.detach())  # detached: the buffer must not hold the step's graph
        self.count += 1

    def values(self) -> list[float]:
        return self.buffer[: self.count].tolist()


def summary(losses: list[float]) -> dict[str, Any]:
    """loss_first (the window's first step), loss_final (the mean of its last 10 steps) and the curve.

    A loss that is not finite means the training diverged: loss_final is then None, and loss_diverged_step
    says at which window step (1-based) it first happened.
    """
    bad = next((i for i, v in enumerate(losses, start=1) if not math.isfinite(v)), None)
    last = losses[-LAST_STEPS:]
    return {
        "window_losses": [v if math.isfinite(v) else None for v in losses],
        "loss_final_steps": len(last),
        "loss_first": losses[0] if losses and math.isfinite(losses[0]) else None,
        "loss_final": sum(last) / len(last) if last and bad is None else None,
        "loss_diverged_step": bad,
        "loss_after_window": losses[-1] if losses and math.isfinite(losses[-1]) else None,
    }


def log_losses(record: RunRecord, results: dict[str, Any]) -> str:
    """The curve as the Polyaxon metric window_loss (by window step, a name no output has); a line for stdout."""
    record.log_steps("window_loss", {i: v for i, v in enumerate(results["window_losses"], start=1) if v is not None})
    first = "n/a" if results["loss_first"] is None else f"{results['loss_first']:.4f}"
    if results["loss_diverged_step"] is not None:
        return (
            f"bench: loss {first} at the window's first step; not finite from window step "
            f"{results['loss_diverged_step']} on: the training diverged (lower --lr)"
        )
    line = (
        f"bench: loss {first} at the window's first step, {results['loss_final']:.4f} over its last "
        f"{results['loss_final_steps']} (mean)"
    )
    if (record["settings"] or {}).get("data") == "synthetic":  # noise labels: the loss cannot fall
        line += "; --data synthetic has random labels, so this loss says nothing of learning (--data learnable does)"
    return line
