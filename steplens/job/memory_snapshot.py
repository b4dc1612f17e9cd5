"""--memory-snapshot: the CUDA caching allocator's history over a few steps after the warm-up, for memory_viz.

From the device's resolution on, the allocator keeps the Python stack of every block it hands out (so the
model's parameters, made later, carry theirs). After the warm-up, STEPS steps run with its history recorded
(allocations and frees, a ring buffer of MAX_ENTRIES entries); the snapshot is taken and the recording
stopped; then the same number of steps run without it, timed the same way, so run.json holds what recording
cost. The mode's own steps (the profiler's, the bench window) come after, unrecorded. The pickle is written
atomically beside run.json (pytorch.org/memory_viz opens it), its text summary beside it
(steplens/evidence/snapshot.py), and both are logged to Polyaxon once they exist.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from steplens.atomic import write_atomic
from steplens.errors import UserError
from steplens.evidence import snapshot as summary
from steplens.job.capture import Laps
from steplens.job.device import synchronize

if TYPE_CHECKING:
    import torch

    from steplens.job.runrecord import RunRecord
    from steplens.job.stopping import Stopper

STEPS = 3  # steps recorded, and as many timed without the recording
MAX_ENTRIES = 100_000  # the history's ring buffer: a ResNet18 step makes about a thousand entries
CONTEXT = "alloc"  # stacks for allocations (and for the blocks in use), not for frees
NEEDS_CUDA = "--memory-snapshot records the CUDA caching allocator's history: it needs a CUDA device"


def refuse_cpu(device_type: str) -> None:
    """Raise the one-line refusal where the device is the CPU."""
    if device_type != "cuda":
        raise UserError(f"{NEEDS_CUDA}; this run's device is the {device_type.upper()}")


def record_history(enabled: str | None, context: str | None = None, max_entries: int | None = None) -> None:
    """torch.cuda.memory._record_memory_history with Python stacks only, through the four keywords torch 2.1 to
    2.14 all take (enabled, context, stacks, max_entries; later ones added clear_history, skip_actions, ...).
    enabled=None stops the recording."""
    import torch

    if enabled is None:
        torch.cuda.memory._record_memory_history(enabled=None)
        return
    kwargs = {"enabled": enabled, "context": context, "stacks": "python"}
    if max_entries is not None:
        kwargs["max_entries"] = max_entries
    torch.cuda.memory._record_memory_history(**kwargs)


class SnapshotPhase:
    """The recorded steps and the files they make: start() once the device is known, run() after the warm-up."""

    @classmethod
    def start(cls, args: argparse.Namespace, device: torch.device) -> SnapshotPhase | None:
        """None without --memory-snapshot; refused in one line off CUDA; else every block's stack is kept from now
        on (the warm-up pays for it; the bench window and the profiler's steps do not)."""
        if not args.memory_snapshot:
            return None
        refuse_cpu(device.type)
        record_history("state", context="state")  # each block's stack, no history yet
        return cls()

    @staticmethod
    def _timed(step: Callable[[], Any], device: torch.device, stop: Stopper) -> dict[str, Any]:
        """STEPS steps between two synchronizations: the wall time, and each step's time on the device's clock."""
        laps = Laps(True)
        synchronize(device)
        t0 = time.perf_counter()
        laps.lap()
        for _ in range(STEPS):
            step()
            laps.lap()
            stop.step_done()
        synchronize(device)
        return {"wall_seconds": round(time.perf_counter() - t0, 6), "step_seconds": laps.seconds()}

    def run(
        self, step: Callable[[], Any], device: torch.device, record: RunRecord, stop: Stopper, world: Any
    ) -> dict[str, Any]:
        """Record, snapshot, stop recording, time the same steps without it; save, summarize and log the files.
        world: a distributed.World; in a DDP run each rank's file is named by its rank."""
        import torch

        path = os.path.join(record.out_dir, f"memory-snapshot{f'-rank{world.rank}' if world.active else ''}.pickle")
        with stop.steps("memory snapshot"):
            print(f"memory snapshot: {STEPS} steps recorded, then {STEPS} without", file=sys.stderr)
            # 1) the recorded steps: history on, the allocator's peak zeroed so torch's own figure stands beside it
            synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            record_history("all", context=CONTEXT, max_entries=MAX_ENTRIES)
            try:
                recorded = self._timed(step, device, stop)
                data = torch.cuda.memory._snapshot()
            finally:
                record_history(None)  # nothing after this is recorded, a failure included
            torch_peak = torch.cuda.max_memory_allocated(device)
            # 2) the same number of steps without the recording
            plain = self._timed(step, device, stop)
        # 3) the file, whole or absent, then its summary; each logged once it exists
        write_atomic(path, pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        record.log_file(path, "memory-snapshot")
        try:
            text_path, figures = summary.write_summary(path)
        except summary.SnapshotError as e:  # the pickle stays, for memory_viz; the run says why it has no summary
            print(f"memory snapshot: warning: no summary: {e}", file=sys.stderr)
            text_path, figures = None, {"devices": [], "error": str(e)}
        else:
            record.log_file(text_path, "memory-snapshot-summary")
        return describe(path, text_path, figures, recorded, plain, torch_peak, device.index or 0)


def describe(
    path: str,
    text_path: str | None,
    figures: dict[str, Any],
    recorded: dict[str, Any],
    plain: dict[str, Any],
    torch_peak: int,
    device_index: int,
) -> dict[str, Any]:
    """run.json's memory_snapshot entry: the files, the recording's settings and cost, and the peak beside
    torch's own (the snapshot counts the bytes asked for, until a free completes; torch counts the allocator's
    blocks until a free is requested: the snapshot's peak less its pending frees is at most torch's)."""
    mine = next((d for d in figures["devices"] if d["device"] == device_index), None)
    out = {
        "file": path,
        "summary": text_path,
        "summary_error": figures.get("error"),
        "steps": STEPS,
        "stacks": "python",
        "context": CONTEXT,
        "max_entries": MAX_ENTRIES,
        "history_entries": mine["history_entries"] if mine else 0,
        "history_full": bool(mine) and mine["history_entries"] >= MAX_ENTRIES,
        "recorded": recorded,
        "unrecorded": plain,
        "recorded_over_unrecorded": (
            round(recorded["wall_seconds"] / plain["wall_seconds"], 4) if plain["wall_seconds"] > 0 else None
        ),
        "peak_bytes": mine["peak_bytes"] if mine else None,  # bytes asked for; waiting frees counted
        "pending_free_at_peak_bytes": mine["pending_free_at_peak_bytes"] if mine else None,
        "torch_peak_allocated_bytes": torch_peak,  # the allocator's blocks: rounded up, or not split
        "by_class_bytes": mine["by_class"] if mine else None,
    }
    peak = "n/a" if out["peak_bytes"] is None else f"{out['peak_bytes'] / 1e6:.1f} MB"
    print(
        f"memory snapshot: {path} (peak in use {peak}; torch's allocated peak {torch_peak / 1e6:.1f} MB); "
        f"{STEPS} recorded steps {recorded['wall_seconds'] * 1e3:.1f} ms, "
        f"{STEPS} unrecorded {plain['wall_seconds'] * 1e3:.1f} ms",
        file=sys.stderr,
    )
    return out
