"""The training sets: CIFAR-10 read from its own Python format (downloaded when missing), the synthetic set and the
learnable set, all through the tutorial's PIL transform chain."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from steplens.errors import UserError
from steplens.job.loader_timeline import Timeline, mark_fetch

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader
    from torchvision import transforms

SYNTHETIC_SIZE = 50_000
SYNTHETIC_SEED = 0  # the synthetic images are the same in every run, whatever --seed says
HELD_OUT_SIZE = 10_000  # the held-out set of --profile-phase validation: CIFAR-10's test split has 10,000 images
HELD_OUT_SEED = 1  # the synthetic and learnable held-out sets: other images than the training set's (seed 0)
SLOW_SAMPLE_ENV = "STEPLENS_TEST_SLOW_SAMPLE_MS"  # a test hook: each sample sleeps this long after its transforms
LEARNABLE_NOISE = 64  # each pixel channel: its class's tint plus a uniform draw in [-64, +63]
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def build_transform() -> transforms.Compose:
    """The tutorial's augmentation, run per image on the CPU (in the DataLoader workers when there are any)."""
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD),
        ]
    )


def build_eval_transform() -> transforms.Compose:
    """The held-out set's transform: no augmentation, the same tensor conversion and normalization."""
    from torchvision import transforms

    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def build_held_out(args: argparse.Namespace) -> tuple[ImageSet, dict[str, Any]]:
    """The held-out set of --profile-phase validation, and a record of what it is: CIFAR-10's test split, or
    HELD_OUT_SIZE synthetic (learnable) images from HELD_OUT_SEED (the learnable set keeps the training set's tints)."""
    transform = build_eval_transform()
    facts = {"transform": repr(transform)}
    if args.data == "synthetic":
        dataset = SyntheticCIFAR10(transform, HELD_OUT_SIZE, HELD_OUT_SEED)
        return dataset, {**facts, "name": "synthetic held-out", "images": len(dataset), "seed": HELD_OUT_SEED}
    if args.data == "learnable":
        dataset = LearnableCIFAR10(transform, HELD_OUT_SIZE, images_seed=HELD_OUT_SEED)
        return dataset, {**facts, "name": "learnable held-out", "images": len(dataset), "seed": HELD_OUT_SEED}
    folder = os.path.join(args.data_dir, "cifar-10-batches-py")
    if not os.path.isdir(folder):
        download_cifar10(args.data_dir)
    dataset = ImageSet(*read_cifar10(folder, TEST_BATCHES), transform)
    print(f"data: CIFAR-10 test split from {folder} ({len(dataset)} images), held out", file=sys.stderr)
    return dataset, {**facts, "name": "cifar10 test", "images": len(dataset), "root": os.path.abspath(args.data_dir)}


def build_dataset(
    args: argparse.Namespace, transform: Callable[[Image.Image], torch.Tensor]
) -> tuple[ImageSet, dict[str, Any]]:
    """The training set and a record of what it really is."""
    if args.data == "synthetic":
        print(
            f"data: SYNTHETIC CIFAR-shaped images ({SYNTHETIC_SIZE} x 32x32x3 uint8, seed "
            f"{SYNTHETIC_SEED}), same transforms as CIFAR-10; not the real data set",
            file=sys.stderr,
        )
        dataset = SyntheticCIFAR10(transform)
        return dataset, {"name": "synthetic", "images": len(dataset), "seed": SYNTHETIC_SEED}
    if args.data == "learnable":
        dataset = LearnableCIFAR10(transform)
        print(
            f"data: LEARNABLE synthetic images ({SYNTHETIC_SIZE} x 32x32x3 uint8, seed {SYNTHETIC_SEED}): each "
            f"class its own tint plus noise, same transforms as CIFAR-10; not the real data set",
            file=sys.stderr,
        )
        noise = f"uniform integers in [-{LEARNABLE_NOISE}, +{LEARNABLE_NOISE - 1}] per pixel channel"
        return dataset, {
            "name": "learnable",
            "images": len(dataset),
            "seed": SYNTHETIC_SEED,
            "class_tints": dataset.tints,
            "noise": noise,
        }
    folder = os.path.join(args.data_dir, "cifar-10-batches-py")
    if not os.path.isdir(folder):
        download_cifar10(args.data_dir)
    dataset = ImageSet(*read_cifar10(folder), transform)
    print(f"data: CIFAR-10 training set from {folder} ({len(dataset)} images)", file=sys.stderr)
    return dataset, {"name": "cifar10", "images": len(dataset), "root": os.path.abspath(args.data_dir)}


class ImageSet:
    """uint8 HWC images and labels through the PIL transform chain, as torchvision's CIFAR10 feeds them."""

    def __init__(self, data: np.ndarray, targets: list[int], transform: Callable[[Image.Image], torch.Tensor]):
        self.data, self.targets, self.transform = data, targets, transform
        self.slow_s = slow_sample_seconds()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        from PIL import Image

        image = self.transform(Image.fromarray(self.data[index]))
        if self.slow_s:
            time.sleep(self.slow_s)
        return image, self.targets[index]

    def __getitems__(self, indices):
        """A batch's samples, as the DataLoader's fetcher asks for them; its start is noted (loader_timeline)."""
        mark_fetch()
        return [self[i] for i in indices]


def slow_sample_seconds() -> float:
    """The test hook SLOW_SAMPLE_ENV in seconds (0 when unset): a deliberately slow transform, for the tests of
    the workers' verdict and the stop tests that need a phase to last. Documented in docs/INPUT.md; no run outside
    the tests sets it."""
    return hook_seconds(SLOW_SAMPLE_ENV)


def hook_seconds(env: str) -> float:
    """A test hook's environment variable, milliseconds from 0 to 60000, in seconds (0 when unset); any other
    value is refused in one line."""
    text = os.environ.get(env, "").strip()
    try:
        ms = float(text) if text else 0.0
    except ValueError:
        ms = -1.0
    if not 0 <= ms < 60_000:
        raise UserError(f"{env}={text!r} is not a number of milliseconds from 0 to 60000")
    return ms / 1e3


class SyntheticCIFAR10(ImageSet):
    """CIFAR-shaped uint8 images and labels from a fixed seed."""

    def __init__(
        self, transform: Callable[[Image.Image], torch.Tensor], size: int = SYNTHETIC_SIZE, seed: int = SYNTHETIC_SEED
    ):
        import numpy as np

        rng = np.random.default_rng(seed)
        super().__init__(
            rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8),
            rng.integers(0, 10, size=size).tolist(),
            transform,
        )


class LearnableCIFAR10(ImageSet):
    """CIFAR-shaped uint8 images from a fixed seed that a model can learn: each class has its own RGB tint
    (10 of the 27 colours whose channels are 64, 128 or 192), and every pixel channel adds uniform noise.
    A run on it shows whether a change still lets the model learn: the loss falls towards zero when it
    does. Labels random, as in SyntheticCIFAR10; the tint follows the label."""

    def __init__(
        self,
        transform: Callable[[Image.Image], torch.Tensor],
        size: int = SYNTHETIC_SIZE,
        seed: int = SYNTHETIC_SEED,
        images_seed: int | None = None,
    ):
        import itertools

        import numpy as np

        rng = np.random.default_rng(seed)
        levels = (LEARNABLE_NOISE, 128, 256 - LEARNABLE_NOISE)  # tint plus noise stays within 0..255
        colours = np.array(list(itertools.product(levels, repeat=3)), dtype=np.uint8)
        tints = colours[rng.permutation(len(colours))[:10]]
        if images_seed is not None:  # a held-out set: the same tints (what the model learns), other images
            rng = np.random.default_rng(images_seed)
        targets = rng.integers(0, 10, size=size)
        # uint8 all the way (no float copy of 150 MB): noise in [0, 128) as whole random bytes halved (faster
        # than drawing from a range that is not a power of two), then tint - 64 added.
        images = rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8)
        images >>= 1
        images += (tints - LEARNABLE_NOISE)[targets][:, None, None, :]
        super().__init__(images, targets.tolist(), transform)
        self.tints = tints.tolist()


TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCHES = ("test_batch",)  # the test split, 10,000 images, in the same archive


def read_cifar10(folder: str, names: tuple[str, ...] = TRAIN_BATCHES) -> tuple[np.ndarray, list[int]]:
    """Batches of CIFAR-10's Python format (cifar-10-batches-py; the training ones by default), as
    (N, 32, 32, 3) uint8 and labels."""
    import pickle

    import numpy as np

    data, targets = [], []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="latin1")
            images = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            labels = [int(t) for t in batch["labels"]]
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"{folder} is not a readable CIFAR-10 folder ({name}: {type(e).__name__}: {e}); "
                "remove it to download it again, or run with --data synthetic"
            ) from e
        if len(labels) != len(images) or not all(0 <= t < 10 for t in labels):
            raise UserError(
                f"{folder} is not a readable CIFAR-10 folder ({name}: {len(images)} images, "
                f"{len(labels)} labels); remove it to download it again, or run with --data synthetic"
            )
        data.append(images.transpose(0, 2, 3, 1))
        targets += labels
    return np.concatenate(data), targets


def first_missing(path: str) -> str | None:
    """The outermost folder of path that does not exist yet (everything under it is made later), or None."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        path, missing = os.path.dirname(path), path
    return missing


def download_cifar10(data_dir: str) -> None:
    """torchvision's download (archive checksum included); whatever it created is removed if it fails:
    the folders it made for a missing data_dir, or the new entries of an existing one."""
    from torchvision.datasets import CIFAR10

    made = first_missing(data_dir)
    before = set(os.listdir(data_dir)) if made is None else set()
    try:
        CIFAR10(root=data_dir, train=True, download=True)
    except (OSError, RuntimeError, ValueError) as e:  # URLError is an OSError
        import shutil

        if made is not None:
            if os.path.isdir(made):
                shutil.rmtree(made)
        else:
            for name in set(os.listdir(data_dir)) - before:
                path = os.path.join(data_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        raise UserError(
            f"CIFAR-10 is not in {data_dir} and could not be downloaded ({type(e).__name__}: {e}); "
            "give --data-dir a folder that holds cifar-10-batches-py, allow the download, "
            "or run with --data synthetic"
        ) from e


def window_note(crossed: int, loader: DataLoader | None) -> str | None:
    """What an epoch boundary inside the timed window did to the rate (None when the window crossed none)."""
    if not crossed:
        return None
    said = f"the timed window crossed {crossed} epoch boundar{'y' if crossed == 1 else 'ies'}"
    if loader is not None and loader.num_workers and not loader.persistent_workers:
        return (
            f"{said}: each one shut the {loader.num_workers} DataLoader workers down and started new ones "
            "inside the window, so the rate includes their start-up (lower --bench-steps or add "
            "--persistent-workers)"
        )
    return f"{said} (a new shuffle inside the window)"


class Batches:
    """An endless iterator over the loader that restarts cleanly at each epoch end; waited_s adds up the
    time the loop spent asking it for batches (profile mode reads it per step); timeline keeps each batch's
    times (loader_timeline.Timeline)."""

    def __init__(self, loader: DataLoader):
        if len(loader) == 0:
            raise UserError(
                f"the data set holds fewer images than one batch ({len(loader.dataset)} < "
                f"{loader.batch_size}): lower --batch-size"
            )
        self.loader = loader
        self.epoch_restarts = 0
        self.waited_s = 0.0
        workers = loader.num_workers
        self.timeline = Timeline(workers, workers * (loader.prefetch_factor or 0) if workers else 0)
        self._it = iter(loader)

    def __iter__(self):
        return self

    def _next_or_shm_error(self):
        try:
            return next(self._it)
        except RuntimeError as e:
            raise shm_error(e) or e

    def worker_pids(self) -> list[int]:
        """The pids of the DataLoader's worker processes now running (none at --workers 0)."""
        return [w.pid for w in getattr(self._it, "_workers", [])]  # torch's multi-process iterator keeps them

    def __next__(self):
        # one clock times the wait (perf_counter); the wall clock only places it: received is asked plus the wait,
        # so a preemption between two clock reads on a busy machine cannot make the two disagree
        t0 = time.perf_counter_ns()
        asked = time.time_ns()
        try:
            item = next(self._it)
        except StopIteration:
            self.epoch_restarts += 1
            if hasattr(self.loader.sampler, "set_epoch"):  # DistributedSampler: a new shuffle per epoch
                self.loader.sampler.set_epoch(self.epoch_restarts)
            self._it = iter(self.loader)
            item = self._next_or_shm_error()
        except RuntimeError as e:
            raise shm_error(e) or e
        wait_ns = time.perf_counter_ns() - t0
        self.waited_s += wait_ns / 1e9
        # a TimedBatch (loader_timeline.timed_collate) gives back default_collate's batch; its times are kept
        return self.timeline.received(item, asked, wait_ns, self.epoch_restarts)


SHM_SIGNS = (  # PyTorch's words when a batch cannot pass through shared memory
    "unable to write to file </torch_",
    "unable to open shared memory",
    "unable to allocate shared memory",
    "out of shared memory",
    "killed by signal: Bus error",
)


def shm_error(e: BaseException, shm: str = "/dev/shm") -> UserError | None:
    """A DataLoader error that says /dev/shm is too small, as one line naming its size and the fix; else None."""
    text = str(e)
    if not any(sign in text for sign in SHM_SIGNS):
        return None
    try:
        st = os.statvfs(shm)
        total, used = st.f_blocks * st.f_frsize / 2**20, (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20
        size = f"{shm} holds {total:.0f} MB, {used:.0f} MB in use"
    except OSError:
        size = f"{shm} could not be read"
    said = next((line.strip() for line in text.splitlines() if any(sign in line for sign in SHM_SIGNS)), "")
    return UserError(
        f"the DataLoader workers could not pass a batch through shared memory ({said}; {size}): give the job a "
        "larger /dev/shm (polyaxonfile.yaml's plugins: shm: true; docker run --shm-size), or lower --workers "
        "or --batch-size"
    )


def loader_facts(loader: DataLoader, workers: int) -> dict[str, Any]:
    """What run.json says of the DataLoader: workers, pinning, batches per epoch, prefetching, start method."""
    import torch

    return {
        "kind": "DataLoader",
        "num_workers": workers,
        "pin_memory": loader.pin_memory,
        "shuffle": True,
        "drop_last": True,
        "batches_per_epoch": len(loader),
        "sampler": type(loader.sampler).__name__,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor if workers else None,
        "start_method": torch.multiprocessing.get_start_method(allow_none=True) if workers else None,
    }
