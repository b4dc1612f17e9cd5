"""--prefetch-stream: the host-to-device copy of the next batch on a side CUDA stream while this one computes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class PrefetchToDevice:
    """The copy of batch k+1 runs on a side stream while batch k computes."""

    def __init__(self, device: torch.device, first_batch: Sequence[torch.Tensor]):
        import torch

        self.torch, self.device = torch, device
        self.stream = torch.cuda.Stream(device=device)
        self.pending = self._copy(first_batch)

    def _copy(self, batch):
        with self.torch.cuda.stream(self.stream):
            return [t.to(self.device, non_blocking=True) for t in batch]

    def swap(self, next_host_batch: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Hand out the batch already copied; start copying next_host_batch behind it."""
        current = self.torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)  # the handed-out copy is complete before compute reads it
        ready = self.pending
        for t in ready:
            t.record_stream(current)  # the allocator must not reuse them while this stream uses them
        self.pending = self._copy(next_host_batch)
        return ready
