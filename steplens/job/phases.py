"""--profile-phase: what profile mode captures (training steps, validation on a held-out set, or training steps
with checkpoint saves), its flags and refusals, and what bench mode measures of the phase without the profiler.

    train.py --mode profile --profile-phase validation   # eval/next_batch, eval/to_device, eval/forward
    train.py --mode profile --profile-phase checkpoint   # the four training scopes, checkpoint/save every 2nd step
    train.py --mode bench --profile-phase validation     # also: validation samples/s over the held-out window
    train.py --mode bench --profile-phase checkpoint     # also: a save's seconds and MB/s (median of BENCH_SAVES)

Profile mode captures the phase's steps exactly as it captures training ones (the same schedule, the same
unprofiled blocks around it, the same evidence): the phase hands train.py's run_profile its step and batches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from steplens import scopes
from steplens.job.data import HELD_OUT_SIZE, Batches, build_held_out, hook_seconds, loader_facts
from steplens.job.device import synchronize
from steplens.job.stopping import Stopper
from steplens.speedups import options

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from steplens.job.data import ImageSet

PHASES = list(scopes.PHASES)  # train, validation, checkpoint
BENCH_SAVES = 3  # bench mode times this many saves after its window; their median is the save's cost
SLOW_SAVE_ENV = "STEPLENS_TEST_SLOW_SAVE_MS"  # a test hook: each save in a capture sleeps this long before its rename


def add_arguments(p: argparse.ArgumentParser, positive_int: Callable[[str], int]) -> None:
    """--profile-phase and --checkpoint-every."""
    p.add_argument(
        "--profile-phase",
        choices=PHASES,
        default="train",
        help="what mode=profile captures: train, the training steps; validation, held-out batches in eval mode "
        "under no_grad (scopes eval/next_batch, eval/to_device, eval/forward); checkpoint, the training "
        "steps with the model and optimizer saved every --checkpoint-every steps (scope checkpoint/save). "
        "mode=bench times the training window as always, then also the phase: validation samples/s, "
        "or a save's seconds and MB/s (default: train)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=None,
        help=f"with --profile-phase checkpoint: save after every Nth step; in mode=profile at most "
        f"{scopes.SCHEDULE['active']}, so that each cycle of {scopes.SCHEDULE['active']} profiled steps holds a "
        f"save (default: {scopes.CHECKPOINT_EVERY})",
    )


def check(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """Refuse what a phase cannot do, before torch is imported; error() prints one line and exits 2.
    Sets args.checkpoint_every to its default for the checkpoint phase."""
    phase = args.profile_phase
    if args.checkpoint_every is not None and phase != "checkpoint":
        error("--checkpoint-every sets how often the checkpoint phase saves: add --profile-phase checkpoint")
    if phase == "train":
        return
    if args.ddp:
        error(
            f"--profile-phase {phase} runs in one process: the evidence across ranks (steplens ranks) reads the "
            "training scopes alone; drop --ddp"
        )
    if phase == "validation" and args.gpu_input:
        error(
            "--profile-phase validation reads the held-out set through a DataLoader, and --gpu-input (which "
            "--cuda-graph needs) keeps only the training set on the device: drop --gpu-input to capture validation"
        )
    if phase == "validation" and args.batch_size > HELD_OUT_SIZE:
        error(f"--batch-size {args.batch_size} is more than the held-out set's {HELD_OUT_SIZE} images")
    if phase == "checkpoint":
        args.checkpoint_every = args.checkpoint_every or scopes.CHECKPOINT_EVERY
        active = scopes.SCHEDULE["active"]
        if args.mode == "profile" and args.checkpoint_every > active:
            error(
                f"--checkpoint-every {args.checkpoint_every} would leave a cycle of {active} profiled steps "
                f"without a save: give at most {active}"
            )
        every, steps = args.checkpoint_every, args.unprofiled_steps
        if args.mode == "profile" and steps is not None and steps % every:
            error(
                f"--unprofiled-steps {steps}: the unprofiled steps save every {every} steps too, so each block "
                f"must hold whole rounds of saves: give a multiple of --checkpoint-every {every}"
            )
        if steps is None and args.mode == "profile":  # whole rounds of saves: blocks save as the profiled steps do
            args.unprofiled_steps = scopes.UNPROFILED_STEPS - scopes.UNPROFILED_STEPS % every


def _profiler_recording() -> bool:
    """Whether a torch profiler records on this thread now (its active steps, not its warm-up); True where torch
    cannot say."""
    import torch

    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return True if enabled is None else bool(enabled())


def slow_save_seconds() -> float:
    """The test hook SLOW_SAVE_ENV in seconds (0 when unset): a deliberately slow save, for the tests of the
    checkpoint phase's verdict. Documented in docs/PHASES.md; no run outside the tests sets it."""
    return hook_seconds(SLOW_SAVE_ENV)


class Saver:
    """checkpoint/save's body: the model's and the optimizer's state to outputs/checkpoints/checkpoint.pt, written
    to a temp file and renamed (a reader never meets half a checkpoint); each save's seconds and bytes kept."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, out_dir: str):
        self.model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the module's own names
        self.optimizer = optimizer
        self.path = os.path.join(out_dir, "checkpoints", "checkpoint.pt")
        self.slow_s = slow_save_seconds()
        self.seconds, self.bytes = [], []

    def save(self) -> None:
        import torch

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(self.path), f".partial-{os.getpid()}-checkpoint.pt")
        t0 = time.perf_counter()
        try:
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, tmp)
            if self.slow_s and _profiler_recording():  # the hook slows the saves a trace sees, not the others
                time.sleep(self.slow_s)
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self.seconds.append(time.perf_counter() - t0)
        self.bytes.append(os.path.getsize(self.path))

    def facts(self) -> dict[str, Any]:
        """What run.json says of the saves made: their count, the file, its size, each save's seconds."""
        return {
            "path": self.path,
            "saves": len(self.seconds),
            "bytes": self.bytes[-1] if self.bytes else None,
            "save_seconds_each": [round(s, 4) for s in self.seconds],
        }


def saving(step: Callable[[], Any], saver: Saver, every: int) -> Callable[[], Any]:
    """The training step, then a save under the scope checkpoint/save after every `every`th call (the four
    training scopes stay as they are). Counted from the first call: the capture's first unprofiled block
    has --unprofiled-steps steps, so the profiled steps with a save are the same in every run of the same flags."""
    from torch.profiler import record_function

    calls = 0

    def step_and_save():
        nonlocal calls
        loss = step()
        calls += 1
        if calls % every == 0:
            with record_function(scopes.SAVE):
                saver.save()
        return loss

    return step_and_save


def make_eval_step(
    batches: Batches,
    model: torch.nn.Module,
    to_device: Callable[[Any, Any], tuple[Any, Any]],
    autocast: Callable[[], Any],
) -> Callable[[], None]:
    """A validation step: a held-out batch through the model in eval mode under no_grad, in three scopes.
    No synchronization: the forward's GPU work runs on after eval/forward ends, as training's does."""
    import torch
    from torch.profiler import record_function

    def step():
        with torch.no_grad():
            with record_function(scopes.EVAL_NEXT_BATCH):
                images, targets = next(batches)
            with record_function(scopes.EVAL_TO_DEVICE):
                images, targets = to_device(images, targets)
            with record_function(scopes.EVAL_FORWARD), autocast():
                model(images)

    return step


class Phase:
    """The run's --profile-phase, built once in train.py's main: it hands the capture the phase's step and
    batches (for_capture), adds the phase's unprofiled figures to a bench run (bench), and says what it did
    (facts, for run.json)."""

    def __init__(
        self,
        args: argparse.Namespace,
        device: torch.device,
        parts: tuple[torch.nn.Module, torch.optim.Optimizer],
        out_dir: str,
        make_loader: Callable[[ImageSet], DataLoader],
    ):
        self.args, self.device, self.model = args, device, parts[0]
        self.name, self.loader, self.held_out = args.profile_phase, None, None
        self.saver = Saver(*parts, out_dir) if self.name == "checkpoint" else None
        if self.name == "validation":
            dataset, self.held_out = build_held_out(args)
            self.loader = make_loader(dataset)  # train.py's DataLoader, unshuffled

    def for_capture(
        self, step: Callable[[], Any], batches: Any, loader: dict[str, Any], stop: Stopper
    ) -> tuple[Callable[[], Any], Any, dict[str, Any]]:
        """The step, batches and loader facts profile mode captures: training's as they are; training's with a
        save every --checkpoint-every steps; or validation steps over the held-out set, after their warm-up."""
        if self.saver:
            return saving(step, self.saver, self.args.checkpoint_every), batches, loader
        if self.name != "validation":
            return step, batches, loader
        step, batches = self._eval_step()
        with stop.steps("validation warm-up"):  # eval mode's first batches: cuDNN choices, compilation
            print(f"validation warm-up: {self.args.warmup_steps} held-out batches", file=sys.stderr)
            for _ in range(self.args.warmup_steps):
                step()
                stop.step_done()
        synchronize(self.device)
        return step, batches, {**loader_facts(self.loader, self.args.workers), "shuffle": False}

    def _eval_step(self):
        self.model.eval()  # batch norm reads its running statistics; the run trains no more after this
        _, autocast = options.precision(self.device, self.args)
        batches = Batches(self.loader)
        return make_eval_step(batches, self.model, options.to_device_fn(self.device, self.args), autocast), batches

    def bench(self, results: dict[str, Any], stop: Stopper) -> None:
        """After the training window: the validation window's rate, or BENCH_SAVES timed saves, into results."""
        if self.name == "validation":
            results["validation"] = self._bench_validation(stop)
        elif self.saver:
            results["checkpoint"] = self._bench_saves(stop)

    def _bench_validation(self, stop):
        """The held-out batches left after the eval warm-up in one pass (at most --bench-steps), between two
        synchronizations: no epoch boundary inside the window."""
        step, batches = self._eval_step()
        n = len(self.loader)
        warm = min(self.args.warmup_steps, n - 1)
        window = min(self.args.bench_steps, n - warm)
        with stop.steps("validation bench"):
            print(f"bench: validation: {warm} warm-up batches, then timing {window}", file=sys.stderr)
            for _ in range(warm):
                step()
                stop.step_done()
            synchronize(self.device)
            t0 = time.perf_counter()
            for _ in range(window):
                step()
                stop.step_done()
            synchronize(self.device)
        seconds = time.perf_counter() - t0
        samples = window * self.args.batch_size
        self.model.train()
        return {
            "samples_per_sec": samples / seconds,
            "window_seconds": seconds,
            "window_steps": window,
            "window_samples": samples,
            "warmup_steps": warm,
            "held_out_batches": n,
            "epoch_restarts_in_window": batches.epoch_restarts,
        }

    def _bench_saves(self, stop):
        """BENCH_SAVES saves, each after a synchronization (the step's queued GPU work is not the save's)."""
        with stop.steps("checkpoint bench"):
            print(f"bench: checkpoint: timing {BENCH_SAVES} saves to {self.saver.path}", file=sys.stderr)
            for _ in range(BENCH_SAVES):
                synchronize(self.device)
                self.saver.save()
                stop.step_done()
        seconds, sizes = self.saver.seconds[-BENCH_SAVES:], self.saver.bytes[-BENCH_SAVES:]
        rates = [b / 1e6 / s for b, s in zip(sizes, seconds)]
        return {
            "saves": BENCH_SAVES,
            "save_seconds": statistics.median(seconds),
            "save_mb_per_sec": statistics.median(rates),
            "checkpoint_mb": sizes[-1] / 1e6,
            "save_seconds_each": seconds,
            "save_mb_per_sec_each": rates,
        }

    def facts(self) -> dict[str, Any]:
        """run.json's account of the phase: its name, the held-out set, the saves made."""
        out = {"phase": self.name}
        if self.held_out:
            out["held_out"] = self.held_out
        if self.saver:
            out["checkpoint"] = {"every": self.args.checkpoint_every, **self.saver.facts()}
        return out


# Polyaxon outputs of a bench run's phase: (results key, figure, output name).
PHASE_OUTPUTS = (
    ("validation", "samples_per_sec", "validation_samples_per_sec"),
    ("validation", "window_seconds", "validation_window_seconds"),
    ("validation", "window_samples", "validation_window_samples"),
    ("checkpoint", "save_seconds", "checkpoint_save_seconds"),
    ("checkpoint", "save_mb_per_sec", "checkpoint_save_mb_per_sec"),
    ("checkpoint", "checkpoint_mb", "checkpoint_mb"),
)


def bench_lines(results: dict[str, Any]) -> list[str]:
    """What a bench run prints of its phase."""
    lines = []
    v, c = results.get("validation"), results.get("checkpoint")
    if v:
        lines.append(
            f"bench: validation: {v['samples_per_sec']:.1f} samples/s ({v['window_steps']} held-out batches, "
            f"{v['window_samples']} samples, in {v['window_seconds']:.3f}s, eval mode under no_grad)"
        )
    if c:
        lines.append(
            f"bench: checkpoint: a save takes {c['save_seconds']:.3f}s (median of {c['saves']}), "
            f"{c['checkpoint_mb']:.1f} MB at {c['save_mb_per_sec']:.1f} MB/s (MB = 10^6 bytes)"
        )
    return lines


def outputs(results: dict[str, Any]) -> dict[str, Any]:
    """The phase's bench figures as Polyaxon outputs (none for the training phase)."""
    return {
        name: results[part][key]
        for part, key, name in PHASE_OUTPUTS
        if results.get(part) and results[part].get(key) is not None
    }
