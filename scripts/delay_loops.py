"""Five training loops that are not train.py, each held by one delay, profiled with torch.profiler's defaults and
no labels, and each delay's truth measured without the profiler: the share of the step that removing it saves.

    taskset -c 0-3 python scripts/delay_loops.py --out DIR [--loops input,copy,launch,sync,gpu] [--rounds 3]

Needs a CUDA GPU. For each loop DIR gets LOOP.pt.trace.json.gz (steps 3-7 of a scheduled capture) and
truths.json: the loop's unprofiled ms per step and its counterpart's with the delay removed, in alternating
rounds, then their medians and the truth (1 - removed / loop; for the GPU-bound loop the share of the step its
kernels fill, the graphed step over the eager one). steplens summarize reads the traces; scripts/delay_table.py
sets the reading beside the truth.

The loops:
- input: a ResNet18 (CIFAR variant) fed by a DataLoader with no workers and a PIL transform chain;
  removed: the same batches already on the GPU.
- copy: a 1x1 convolution over 256 images of 3x224x224 float32 from pageable host memory, copied with .cuda();
  removed: the images already on the GPU.
- launch: a 24-layer MLP of width 64 at batch 32; removed: the same step replayed as a CUDA graph.
- sync: an MLP of few large layers whose loss is read with .item() each step, then host-side bookkeeping
  for 1.3 times the GPU's step;
  removed: the loss kept on the GPU (read once at the end).
- gpu: a ResNet18 (CIFAR variant) at batch 512 on data already on the GPU; truth: the graphed step's share of
  the eager step.
"""

import argparse
import json
import os
import statistics
import sys
import time

STEPS = 40  # timed steps per round
WARMUP = 10


def resnet18_cifar():
    import torch
    import torchvision

    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = torch.nn.Identity()
    return m


class PilImages:
    """CIFAR-shaped random images through the usual PIL transform chain (the CPU cost of a real input)."""

    def __init__(self, n=50_000):
        import numpy as np
        import torchvision.transforms as T

        self.n = n
        self.rng = np.random.default_rng(0)
        self.pixels = self.rng.integers(0, 256, size=(512, 32, 32, 3), dtype=np.uint8)
        self.tf = T.Compose(
            [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize((0.5,) * 3, (0.25,) * 3)]
        )

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image

        return self.tf(Image.fromarray(self.pixels[i % 512])), i % 10


def sgd(model):
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def loop_input():
    import torch

    model = resnet18_cifar().cuda()
    opt, loss_fn = sgd(model), torch.nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(PilImages(), batch_size=128, shuffle=True, num_workers=0, pin_memory=True)
    it = iter(loader)
    resident = [(x.cuda(), y.cuda()) for x, y in (next(it) for _ in range(4))]

    def train(x, y):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    def step():
        nonlocal it
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        train(x.cuda(non_blocking=True), y.cuda(non_blocking=True))

    k = [0]

    def removed():
        k[0] += 1
        train(*resident[k[0] % 4])

    return step, removed


def loop_copy():
    import torch

    conv = torch.nn.Conv2d(3, 8, 1).cuda()
    opt = sgd(conv)
    host = [torch.randn(256, 3, 224, 224) for _ in range(2)]  # pageable: 154 MB each
    dev = [h.cuda() for h in host]
    k = [0]

    def work(x):
        opt.zero_grad(set_to_none=True)
        conv(x).mean().backward()
        opt.step()

    def step():
        k[0] += 1
        work(host[k[0] % 2].cuda())

    def removed():
        k[0] += 1
        work(dev[k[0] % 2])

    return step, removed


def mlp(width, depth):
    import torch

    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda()


def loop_launch():
    import torch

    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")
    return eager_and_graphed(mlp(64, 24), torch.nn.MSELoss(), x, y)


def eager_and_graphed(model, loss_fn, x, y):
    """A training step on fixed data, and the same step captured as a CUDA graph: (step, the graph's replay)."""
    opt = sgd(model)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return step, capture(step).replay


def capture(step):
    """The step captured whole as a CUDA graph (PyTorch's whole-network recipe: warm up on a side stream)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g


def bookkeeping(ms):
    """Host-side work that needs no GPU (a stand-in for metrics, logging, a scheduler's Python): busy for ms."""
    end = time.perf_counter() + ms / 1e3
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def loop_sync():
    import torch

    model = mlp(4096, 4)  # few, large kernels: the host launches a step far faster than the GPU runs it
    opt = sgd(model)
    x, y = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    loss_fn = torch.nn.MSELoss()
    kept = []

    def train():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    # The host's own work after the sync: 1.3 times the GPU's step, so that the GPU idles for most of the step
    # and the sync, which keeps that work from overlapping the GPU's, is its largest avoidable delay.
    host_ms = 1.3 * timed(lambda: train().item())

    def step():
        kept.append(train().item())  # the sync: the host waits for the whole step before its bookkeeping
        bookkeeping(host_ms)

    def removed():
        kept.append(train().detach())  # kept on the GPU: read once, after the window
        bookkeeping(host_ms)

    return step, removed


def loop_gpu():
    import torch

    x, y = torch.randn(512, 3, 32, 32, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    return eager_and_graphed(resnet18_cifar().cuda(), torch.nn.CrossEntropyLoss(), x, y)


LOOPS = {"input": loop_input, "copy": loop_copy, "launch": loop_launch, "sync": loop_sync, "gpu": loop_gpu}


def timed(fn, steps=STEPS):
    """ms per step over a window synchronized at both ends (nothing syncs inside it but what the loop does)."""
    import torch

    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def profiled(fn, path):
    """Steps 3-7 of 8 under torch.profiler's defaults (CPU and CUDA activities, nothing else), to path."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    tmp = path + ".partial.json.gz"

    def save(p):
        p.export_chrome_trace(tmp)
        os.replace(tmp, path)

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=2, active=5, repeat=1),
        on_trace_ready=save,
    ) as prof:
        for _ in range(8):
            fn()
            prof.step()
    torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the folder for the traces and truths.json")
    p.add_argument(
        "--loops", default=",".join(LOOPS), help=f"which loops, comma-separated (default: {','.join(LOOPS)})"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds of the loop and its counterpart (default 3)"
    )
    args = p.parse_args(argv)
    names = args.loops.split(",")
    unknown = [n for n in names if n not in LOOPS]
    if unknown:
        p.error(f"unknown loop(s) {unknown}: choose from {list(LOOPS)}")
    import torch

    if not torch.cuda.is_available():
        print("delay_loops.py: error: these loops need a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    results = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": sorted(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "steps_per_round": STEPS,
        "loops": {},
    }
    for name in names:
        try:
            step, removed = LOOPS[name]()
            loop_ms, removed_ms = [], []
            for _ in range(args.rounds):  # alternating: loop, counterpart, loop, ...
                loop_ms.append(timed(step))
                removed_ms.append(timed(removed))
            profiled(step, os.path.join(args.out, f"{name}.pt.trace.json.gz"))
        except Exception as e:  # one loop's failure is reported and the others still run
            print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            results["loops"][name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        a, b = statistics.median(loop_ms), statistics.median(removed_ms)
        truth = b / a if name == "gpu" else 1 - b / a
        results["loops"][name] = {"loop_ms": loop_ms, "removed_ms": removed_ms, "truth": truth}
        print(f"{name}: loop {a:.3f} ms/step, removed {b:.3f} ms/step, truth {truth:.3f}", flush=True)
        del step, removed
        torch.cuda.empty_cache()
    tmp = os.path.join(args.out, "truths.json.partial")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, os.path.join(args.out, "truths.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
