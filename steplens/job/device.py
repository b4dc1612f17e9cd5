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
