"""Distributed runs (DDP under torchrun): the process group, the rank facts, the collectives, the sampler.

train.py --ddp is started by torchrun, one process per GPU (LOCAL_RANK picks the device):

    # one machine, N GPUs (NCCL)
    torchrun --nproc-per-node N train.py --ddp --mode profile --workers 4
    # several machines: the same line on each, with --nnodes M --node-rank K --master-addr HOST --master-port PORT
    # CPU only (gloo), e.g. the tests
    torchrun --nproc-per-node 2 train.py --ddp --mode bench --device cpu --data synthetic --batch-size 4

Every rank runs the same steps and profiles the same ProfilerStep numbers; traces go under
traces/rank{R}/. Rank 0 alone owns the Polyaxon run: it broadcasts its outputs folder, every
rank writes there (locally one folder; on Polyaxon each replica's sidecar uploads the same
run's outputs), and rank 0 logs every rank's files once they exist (runrecord.start_record and
finish_record). The figures across ranks (the global rate, the slow rank) are steplens ranks's. Without
--ddp, World() is a world of one and every method here leaves the single-process path exactly as it was.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from steplens.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DistributedSampler

    from steplens.job.data import ImageSet

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


# --------------------------------------------------------------------------- settings


def add_arguments(
    p: argparse.ArgumentParser, non_negative_int: Callable[[str], int], non_negative_float: Callable[[str], float]
) -> None:
    g = p.add_argument_group("distributed (DDP under torchrun)")
    g.add_argument(
        "--ddp",
        action="store_true",
        help="DistributedDataParallel across the processes torchrun starts, one device each "
        "(default: off, one process)",
    )
    g.add_argument(
        "--ddp-backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="auto: NCCL on CUDA, gloo on the CPU; gloo on CUDA lets ranks share a GPU for a smoke "
        "test, never for a measurement (default: auto)",
    )
    g.add_argument(
        "--slow-rank",
        type=non_negative_int,
        default=None,
        help="teaching aid: this rank sleeps --slow-input-ms inside input/next_batch every step, a "
        "straggler on purpose (needs --ddp) (default: none)",
    )
    g.add_argument(
        "--slow-input-ms",
        type=non_negative_float,
        default=0.0,
        help="milliseconds the --slow-rank sleeps per step (default: 0)",
    )


def check(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """Refusals before torch is imported; error() prints one line and exits 2."""
    environ = os.environ
    if not args.ddp:
        if args.slow_rank is not None or args.slow_input_ms or args.ddp_backend != "auto":
            error("--slow-rank, --slow-input-ms and --ddp-backend need --ddp (they shape a distributed run)")
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in environ]
    if missing:
        error(
            f"--ddp needs the variables torchrun sets ({', '.join(missing)} missing): start it with "
            "torchrun --nproc-per-node N train.py --ddp ..."
        )
    if args.cuda_graph:
        # A captured DDP step would need the allreduce inside the graph (NCCL only, static buckets,
        # no gloo): not done here.
        error(
            "--cuda-graph with --ddp is not supported: the DDP allreduce would have to be captured too; "
            "drop one of them"
        )
    if (args.slow_rank is None) != (args.slow_input_ms == 0):
        error("--slow-rank R and --slow-input-ms M go together (M > 0): give both or neither")
    if args.slow_rank is not None and args.slow_rank >= int(environ["WORLD_SIZE"]):
        error(
            f"--slow-rank {args.slow_rank} is no rank of this world of {environ['WORLD_SIZE']} "
            f"(ranks 0 to {int(environ['WORLD_SIZE']) - 1})"
        )


# --------------------------------------------------------------------------- the world


class SlowInput:
    """--slow-rank: next() sleeps first, so the delay lands inside input/next_batch on that rank alone."""

    def __init__(self, batches: Iterator[Any], seconds: float):
        self.batches, self.seconds = batches, seconds

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(self.seconds)
        if hasattr(self.batches, "waited_s"):  # the loop waited this long for its batch: profile mode times it
            self.batches.waited_s += self.seconds
        return next(self.batches)


class Shard:
    """One rank's share of an in-memory data set (data, targets), for --gpu-input: every world_size-th image."""

    def __init__(self, dataset: ImageSet, rank: int, world_size: int):
        self.data = dataset.data[rank::world_size]
        self.targets = list(dataset.targets[rank::world_size])

    def __len__(self):
        return len(self.targets)


class World:
    """The ranks of this job. World() is one process (no --ddp); World.start() joins torchrun's process group."""

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        local_world_size: int = 1,
        backend: str | None = None,
        device: torch.device | None = None,
        shares_device: bool = False,
    ):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.local_world_size, self.backend, self.device = local_world_size, backend, device
        self.shares_device = shares_device
        self.active = backend is not None
        self.dist = None

    # ---- joining and leaving

    @classmethod
    def start(cls, args: argparse.Namespace, device: torch.device) -> World:
        """The process group and this rank's device: cuda:LOCAL_RANK with NCCL, the CPU with gloo."""
        import torch

        if not args.ddp:
            return cls(device=device)
        import torch.distributed as dist

        env = {k: int(os.environ[k]) for k in TORCHRUN_ENV if k in os.environ}
        rank, world_size, local_rank = env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]
        local_world_size = env.get("LOCAL_WORLD_SIZE", world_size)
        cuda = device.type == "cuda"
        backend = args.ddp_backend if args.ddp_backend != "auto" else ("nccl" if cuda else "gloo")
        shares = False
        if backend == "nccl" and not cuda:
            raise UserError("--ddp-backend nccl needs CUDA devices; on the CPU use gloo (--ddp-backend auto)")
        if cuda:
            count = torch.cuda.device_count()
            if local_world_size > count and backend == "nccl":  # every rank of the machine stops here
                raise UserError(
                    f"{local_world_size} ranks on this machine, {count} GPU(s) visible: NCCL refuses two ranks "
                    f"on one GPU. Start at most {count} processes per machine (--nproc-per-node), or use "
                    "--ddp-backend gloo for a smoke test that shares GPUs"
                )
            shares = local_world_size > count
            device = torch.device("cuda", local_rank % count)
            torch.cuda.set_device(device)
            if shares and local_rank == 0:
                print(
                    f"ddp: {local_world_size} ranks share {count} GPU(s) through gloo: a smoke test, NOT a measurement",
                    file=sys.stderr,
                )
        # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from torchrun.
        dist.init_process_group(backend=backend, **({"device_id": device} if backend == "nccl" else {}))
        world = cls(rank, world_size, local_rank, local_world_size, backend, device, shares)
        world.dist = dist
        if rank == 0:
            print(f"ddp: {world_size} ranks ({local_world_size} per machine), backend {backend}", file=sys.stderr)
        return world

    def close(self) -> None:
        if self.active and self.dist.is_initialized():
            self.dist.destroy_process_group()

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def facts(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "nnodes": self.world_size // self.local_world_size,
            "backend": self.backend,
            "device": str(self.device),
            "ranks_share_a_gpu": self.shares_device,
            "launcher": "torchrun" if self.active else None,
        }

    def tags(self) -> list[str]:
        return [f"world_size={self.world_size}"] if self.active else []

    # ---- collectives (no-ops in a world of one)

    def barrier(self) -> None:
        if self.active:
            self.dist.barrier(**({"device_ids": [self.device.index]} if self.backend == "nccl" else {}))

    def broadcast(self, obj: Any) -> Any:
        """rank 0's obj on every rank."""
        if not self.active:
            return obj
        box = [obj if self.is_leader else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out

    @contextmanager
    def local_leader_first(self) -> Iterator[None]:
        """The first rank of each machine runs the block (a download, say) before the others read its result."""
        if self.active and self.local_rank != 0:
            self.barrier()
        yield
        if self.active and self.local_rank == 0:
            self.barrier()

    # ---- what the step uses

    def sampler(self, dataset: ImageSet, seed: int) -> DistributedSampler | None:
        """DistributedSampler: each rank its own slice of every epoch's shuffle (seeded alike on all ranks)."""
        import torch

        if not self.active:
            return None
        return torch.utils.data.DistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed, drop_last=True
        )

    def shard(self, dataset: ImageSet) -> ImageSet | Shard:
        return Shard(dataset, self.rank, self.world_size) if self.active else dataset

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP over the (compiled) model; its allreduce runs inside loss.backward(), i.e. inside
        train/forward_backward, and DDP broadcasts rank 0's weights when it wraps."""
        if not self.active:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def slowed(self, batches: Iterator[Any], args: argparse.Namespace) -> Iterator[Any]:
        if self.active and args.slow_rank == self.rank:
            print(
                f"ddp: rank {self.rank} sleeps {args.slow_input_ms:g} ms inside input/next_batch every step "
                "(--slow-rank, a straggler on purpose)",
                file=sys.stderr,
            )
            return SlowInput(batches, args.slow_input_ms / 1000.0)
        return batches

    def seed_per_rank(self, np: ModuleType, random: ModuleType, seed: int) -> None:
        """After the model is built (same weights everywhere): augmentation drawn in this process differs per rank."""
        import torch

        if self.active:
            torch.manual_seed(seed + self.rank)
            np.random.seed(seed + self.rank)
            random.seed(seed + self.rank)

    @property
    def trace_subdir(self) -> str:
        return f"rank{self.rank}" if self.active else ""
