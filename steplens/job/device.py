"""The device a run uses, settled once: CUDA when torch sees it (or is told to), else the CPU, said loudly."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from steplens.errors import UserError

if TYPE_CHECKING:
    import torch


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(requested: str) -> torch.device:
    import torch

    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if requested == "cuda":
        raise UserError(
            "--device cuda was asked for but torch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use --device cpu or auto"
        )
    print("device: NO CUDA DEVICE, running on the CPU: these are CPU numbers, not GPU numbers", file=sys.stderr)
    return torch.device("cpu")


NO_CPU_PEAK = (
    "the CPU has no caching allocator whose peak torch reports: the window's peak memory is read on a GPU only"
)


class WindowPeak:
    """The GPU memory a window peaks at: the allocator's peak counters zeroed before it (after a synchronization,
    so no earlier work is still allocating), read after it."""

    def __init__(self, device: torch.device):
        import torch

        self.device = device
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def read(self) -> dict[str, float | str | None]:
        """peak_allocated_mb and peak_reserved_mb (MB, 10^6 bytes) since the reset; on the CPU both None, with
        peak_memory_note saying why."""
        import torch

        if self.device.type != "cuda":
            return {"peak_allocated_mb": None, "peak_reserved_mb": None, "peak_memory_note": NO_CPU_PEAK}
        return {
            "peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 1e6,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 1e6,
            "peak_memory_note": None,
        }
