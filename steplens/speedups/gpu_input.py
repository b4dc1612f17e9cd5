"""--gpu-input: the uint8 training set on the device, batches shuffled, cropped, flipped and normalized there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from steplens.errors import UserError

if TYPE_CHECKING:
    import torch


class DeviceBatches:
    """The uint8 set on the device; crop (zero padding 4), flip and normalize per batch there.

    Draws what the PIL chain draws: crop offsets uniform over 9x9, flip with probability 1/2, the
    same padding value (0 before normalization) and the same normalization; shuffled epochs.
    Two ways to the same batches: next() slices the epoch's order at a host position;
    assemble_at_cursor() reads the position from a device counter, so that --cuda-graph can capture it.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        device: torch.device,
        seed: int,
        mean: Sequence[float],
        std: Sequence[float],
    ):
        import torch

        self.torch, self.batch_size, self.device = torch, batch_size, device
        data = torch.as_tensor(dataset.data)  # (N, 32, 32, 3) uint8, as torchvision's CIFAR10 holds it
        if len(data) < batch_size:
            raise UserError(
                f"the data set holds fewer images than one batch ({len(data)} < {batch_size}): lower --batch-size"
            )
        self.data = data.permute(0, 3, 1, 2).contiguous().to(device)
        self.targets = torch.as_tensor(dataset.targets, dtype=torch.long).to(device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)
        self.order = torch.empty(len(self.data), dtype=torch.long, device=device)
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)  # position, for captured assembly
        self.offsets = torch.arange(batch_size, device=device)
        self.epoch_restarts = -1
        self._new_epoch()

    def facts(self, mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
        """What run.json says of the input: the transform and the batches, no DataLoader."""
        return {
            "input_transform": "on the device, batched (steplens.speedups.gpu_input.augment): "
            f"RandomCrop(32, padding=4, fill=0), RandomHorizontalFlip(p=0.5), /255, Normalize({mean}, {std})",
            "loader": {
                "kind": "device",
                "note": "batches assembled and augmented on the device, no DataLoader",
                "batches_per_epoch": len(self.data) // self.batch_size,
            },
        }  # DDP: this rank's shard

    def _new_epoch(self):
        # In place: a captured graph holds the address of self.order.
        self.order.copy_(self.torch.randperm(len(self.data), device=self.device, generator=self.generator))
        self.position = 0
        self.epoch_restarts += 1

    def __iter__(self):
        return self

    def __next__(self):
        self.advance()
        index = self.order[self.position - self.batch_size : self.position]
        return self._batch(index)

    def advance(self) -> None:
        """Host side of a step: start a new epoch when this one cannot fill a batch (drop_last)."""
        if self.position + self.batch_size > len(self.order):
            self._new_epoch()
            self.cursor.zero_()
        self.position += self.batch_size

    def sync_cursor(self) -> None:
        """Point the device counter at the host position (before a capture)."""
        self.cursor.fill_(self.position)

    def assemble_at_cursor(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at the device counter, which it then advances: no host value in it, so capturable.

        The caller runs advance() on the host before each replay, which keeps epochs turning over.
        """
        index = self.order.index_select(0, self.cursor + self.offsets)
        self.cursor.add_(self.batch_size)
        return self._batch(index)

    def _batch(self, index):
        images, _, _ = augment(self.data.index_select(0, index), self.generator, self.mean, self.std)
        return images, self.targets.index_select(0, index)


def augment(
    images_uint8: torch.Tensor, generator: torch.Generator, mean: torch.Tensor, std: torch.Tensor, padding: int = 4
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Batched RandomCrop(32, padding) + RandomHorizontalFlip + ToTensor + Normalize; returns the draws too."""
    import torch

    n, _, h, w = images_uint8.shape
    device = images_uint8.device
    x = torch.nn.functional.pad(images_uint8.float().div_(255), (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    rows = (dy[:, None] + torch.arange(h, device=device))[:, None, :, None]
    cols = torch.arange(w, device=device).expand(n, w)
    cols = torch.where(flip[:, None], cols.flip(1), cols) + dx[:, None]
    x = x[
        torch.arange(n, device=device)[:, None, None, None],
        torch.arange(3, device=device)[None, :, None, None],
        rows,
        cols[:, None, None, :],
    ]
    return (x - mean) / std, (dy, dx), flip
