"""Profile a slow PyTorch training run, then measure a change without the profiler.

A CIFAR-10 ResNet18 variant (3x3 stride-1 first conv, no max-pool, 10 classes,
batch 128, SGD) whose training step labels four profiler scopes:
input/next_batch, input/to_device, train/forward_backward, train/optimizer.

    # on a Polyaxon cluster (see polyaxonfile.yaml and the README)
    polyaxon run -f polyaxonfile.yaml -u -p PROJECT --queue AGENT/QUEUE -P mode=profile -P workers=0
    polyaxon run -f polyaxonfile.yaml -u -p PROJECT --queue AGENT/QUEUE -P mode=bench -P workers=4

    # on one machine, GPU when present (tracked offline under ./.polyaxon-offline)
    python train.py --mode profile --workers 0
    python train.py --mode bench --workers 4
    # no network: a CIFAR-shaped synthetic set through the same PIL transforms
    python train.py --mode bench --workers 4 --data synthetic
    # the candidate fixes (README): e.g. the whole step as CUDA graphs, bf16, NHWC, fused kernels
    python train.py --mode bench --gpu-input --cuda-graph --compile default --cudnn-benchmark \
        --channels-last --amp bf16 --fused-sgd
    # CPU only, tiny
    python train.py --mode profile --device cpu --data synthetic --batch-size 8 --warmup-steps 2

mode=profile: warm-up steps, then torch.profiler with schedule(wait=1, warmup=1,
active=3, repeat=2) over 10 steps: two Chrome traces (open them in
ui.perfetto.dev), operator tables, trace evidence (summarize.py), run.json.
mode=bench: the same warm-up, then a synchronized window of --bench-steps
batches without the profiler: samples_per_sec.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from contextlib import nullcontext
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))

# The four scopes of the tutorial, defined once; summarize.py reads the same names.
NEXT_BATCH = "input/next_batch"
TO_DEVICE = "input/to_device"
FORWARD_BACKWARD = "train/forward_backward"
OPTIMIZER = "train/optimizer"
SCOPES = (NEXT_BATCH, TO_DEVICE, FORWARD_BACKWARD, OPTIMIZER)

# The tutorial's capture: two cycles of three active steps.
SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=2)
PROFILE_STEPS = (SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]) * SCHEDULE["repeat"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
SYNTHETIC_SIZE = 50_000
SYNTHETIC_SEED = 0  # the synthetic images are the same in every run, whatever --seed says

DEFAULT_OFFLINE_ROOT = os.path.join(HERE, ".polyaxon-offline")
PROJECT = "pytorch-training-profiler"


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


# --------------------------------------------------------------------------- settings

class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        # One line, exit 2, before any heavy import: argparse's usage block hides the message.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text):
    value = float(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text):
    value = float(text)
    if not value >= 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


# argparse reports a failed type by its __name__: give the checkers readable names.
non_negative_int.__name__ = "integer >= 0"
positive_int.__name__ = "integer >= 1"
positive_float.__name__ = "positive number"
non_negative_float.__name__ = "number >= 0"


def build_parser():
    p = OneLineParser(prog="train.py", description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=["profile", "bench"],
                   help="profile: scheduled profiler capture; bench: synchronized throughput window (required)")
    p.add_argument("--workers", type=non_negative_int, default=0,
                   help="DataLoader num_workers; 0 loads in the main process (default: 0)")
    p.add_argument("--batch-size", type=positive_int, default=128, help="images per step (default: 128)")
    p.add_argument("--warmup-steps", type=non_negative_int, default=20,
                   help="plain training steps before the profiler or the timed window (default: 20)")
    p.add_argument("--bench-steps", type=positive_int, default=100,
                   help="batches in the timed window of mode=bench (default: 100)")
    p.add_argument("--data", choices=["cifar10", "synthetic"], default="cifar10",
                   help="cifar10: the real training set, downloaded into --data-dir when missing; "
                        "synthetic: 50,000 CIFAR-shaped uint8 images (fixed seed) through the same "
                        "transforms, for machines without network (default: cifar10)")
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"),
                   help="where CIFAR-10 is (or is downloaded to) (default: ./data)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: CUDA when available, else CPU, said loudly; cuda: fail without it (default: auto)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="model, shuffle and augmentation seed (default: 0)")
    p.add_argument("--lr", type=positive_float, default=0.1, help="SGD learning rate (default: 0.1)")
    p.add_argument("--momentum", type=non_negative_float, default=0.9, help="SGD momentum (default: 0.9)")
    p.add_argument("--weight-decay", type=non_negative_float, default=5e-4, help="SGD weight decay (default: 5e-4)")
    p.add_argument("--trace-format", choices=["json.gz", "json"], default="json.gz",
                   help="Chrome trace files: gzipped (about ten times smaller; Perfetto opens both) "
                        "or plain (default: json.gz)")
    p.add_argument("--output-dir", default=None,
                   help="where artifacts are written (default: the Polyaxon run's outputs folder)")
    # Candidate fixes (issue: the next fixes); defaults keep the tutorial's workload exactly.
    p.add_argument("--persistent-workers", action="store_true",
                   help="keep DataLoader workers alive across epochs (needs --workers > 0) (default: off)")
    p.add_argument("--prefetch-factor", type=positive_int, default=None,
                   help="batches each worker loads ahead (needs --workers > 0) (default: torch's, 2)")
    p.add_argument("--prefetch-stream", action="store_true",
                   help="copy the next batch to the GPU on a side CUDA stream while this step computes "
                        "(needs CUDA; not with --gpu-input) (default: off)")
    p.add_argument("--gpu-input", action="store_true",
                   help="keep the uint8 training set on the device and crop/flip/normalize batches there, "
                        "no DataLoader (needs --workers 0) (default: off)")
    p.add_argument("--channels-last", action="store_true", help="NHWC model and inputs (default: off)")
    p.add_argument("--amp", choices=["off", "bf16"], default="off",
                   help="autocast forward and loss to bfloat16 (default: off)")
    p.add_argument("--fused-sgd", action="store_true", help="torch's fused SGD kernel (default: off)")
    p.add_argument("--compile", choices=["off", "default", "reduce-overhead", "max-autotune",
                                         "max-autotune-no-cudagraphs"], default="off",
                   help="torch.compile the model with this mode; reduce-overhead and max-autotune replay CUDA "
                        "graphs of their own; max-autotune* time kernel choices while compiling (minutes). "
                        "Compilation happens in the warm-up, which must then be >= 3 steps (default: off)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture each scope's GPU work (batch assembly, layout, forward+backward, optimizer) once "
                        "as CUDA graphs at the end of the warm-up and replay them every step; bench mode then "
                        "also measures the GPU time per step (needs CUDA, --gpu-input, --warmup-steps >= 3; "
                        "combine with --compile default for fused kernels) (default: off)")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="let cuDNN time its convolution algorithms during the warm-up (default: off)")
    p.add_argument("--repeat", type=non_negative_int, default=None,
                   help="index of this job in an alternating series; only recorded and tagged (default: none)")
    return p


def parse_settings(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.momentum >= 1:
        parser.error(f"argument --momentum: must be < 1, got {args.momentum}")
    if args.workers == 0 and (args.persistent_workers or args.prefetch_factor is not None):
        parser.error("--persistent-workers and --prefetch-factor need --workers > 0 (they configure worker processes)")
    if args.gpu_input and args.workers:
        parser.error(f"--gpu-input builds batches on the device without a DataLoader: use --workers 0, not {args.workers}")
    if args.compile != "off" and args.warmup_steps < 3:
        parser.error(f"--compile {args.compile} compiles (and captures) during the warm-up: give --warmup-steps >= 3, "
                     f"not {args.warmup_steps}, so none of it lands in the measured steps")
    if args.gpu_input and args.prefetch_stream:
        parser.error("--prefetch-stream has nothing to copy with --gpu-input (the data is already on the device)")
    if args.cuda_graph:
        if not args.gpu_input:
            parser.error("--cuda-graph captures the batch assembly too, which only --gpu-input does on the device: "
                         "add --gpu-input")
        if args.compile in ("reduce-overhead", "max-autotune"):
            parser.error(f"--cuda-graph with --compile {args.compile}: that mode captures CUDA graphs of its own, "
                         "which cannot nest in the step's graphs; use --compile default")
        if args.warmup_steps < 3:
            parser.error(f"--cuda-graph warms up eagerly, captures and replays during the warm-up: give "
                         f"--warmup-steps >= 3, not {args.warmup_steps}")
    return args


def check_device_options(args, device):
    """Options that only make sense on CUDA, refused once the device is known."""
    if args.prefetch_stream and device.type != "cuda":
        raise UserError("--prefetch-stream overlaps host-to-device copies with compute: it needs a CUDA device")
    if args.cuda_graph and device.type != "cuda":
        raise UserError("--cuda-graph captures CUDA graphs: it needs a CUDA device")
    import torch
    if args.cuda_graph and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        raise UserError(f"--cuda-graph replays the augmentation's own seeded generator, which needs "
                        f"CUDAGraph.register_generator_state (torch >= 2.5); this is torch {torch.__version__}")


# --------------------------------------------------------------------------- machine facts

def cpu_budget(cgroup_root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup"):
    """The CPUs this process may really use: the cgroup CPU quota where one is set, else affinity.

    A pod's quota is invisible to os.cpu_count() and sched_getaffinity(): a 4-CPU pod on a
    64-core node must read 4, or torch starts 64 threads that fight over 4 CPUs.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        affinity = os.cpu_count() or 1
    quota, source = None, "affinity"
    own = ""
    try:
        with open(proc_cgroup) as f:
            for line in f:
                parts = line.strip().split(":", 2)
                if len(parts) == 3 and parts[0] == "0":
                    own = parts[2].lstrip("/")
    except OSError:
        pass
    v2_candidates = [os.path.join(cgroup_root, own, "cpu.max"), os.path.join(cgroup_root, "cpu.max")]
    for path in dict.fromkeys(v2_candidates):
        try:
            with open(path) as f:
                limit, period = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        if limit != "max":
            quota, source = int(limit) / int(period), f"cgroup v2 {path}"
        break
    else:
        for d in (os.path.join(cgroup_root, "cpu"), os.path.join(cgroup_root, "cpu,cpuacct"), cgroup_root):
            try:
                with open(os.path.join(d, "cpu.cfs_quota_us")) as f:
                    limit = int(f.read())
                with open(os.path.join(d, "cpu.cfs_period_us")) as f:
                    period = int(f.read())
            except (OSError, ValueError):
                continue
            if limit > 0:
                quota, source = limit / period, f"cgroup v1 {d}"
            break
    cpus = min(quota, affinity) if quota is not None else affinity
    if quota is not None and affinity < quota:
        source = "affinity (below the cgroup quota)"
    return {"cpus": cpus, "source": source, "cgroup_quota_cpus": quota, "affinity_cpus": affinity}


def package_inventory():
    from importlib import metadata
    names = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            names[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(names[k] for k in sorted(names)) + "\n"


def source_sha256():
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def environment(torch, device):
    import torchvision
    try:
        from importlib import metadata
        polyaxon_version = metadata.version("polyaxon")
    except Exception:  # not installed: recorded as such, never fatal here
        polyaxon_version = None
    cuda = device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "polyaxon": polyaxon_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "source_sha256": source_sha256(),
    }


# --------------------------------------------------------------------------- files

def write_atomic(path, data):
    """Write bytes or text to path through a temp file and a rename: never a half-written file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{os.path.basename(path)}")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def write_json_atomic(path, obj):
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# --------------------------------------------------------------------------- tracking

def is_managed():
    return bool(os.environ.get("POLYAXON_RUN_INSTANCE")) or \
        os.environ.get("POLYAXON_IS_MANAGED", "").lower() in ("1", "true", "yes")


def managed_identity():
    """owner, project and run uuid from POLYAXON_RUN_INSTANCE (owner.project.runs.uuid), passed explicitly
    so that no client cache on the machine can point tracking at another run."""
    parts = os.environ.get("POLYAXON_RUN_INSTANCE", "").split(".")
    if len(parts) == 4 and parts[2] == "runs":
        return {"owner": parts[0], "project": parts[1], "run_uuid": parts[3]}
    return {}


def start_tracking(args):
    """Polyaxon tracking: the managed run inside Polyaxon, an offline run everywhere else."""
    managed = is_managed()
    if not managed:
        # Read by polyaxon at import time: set it first.
        os.environ.setdefault("POLYAXON_OFFLINE_ROOT", DEFAULT_OFFLINE_ROOT)
    try:
        from polyaxon import tracking
    except ImportError as e:
        raise UserError(f"polyaxon is not installed ({e}): pip install -r requirements.txt") from e
    if managed:
        tracking.init(**managed_identity())
    else:
        tags = [args.mode, f"workers={args.workers}"]
        if args.repeat is not None:
            tags.append(f"repeat={args.repeat}")
        tracking.init(is_offline=True, project=PROJECT, name=f"{args.mode}-workers{args.workers}",
                      tags=tags, track_code=False, track_env=False, collect_resources=False)
    return tracking


# --------------------------------------------------------------------------- data

def build_transform():
    from torchvision import transforms
    return transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD),
    ])


class SyntheticCIFAR10:
    """CIFAR-shaped uint8 images and labels, fed through the same PIL path as torchvision's CIFAR10."""

    def __init__(self, transform, size=SYNTHETIC_SIZE, seed=SYNTHETIC_SEED):
        import numpy as np
        rng = np.random.default_rng(seed)
        self.data = rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8)
        self.targets = rng.integers(0, 10, size=size).tolist()
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        from PIL import Image
        return self.transform(Image.fromarray(self.data[index])), self.targets[index]


def build_dataset(args, transform):
    """The training set and a record of what it really is."""
    if args.data == "synthetic":
        print(f"data: SYNTHETIC CIFAR-shaped images ({SYNTHETIC_SIZE} x 32x32x3 uint8, seed "
              f"{SYNTHETIC_SEED}), same transforms as CIFAR-10; not the real data set", file=sys.stderr)
        dataset = SyntheticCIFAR10(transform)
        return dataset, {"name": "synthetic", "images": len(dataset), "seed": SYNTHETIC_SEED}
    from torchvision.datasets import CIFAR10
    try:
        dataset = CIFAR10(root=args.data_dir, train=True, download=True, transform=transform)
    except (OSError, RuntimeError, ValueError) as e:  # URLError is an OSError
        raise UserError(
            f"CIFAR-10 is not in {args.data_dir} and could not be downloaded ({type(e).__name__}: {e}); "
            "give --data-dir a folder that holds cifar-10-batches-py, allow the download, "
            "or run with --data synthetic") from e
    print(f"data: CIFAR-10 training set from {args.data_dir} ({len(dataset)} images)", file=sys.stderr)
    return dataset, {"name": "cifar10", "images": len(dataset), "root": os.path.abspath(args.data_dir)}


def build_loader(torch, dataset, args, device):
    generator = torch.Generator()
    generator.manual_seed(args.seed)
    knobs = {}
    if args.workers:
        knobs["persistent_workers"] = args.persistent_workers
        if args.prefetch_factor is not None:
            knobs["prefetch_factor"] = args.prefetch_factor
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        pin_memory=device.type == "cuda", drop_last=True, generator=generator, **knobs)


class Batches:
    """An endless iterator over the loader that restarts cleanly at each epoch end."""

    def __init__(self, loader):
        if len(loader) == 0:
            raise UserError(f"the data set holds fewer images than one batch ({len(loader.dataset)} < "
                            f"{loader.batch_size}): lower --batch-size")
        self.loader = loader
        self.epoch_restarts = 0
        self._it = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            self.epoch_restarts += 1
            self._it = iter(self.loader)
            return next(self._it)


class DeviceBatches:
    """--gpu-input: the uint8 set on the device; crop (zero padding 4), flip and normalize per batch there.

    Draws what the PIL chain draws: crop offsets uniform over 9x9, flip with probability 1/2, the
    same padding value (0 before normalization) and the same normalization; shuffled epochs.
    Two ways to the same batches: next() slices the epoch's order at a host position;
    assemble_at_cursor() reads the position from a device counter, so that --cuda-graph can capture it.
    """

    def __init__(self, torch, dataset, batch_size, device, seed):
        self.torch, self.batch_size, self.device = torch, batch_size, device
        data = torch.as_tensor(dataset.data)  # (N, 32, 32, 3) uint8, as torchvision's CIFAR10 holds it
        if len(data) < batch_size:
            raise UserError(f"the data set holds fewer images than one batch ({len(data)} < {batch_size}): "
                            "lower --batch-size")
        self.data = data.permute(0, 3, 1, 2).contiguous().to(device)
        self.targets = torch.as_tensor(dataset.targets, dtype=torch.long).to(device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
        self.order = torch.empty(len(self.data), dtype=torch.long, device=device)
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)  # position, for captured assembly
        self.offsets = torch.arange(batch_size, device=device)
        self.epoch_restarts = -1
        self._new_epoch()

    def _new_epoch(self):
        # In place: a captured graph holds the address of self.order.
        self.order.copy_(self.torch.randperm(len(self.data), device=self.device, generator=self.generator))
        self.position = 0
        self.epoch_restarts += 1

    def __iter__(self):
        return self

    def __next__(self):
        self.advance()
        index = self.order[self.position - self.batch_size:self.position]
        return self._batch(index)

    def advance(self):
        """Host side of a step: start a new epoch when this one cannot fill a batch (drop_last)."""
        if self.position + self.batch_size > len(self.order):
            self._new_epoch()
            self.cursor.zero_()
        self.position += self.batch_size

    def sync_cursor(self):
        """Point the device counter at the host position (before a capture)."""
        self.cursor.fill_(self.position)

    def assemble_at_cursor(self):
        """The batch at the device counter, which it then advances: no host value in it, so capturable.

        The caller runs advance() on the host before each replay, which keeps epochs turning over.
        """
        index = self.order.index_select(0, self.cursor + self.offsets)
        self.cursor.add_(self.batch_size)
        return self._batch(index)

    def _batch(self, index):
        images, _, _ = augment(self.torch, self.data.index_select(0, index), self.generator, self.mean, self.std)
        return images, self.targets.index_select(0, index)


def augment(torch, images_uint8, generator, mean, std, padding=4):
    """Batched RandomCrop(32, padding) + RandomHorizontalFlip + ToTensor + Normalize; returns the draws too."""
    n, _, h, w = images_uint8.shape
    device = images_uint8.device
    x = torch.nn.functional.pad(images_uint8.float().div_(255), (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    rows = (dy[:, None] + torch.arange(h, device=device))[:, None, :, None]
    cols = torch.arange(w, device=device).expand(n, w)
    cols = torch.where(flip[:, None], cols.flip(1), cols) + dx[:, None]
    x = x[torch.arange(n, device=device)[:, None, None, None], torch.arange(3, device=device)[None, :, None, None],
          rows, cols[:, None, None, :]]
    return (x - mean) / std, (dy, dx), flip


class PrefetchToDevice:
    """--prefetch-stream: the copy of batch k+1 runs on a side stream while batch k computes."""

    def __init__(self, torch, device, first_batch):
        self.torch, self.device = torch, device
        self.stream = torch.cuda.Stream(device=device)
        self.pending = self._copy(first_batch)

    def _copy(self, batch):
        with self.torch.cuda.stream(self.stream):
            return [t.to(self.device, non_blocking=True) for t in batch]

    def swap(self, next_host_batch):
        """Hand out the batch already copied; start copying next_host_batch behind it."""
        current = self.torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)  # the handed-out copy is complete before compute reads it
        ready = self.pending
        for t in ready:
            t.record_stream(current)  # the allocator must not reuse them while this stream uses them
        self.pending = self._copy(next_host_batch)
        return ready


# --------------------------------------------------------------------------- model and step

def build_model(torch):
    import torchvision
    model = torchvision.models.resnet18(num_classes=10)
    # CIFAR variant: 32x32 inputs keep their resolution through the stem.
    model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


def precision(torch, device, args):
    """The memory format and the autocast context of the step, settled once."""
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    if args.amp != "bf16":
        return memory_format, nullcontext
    # A captured graph must not keep autocast's cache of cast weights (torch.cuda.graph's docs).
    return memory_format, lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                                 cache_enabled=not args.cuda_graph)


def make_step(torch, batches, model, criterion, optimizer, device, args, prefetcher=None):
    from torch.profiler import record_function

    memory_format, autocast = precision(torch, device, args)

    def step():
        # No synchronization here: CUDA work runs on after its launching scope ends.
        with record_function(NEXT_BATCH):
            images, targets = next(batches)
        with record_function(TO_DEVICE):
            if prefetcher is not None:
                images, targets = prefetcher.swap((images, targets))
            else:
                images = images.to(device, non_blocking=True)
                targets = targets.to(device, non_blocking=True)
            if args.channels_last:
                images = images.contiguous(memory_format=memory_format)
        with record_function(FORWARD_BACKWARD):
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = criterion(model(images), targets)
            loss.backward()
        with record_function(OPTIMIZER):
            optimizer.step()
        return loss

    return step


def capture_step(torch, batches, model, criterion, optimizer, device, args):
    """--cuda-graph: each scope's GPU work captured once, then the step replays the graphs.

    One graph per scope, so the four scopes stay in the trace, each around its replay; the graphs
    share one memory pool and replay in capture order. Static buffers: the batch, the loss, the
    gradients and the optimizer state keep their addresses from one replay to the next. The
    augmentation's generator is registered with the batch graph, so every replay draws new numbers.
    What a replay hides from the trace: the per-operator CPU launches (one cudaGraphLaunch per
    scope instead) and the epoch turnover, which stays on the host, outside the graphs.
    """
    from torch.profiler import record_function

    memory_format, autocast = precision(torch, device, args)
    pool = torch.cuda.graph_pool_handle()
    graphs = {}

    def capture(scope, work, generators=()):
        graph = torch.cuda.CUDAGraph()
        for generator in generators:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph, pool=pool):
            result = work()
        graphs[scope] = graph
        return result

    t0 = time.perf_counter()
    batches.sync_cursor()
    images, targets = capture(NEXT_BATCH, batches.assemble_at_cursor, [batches.generator])
    if args.channels_last:  # the only device work of input/to_device when the batch is born on the device
        images = capture(TO_DEVICE, lambda: images.contiguous(memory_format=memory_format))
    # Gradients set to None before the capture are allocated inside it: every replay writes them anew.
    optimizer.zero_grad(set_to_none=True)

    def forward_backward():
        with autocast():
            loss = criterion(model(images), targets)
        loss.backward()
        return loss

    loss = capture(FORWARD_BACKWARD, forward_backward)
    capture(OPTIMIZER, optimizer.step)
    capture_seconds = time.perf_counter() - t0

    def replay_all():
        batches.advance()
        for graph in graphs.values():
            graph.replay()

    def step():
        with record_function(NEXT_BATCH):
            batches.advance()
            graphs[NEXT_BATCH].replay()
        with record_function(TO_DEVICE):
            if TO_DEVICE in graphs:
                graphs[TO_DEVICE].replay()
        with record_function(FORWARD_BACKWARD):
            graphs[FORWARD_BACKWARD].replay()
        with record_function(OPTIMIZER):
            graphs[OPTIMIZER].replay()
        return loss

    step.replay_all = replay_all
    step.capture = {"seconds": round(capture_seconds, 3), "graphs": list(graphs)}
    return step


def gpu_time_per_step(torch, replay_all, steps=50, head_start_cycles=200_000_000):
    """The graphs' own GPU time per step, with the host out of the way: the kernel-time limit.

    A GPU-side sleep holds the stream while the host queues every replay; the events then time
    back-to-back replays. If the sleep ended before the host had queued them all, the GPU may have
    waited for the host, and the result says so.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(head_start_cycles)  # about 0.1 s at 2 GHz; far longer than queueing the replays
    start.record()
    for _ in range(steps):
        replay_all()
    end.record()
    queued_in_time = not start.query()  # the GPU had not reached the first replay when the last was queued
    end.synchronize()
    ms = start.elapsed_time(end) / steps
    return {"gpu_ms_per_step": ms, "replayed_steps": steps, "queued_before_gpu_started": queued_in_time}


def synchronize(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(torch, step, device, args, capture):
    """Warm-up steps: worker start, cuDNN selection, compilation and capture stay out of what is measured.

    With --cuda-graph the steps before the last run eagerly on a side stream (as torch.cuda.graph's
    docs ask before a capture), then the step is captured and the last warm-up step is its first
    replay. Returns the warm-up time, the per-step times where compiling or capturing makes them
    worth a sync per step (else None), and the step to measure.
    """
    timed = args.compile != "off" or args.cuda_graph
    eager_steps = args.warmup_steps - 1 if args.cuda_graph else args.warmup_steps
    side = torch.cuda.Stream(device=device) if args.cuda_graph else None
    step_seconds = []
    t0 = time.perf_counter()

    def lap():
        if timed:  # a sync per step is harmless here: nothing is measured yet
            synchronize(torch, device)
            step_seconds.append(round(time.perf_counter() - t0 - sum(step_seconds), 4))

    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side) if side is not None else nullcontext():
        for _ in range(eager_steps):
            step()
            lap()
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)
        step = capture()
        step()
        lap()
    synchronize(torch, device)
    return time.perf_counter() - t0, (step_seconds or None), step


# --------------------------------------------------------------------------- the two modes

def run_profile(torch, step, device, out_dir, args):
    """Ten steps under the tutorial's schedule; one trace and two operator tables per cycle."""
    from torch.profiler import ProfilerActivity, profile, schedule
    import summarize

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if not cuda:
        print("profile: no CUDA device, profiling the CPU alone: the traces have no GPU tracks",
              file=sys.stderr)
    cycles = []

    def save_trace(prof):
        # Called at step_num 5 and 10; the cycle's active steps are the three before.
        n = len(cycles) + 1
        first, last = prof.step_num - SCHEDULE["active"], prof.step_num - 1
        stem = f"trace-cycle{n}-steps{first}-{last}"
        t0 = time.perf_counter()
        trace = os.path.join(out_dir, "traces", f"{stem}.pt.trace.{args.trace_format}")
        os.makedirs(os.path.dirname(trace), exist_ok=True)
        tmp = os.path.join(os.path.dirname(trace), f".partial-{os.path.basename(trace)}")
        prof.export_chrome_trace(tmp)  # gzips when the name ends in .gz
        os.replace(tmp, trace)
        averages = prof.key_averages()
        tables = {"self_cpu": write_atomic(
            os.path.join(out_dir, "operators", f"cycle{n}-by-self-cpu.txt"),
            averages.table(sort_by="self_cpu_time_total", row_limit=-1))}
        if cuda:
            tables["self_device"] = write_atomic(
                os.path.join(out_dir, "operators", f"cycle{n}-by-self-device.txt"),
                averages.table(sort_by="self_device_time_total", row_limit=-1))
        seconds = time.perf_counter() - t0
        print(f"profile: cycle {n} (ProfilerStep#{first}-{last}) -> {trace} in {seconds:.1f}s", file=sys.stderr)
        cycles.append({"cycle": n, "profiler_steps": [first, last], "trace": trace,
                       "trace_bytes": os.path.getsize(trace), "operator_tables": tables,
                       "dump_seconds": round(seconds, 3)})

    with profile(activities=activities, schedule=schedule(**SCHEDULE), on_trace_ready=save_trace,
                 record_shapes=True, profile_memory=True, with_stack=True) as profiler:
        for _ in range(PROFILE_STEPS):
            step()
            profiler.step()

    # Trace evidence after the profiler has closed, so reading traces costs no profiled step.
    evidences = []
    for c in cycles:
        evidence = summarize.summarize_file(c["trace"])
        base = c["trace"].rsplit(".pt.trace.", 1)[0]
        c["evidence_json"] = write_json_atomic(base + ".evidence.json", evidence)
        c["evidence_txt"] = write_atomic(base + ".evidence.txt", summarize.format_table([evidence]))
        c["evidence"] = summarize.headline(evidence)
        evidences.append(evidence)
    return {
        "evidence": summarize.headline(evidences),
        "activities": [a.name for a in activities],
        "gpu_tracks": cuda,
        "note": None if cuda else "CPU-only profile: no CUDA device, so no GPU tracks and no device-time table",
        "schedule": SCHEDULE,
        "options": {"record_shapes": True, "profile_memory": True, "with_stack": True},
        "cycles": cycles,
        "profiling_caveat": summarize.CAVEAT,
    }


def run_bench(torch, step, device, batches, args):
    """--bench-steps batches between two synchronizations, nothing syncing in between."""
    synchronize(torch, device)
    restarts_before = batches.epoch_restarts
    t0 = time.perf_counter()
    for _ in range(args.bench_steps):
        loss = step()
    synchronize(torch, device)
    seconds = time.perf_counter() - t0
    results = {
        "samples_per_sec": args.bench_steps * args.batch_size / seconds,
        "window_seconds": seconds,
        "window_steps": args.bench_steps,
        "window_samples": args.bench_steps * args.batch_size,
        "epoch_restarts_in_window": batches.epoch_restarts - restarts_before,
        "loss_after_window": float(loss.item()),
    }
    if args.cuda_graph:
        # After the window, never in it: these replays train on, but are timed by events alone.
        limit = gpu_time_per_step(torch, step.replay_all)
        limit["gpu_limit_samples_per_sec"] = args.batch_size / (limit["gpu_ms_per_step"] / 1000)
        limit["share_of_gpu_limit"] = results["samples_per_sec"] / limit["gpu_limit_samples_per_sec"]
        results["kernel_time_limit"] = limit
        results.update({k: limit[k] for k in ("gpu_ms_per_step", "gpu_limit_samples_per_sec", "share_of_gpu_limit")})
    return results


# --------------------------------------------------------------------------- main

def resolve_device(torch, requested):
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if requested == "cuda":
        raise UserError("--device cuda was asked for but torch sees no CUDA device "
                        f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use --device cpu or auto")
    print("device: NO CUDA DEVICE, running on the CPU: these are CPU numbers, not GPU numbers",
          file=sys.stderr)
    return torch.device("cpu")


def set_threads(torch, budget):
    """Keep torch's intra-op threads within the CPU budget (its default follows the node's cores)."""
    before = torch.get_num_threads()
    allowed = max(1, int(budget["cpus"]))
    if before > allowed:
        torch.set_num_threads(allowed)
    return {"default": before, "used": torch.get_num_threads()}


def main(argv=None):
    args = parse_settings(argv)
    settings = dict(vars(args))

    import numpy as np
    import torch

    try:
        device = resolve_device(torch, args.device)
        check_device_options(args, device)
    except UserError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2

    tracking = start_tracking(args)
    out_dir = os.path.abspath(args.output_dir or tracking.get_outputs_path())
    os.makedirs(out_dir, exist_ok=True)
    print(f"outputs: {out_dir}", file=sys.stderr)
    record = {
        "status": "running", "mode": args.mode, "settings": settings,
        "started_at": datetime.now(timezone.utc).isoformat(),
        "polyaxon": {"managed": is_managed(), "run_uuid": tracking.TRACKING_RUN.run_uuid,
                     "offline_root": None if is_managed() else os.environ.get("POLYAXON_OFFLINE_ROOT")},
    }
    run_json = os.path.join(out_dir, "run.json")
    logged = []

    def log_file(path, name):
        tracking.log_file_ref(path=path, name=name)
        logged.append(path)

    try:
        record["cpu_budget"] = budget = cpu_budget()
        record["torch_threads"] = set_threads(torch, budget)
        record["environment"] = environment(torch, device)
        record["device"] = str(device)
        log_file(write_atomic(os.path.join(out_dir, "packages.txt"), package_inventory()), "packages")
        tracking.log_inputs(**{k: v for k, v in settings.items() if v is not None})

        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        transform = build_transform()
        record["input_transform"] = repr(transform)
        dataset, record["data"] = build_dataset(args, transform)
        if args.gpu_input:
            record["input_transform"] = (f"on the device, batched (train.augment): RandomCrop(32, padding=4, fill=0), "
                                         f"RandomHorizontalFlip(p=0.5), /255, Normalize({CIFAR10_MEAN}, {CIFAR10_STD})")
            batches = DeviceBatches(torch, dataset, args.batch_size, device, args.seed)
            record["loader"] = {"kind": "device", "note": "batches assembled and augmented on the device, no DataLoader",
                                "batches_per_epoch": len(dataset) // args.batch_size}
        else:
            loader = build_loader(torch, dataset, args, device)
            record["loader"] = {"kind": "DataLoader", "num_workers": args.workers, "pin_memory": loader.pin_memory,
                                "shuffle": True, "drop_last": True, "batches_per_epoch": len(loader),
                                "persistent_workers": loader.persistent_workers,
                                "prefetch_factor": loader.prefetch_factor if args.workers else None,
                                "start_method": (torch.multiprocessing.get_start_method(allow_none=True)
                                                 if args.workers else None)}
            batches = Batches(loader)
        prefetcher = PrefetchToDevice(torch, device, next(batches)) if args.prefetch_stream else None

        memory_format, _ = precision(torch, device, args)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark  # timed in the warm-up's first steps
        model = build_model(torch).to(device, memory_format=memory_format)
        if args.compile != "off":
            model = torch.compile(model, mode=args.compile)  # compiled lazily, at the first warm-up step
        criterion = torch.nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    weight_decay=args.weight_decay, **({"fused": True} if args.fused_sgd else {}))
        step = make_step(torch, batches, model, criterion, optimizer, device, args, prefetcher)
        record["warmup_seconds"], record["warmup_step_seconds"], step = warm_up(
            torch, step, device, args, lambda: capture_step(torch, batches, model, criterion, optimizer, device, args))
        if args.cuda_graph:
            record["cuda_graph"] = step.capture

        if args.mode == "profile":
            record["results"] = results = run_profile(torch, step, device, out_dir, args)
            for c in results["cycles"]:
                log_file(c["trace"], f"trace-cycle{c['cycle']}")
                for kind, path in c["operator_tables"].items():
                    log_file(path, f"operators-cycle{c['cycle']}-{kind.replace('_', '-')}")
                log_file(c["evidence_json"], f"evidence-cycle{c['cycle']}")
                log_file(c["evidence_txt"], f"evidence-cycle{c['cycle']}-table")
            outputs = {k: v for k, v in results["evidence"].items() if v is not None}
            outputs.update({f"cycle{c['cycle']}_{k}": v for c in results["cycles"]
                            for k, v in c["evidence"].items() if v is not None})
        else:
            record["results"] = results = run_bench(torch, step, device, batches, args)
            outputs = {k: results[k] for k in ("samples_per_sec", "window_seconds", "window_steps",
                                               "gpu_ms_per_step", "gpu_limit_samples_per_sec", "share_of_gpu_limit")
                       if k in results}
            limit = (f"; GPU limit {results['gpu_limit_samples_per_sec']:.1f} samples/s "
                     f"({results['gpu_ms_per_step']:.3f} ms/step), {results['share_of_gpu_limit']:.1%} of it"
                     if args.cuda_graph else "")
            print(f"bench: {results['samples_per_sec']:.1f} samples/s ({args.bench_steps} batches of "
                  f"{args.batch_size} in {results['window_seconds']:.3f}s, device {record['environment']['gpu']}, "
                  f"workers {args.workers}){limit}")
        record["epoch_restarts"] = batches.epoch_restarts
        record["status"] = "succeeded"
    except (Exception, KeyboardInterrupt) as e:
        record["status"] = "failed"
        record["error"] = f"{type(e).__name__}: {e}"
        if not isinstance(e, UserError):
            record["traceback"] = traceback.format_exc()
        record["finished_at"] = datetime.now(timezone.utc).isoformat()
        log_file(write_json_atomic(run_json, record), "run.json")
        tracking.log_failed(reason=type(e).__name__, message=str(e)[:2000])
        tracking.end()
        if isinstance(e, UserError):
            print(f"train.py: error: {e}", file=sys.stderr)
            return 1
        raise

    record["finished_at"] = datetime.now(timezone.utc).isoformat()
    record["artifacts"] = [os.path.relpath(p, out_dir) for p in logged] + ["run.json"]
    log_file(write_json_atomic(run_json, record), "run.json")
    tracking.log_outputs(**outputs)
    tracking.end()
    print(f"run.json: {run_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
