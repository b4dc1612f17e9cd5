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
    python train.py --mode bench --workers 4 --data synthetic  # no network: a CIFAR-shaped set, same transforms
    # the learning check: each class its own tint, so the loss must fall (loss_first -> loss_final)
    python train.py --mode bench --workers 4 --data learnable --batch-size 512 --scale-lr --lr-warmup-steps 10
    # the candidate fixes (steplens/speedups/): e.g. the whole step as CUDA graphs, bf16, NHWC, fused kernels
    python train.py --mode bench --gpu-input --cuda-graph --compile default --cudnn-benchmark \
        --channels-last --amp bf16 --fused-sgd
    python train.py --mode bench --workers 4 --memory-snapshot  # the allocator's history: steplens snapshot FILE
    python train.py --mode profile --device cpu --data synthetic --batch-size 16 --warmup-steps 2  # CPU, tiny
    python train.py --mode profile --profile-phase validation --workers 4  # or checkpoint: not the training steps
    # DDP, one process per GPU (steplens/job/distributed.py); on the CPU through gloo with --device cpu
    torchrun --nproc-per-node 2 train.py --ddp --mode profile --workers 4
    steplens ranks OUTPUTS/traces           # the evidence across ranks: the slow rank and its stage

mode=profile: warm-up, then torch.profiler with schedule(wait=1, warmup=1, active=3, repeat=2) over 10 steps,
--unprofiled-steps (10) steps timed without it on each side: two Chrome traces (ui.perfetto.dev), operator
tables, evidence, run.json.
mode=bench: the same warm-up, then a synchronized window of --bench-steps batches without the profiler.
"""

import random
import sys
import time
import traceback

from steplens import scopes
from steplens.errors import UserError
from steplens.evidence import attribution, cycle_evidence, flops
from steplens.job import bench_outputs, capture, checks, distributed, learning, machine, phases, rank_outputs, runrecord
from steplens.job.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    Batches,
    build_dataset,
    build_transform,
    loader_facts,
    window_note,
)
from steplens.job.device import WindowPeak, resolve_device, synchronize
from steplens.job.loader_timeline import after_window, into_traces, timed_collate, window_start
from steplens.job.memory_snapshot import SnapshotPhase
from steplens.job.settings import parse_settings
from steplens.job.stopping import Stopper, StopRequested
from steplens.scopes import FORWARD_BACKWARD, NEXT_BATCH, OPTIMIZER, PROFILE_STEPS, SCHEDULE, TO_DEVICE
from steplens.speedups import options

# torch is imported inside the functions that use it: main() parses the flags first, so a bad flag is
# refused in one line before torch (seconds to load) is imported.


# --------------------------------------------------------------------------- data and loader


def build_loader(dataset, args, device, world, shuffle=True):
    """The tutorial's DataLoader: --workers processes run the PIL transforms; pinned memory on CUDA."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(args.seed + world.rank)  # DataLoader workers' augmentation seeds differ per rank
    sampler = world.sampler(dataset, args.seed)  # DDP: each rank its slice of the epoch's shuffle
    knobs = {}
    if args.workers:
        knobs["persistent_workers"] = args.persistent_workers
        if args.prefetch_factor is not None:
            knobs["prefetch_factor"] = args.prefetch_factor
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=shuffle and sampler is None,
        sampler=sampler,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        generator=generator,
        collate_fn=timed_collate,  # default_collate's batch, with when and where it was made (loader_timeline)
        **knobs,
    )


def build_batches(args, device, world):
    """The batches the step draws, and what run.json says about them: a DataLoader, or (--gpu-input) the device."""

    transform = build_transform()
    with world.local_leader_first():  # one download per machine
        dataset, data = build_dataset(args, transform)
    facts = {"data": data, "input_transform": repr(transform)}
    if args.gpu_input:
        from steplens.speedups.gpu_input import DeviceBatches

        batches = DeviceBatches(
            world.shard(dataset), args.batch_size, device, args.seed + world.rank, CIFAR10_MEAN, CIFAR10_STD
        )
        return batches, {**facts, **batches.facts(CIFAR10_MEAN, CIFAR10_STD)}
    loader = build_loader(dataset, args, device, world)
    facts["loader"] = loader_facts(loader, args.workers)
    return Batches(loader), facts


# --------------------------------------------------------------------------- model


def build_model():
    import torch
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    # CIFAR variant: 32x32 inputs keep their resolution through the stem.
    model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


# --------------------------------------------------------------------------- the step


def make_step(batches, model, criterion, optimizer, to_device, autocast):
    """The tutorial's step: the four scopes, each around its part.

    The options never add a branch here; build_step hands in parts they change: batches (--gpu-input:
    DeviceBatches on the device, no DataLoader; --slow-rank: a sleep inside next_batch), to_device
    (--prefetch-stream: a swap with the side stream's copy; --channels-last: NHWC inputs), the model
    (--channels-last, --compile, --cudnn-benchmark's algorithm choice; --ddp: DDP's wrapper, its allreduce
    inside loss.backward()), autocast (--amp bf16) and the optimizer (--fused-sgd). --cuda-graph wraps
    the whole step (speedups.cuda_graph.CapturedStep): its replays run inside the same four scopes.
    """
    from torch.profiler import record_function

    def step():
        # No synchronization here: CUDA work runs on after its launching scope ends.
        with record_function(NEXT_BATCH):
            images, targets = next(batches)
        with record_function(TO_DEVICE):
            images, targets = to_device(images, targets)
        with record_function(FORWARD_BACKWARD):
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = criterion(model(images), targets)
            loss.backward()  # with --ddp, DDP's gradient allreduce runs in here, inside this scope
        with record_function(OPTIMIZER):
            optimizer.step()
        return loss

    return step


def build_step(batches, device, args, world, lr):
    """Model, loss, SGD at lr (learning.learning_rate): the step the mode runs (or its replay), model and optimizer."""
    import torch

    memory_format, autocast = options.precision(device, args)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark  # timed in the warm-up's first steps
    model = build_model().to(device, memory_format=memory_format)
    if args.compile != "off":
        options.tune_inductor(args)  # --inductor-tuning's torch._inductor settings, before compiling
        model = torch.compile(model, mode=args.compile)  # compiled lazily, at the first warm-up step
    # DDP wraps the compiled module (torch's advice: compile the inner module, not the wrapper).
    model = world.wrap(model)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        **({"fused": True} if args.fused_sgd else {}),
    )
    prefetcher = None
    if args.prefetch_stream:
        from steplens.speedups.prefetch import PrefetchToDevice

        prefetcher = PrefetchToDevice(device, next(batches))
    step = make_step(
        world.slowed(batches, args),
        model,
        criterion,
        optimizer,
        options.to_device_fn(device, args, prefetcher),
        autocast,
    )
    step = learning.ramped(step, optimizer, lr, args.lr_warmup_steps)  # --lr-warmup-steps; else step itself
    if not args.cuda_graph:
        return step, (model, optimizer)
    from steplens.speedups.cuda_graph import CapturedStep

    captured = (model, criterion, optimizer, memory_format, autocast, args.channels_last)
    return CapturedStep(device, step, batches, *captured), (model, optimizer)


# --------------------------------------------------------------------------- warm-up


def warm_up(step, device, args, stop):
    """Warm-up steps: worker start, cuDNN selection, compilation and capture stay out of what is measured.

    Returns the warm-up time and each warm-up step's time. On CUDA, an event recorded after each step
    times it on the device's clock, with no synchronization inside the warm-up (the pipeline the
    window starts from is the one the tutorial runs); on the CPU, the host clock. A CapturedStep warms
    up eagerly, captures, and replays once.
    """
    laps = capture.Laps(device.type == "cuda")  # on the current stream: CapturedStep's eager steps run on a side stream

    def step_done():
        laps.lap()
        stop.step_done()

    t0 = time.perf_counter()
    laps.lap()
    with stop.steps("warm-up"):
        print(f"warm-up: {args.warmup_steps} steps", file=sys.stderr)
        if args.cuda_graph:
            step.warm_up(args.warmup_steps, step_done)
        else:
            for _ in range(args.warmup_steps):
                step()
                step_done()
    synchronize(device)
    return time.perf_counter() - t0, [round(v, 5) for v in laps.seconds()]


# --------------------------------------------------------------------------- mode=profile


def run_profile(step, device, out_dir, args, loader, stop, world, batches):
    """Ten steps under the tutorial's schedule, between two blocks of unprofiled steps (the profiler's cost):
    one trace and two operator tables per cycle, every pause between steps timed, then the evidence."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if not cuda:
        print("profile: no CUDA device, profiling the CPU alone: the traces have no GPU tracks", file=sys.stderr)
    # one trace per cycle, under traces/rank{R}/ in DDP
    save_trace = capture.TraceWriter(out_dir, args.trace_format, cuda, world.trace_subdir, skip=lambda: stop.requested)
    account = capture.queue_account(loader, args)  # the workers' queue, the options the verdict names
    sync, laps = (lambda: synchronize(device)), (lambda: capture.Laps(cuda))
    with capture.bracketed(step, args.unprofiled_steps, sync, stop, laps, settle=account["queue_depth"]) as timing:
        pauses = capture.loop_pauses(timing.pop("since"), batches, save_trace)  # and the CPU and memory per cycle
        with (
            stop.steps("profile"),
            profile(
                activities=activities,
                schedule=schedule(**SCHEDULE),
                on_trace_ready=save_trace,
                **scopes.DETAIL[args.profile_detail],
            ) as profiler,
        ):
            for _ in range(PROFILE_STEPS):
                pauses.before_step()
                step()
                pauses.after_step()
                profiler.step()  # writes a cycle's trace at its end
                stop.step_done()
    # Trace evidence after the profiler has closed, so reading traces costs no profiled step.
    timing.update(pauses.account(save_trace.cycles))  # each cycle's CPU use and host memory, read at its edges
    timing["input"] = into_traces(save_trace.cycles, batches)  # a track per DataLoader worker; their figures
    evidence = cycle_evidence.write_evidence(save_trace.cycles, {**timing, **account})
    results = {
        "evidence": evidence,
        **timing,
        "activities": [a.name for a in activities],
        "gpu_tracks": cuda,
        "note": None if cuda else "CPU-only profile: no CUDA device, so no GPU tracks and no device-time table",
        "schedule": SCHEDULE,
        "profile_detail": args.profile_detail,
        "options": scopes.DETAIL[args.profile_detail],
        "cycles": save_trace.cycles,
        "profiling_caveat": attribution.CAVEAT,
    }
    capture.stop_keeping(stop, results)  # a stop in the last unprofiled block: recorded with these results
    return results


# --------------------------------------------------------------------------- mode=bench


def run_bench(step, device, batches, args, stop, world):
    """--bench-steps batches between two synchronizations, nothing syncing in between (each step's loss is
    copied on the device and read after the window); in DDP the ranks start together and the longest rank
    window sets the global rate."""
    losses, peak = learning.LossCurve(device, args.bench_steps), WindowPeak(device)  # peak: syncs, zeroes counters
    world.barrier()
    restarts_before = batches.epoch_restarts
    with stop.steps("bench"):
        print(f"bench: timing {args.bench_steps} steps", file=sys.stderr)
        start, t0 = window_start(batches), time.perf_counter()  # the clock and the CPU counters (cpu_use)
        for _ in range(args.bench_steps):
            losses.add(step())
            stop.step_done()  # a flag test: no sync
        synchronize(device)
    seconds, wall1 = time.perf_counter() - t0, time.time_ns()
    results = {
        "samples_per_sec": args.bench_steps * args.batch_size / seconds,
        "window_seconds": seconds,
        "window_steps": args.bench_steps,
        "window_samples": args.bench_steps * args.batch_size,
        "epoch_restarts_in_window": batches.epoch_restarts - restarts_before,
        **learning.summary(losses.values()),
        **peak.read(),  # the window's peak GPU memory, read after its clock stopped
        "input": after_window(batches, start, wall1),  # the DataLoader's figures and CPU use, read after the window
    }
    results["window_note"] = window_note(results["epoch_restarts_in_window"], getattr(batches, "loader", None))
    if results["window_note"]:
        print(f"bench: warning: {results['window_note']}", file=sys.stderr)
    if args.cuda_graph:  # after the window, never in it: these replays train on, timed by events alone
        results["gpu_time"] = gpu = step.gpu_bound(results["samples_per_sec"], args.batch_size)
        results.update({k: gpu.get(k) for k in ("gpu_ms_per_step", "gpu_time_samples_per_sec", "gpu_bound_share")})
    return rank_outputs.bench_results(world, results)


# --------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_settings(argv)  # exits 2 in one line on a bad flag, before torch is imported
    stop, world, record, made = Stopper(), None, None, []
    try:
        budget = machine.cpu_budget()
        workers_note = checks.check_workers(args, budget)
        made = checks.check_places(args)
        import numpy as np
        import torch

        device = resolve_device(args.device)
        options.check_device(args, device)
        snapshot = SnapshotPhase.start(args, device)  # --memory-snapshot: refused off CUDA; stacks kept from here
        world = distributed.World.start(args, device)  # --ddp: torchrun's process group; else a world of one
        device = world.device
        tags = [args.mode, f"workers={args.workers}"] + ([f"repeat={args.repeat}"] if args.repeat is not None else [])
        record = runrecord.start_record(
            world, dict(vars(args)), args.mode, args.output_dir, f"{args.mode}-workers{args.workers}", tags
        )
        print(f"outputs: {record.out_dir}", file=sys.stderr)
        runrecord.describe_run(record, world, device, budget, workers_note)

        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        batches, facts = build_batches(args, device, world)
        record.update(facts)
        record["learning_rate"] = rate = learning.learning_rate(args, world.world_size)
        record.log_outputs(effective_lr=rate["effective_lr"])
        if rate["ramp_note"]:
            print(f"train.py: warning: {rate['ramp_note']}", file=sys.stderr)
        step, parts = build_step(batches, device, args, world, rate["effective_lr"])
        world.seed_per_rank(np, random, args.seed)  # weights alike on every rank, augmentation not
        if args.mode == "bench":  # counted once, on shapes alone, before anything is timed
            record["flops"] = flops.training_flops(build_model)
            record.log_outputs(flops_per_sample=record["flops"]["flops_per_sample"])
        record["warmup_seconds"], record["warmup_step_seconds"] = warm_up(step, device, args, stop)
        record.log_steps("warmup_step_seconds", dict(enumerate(record["warmup_step_seconds"], start=1)))
        if args.cuda_graph:
            record["cuda_graph"] = step.info
        if snapshot:  # after the warm-up, before the mode's steps: none of them is recorded
            record["memory_snapshot"] = snapshot.run(step, device, record, stop, world)
        phase = phases.Phase(args, device, parts, record.out_dir, lambda d: build_loader(d, args, device, world, False))
        if args.mode == "profile":
            step, captured, loader = phase.for_capture(step, batches, facts.get("loader"), stop)  # train: as they are
            record["results"] = results = run_profile(step, device, record.out_dir, args, loader, stop, world, captured)
            outputs = runrecord.log_cycles(record, results)
            outputs.update(rank_outputs.profile_evidence(world, record, results))  # DDP: the slow rank and its stage
        else:
            record["results"] = results = run_bench(step, device, batches, args, stop, world)
            phase.bench(results, stop)  # after the window: the held-out window's rate, or timed saves
            per_sample, gpu = record["flops"]["flops_per_sample"], record["environment"]["gpu"]
            flops.add_ceiling(device, results, per_sample, gpu, args.amp, world.world_size)
            outputs = bench_outputs.log_bench(record, results, args)
        record["epoch_restarts"], record["phase"] = batches.epoch_restarts, phase.facts()
        runrecord.finish_record(world, record, outputs)  # DDP: rank 0 logs every rank's files, then ends the run
    except StopRequested as e:
        return runrecord.record_stop(record, e)
    except (Exception, KeyboardInterrupt) as e:
        if record is not None:
            record.failed(e, None if isinstance(e, UserError) else traceback.format_exc())
        if not isinstance(e, UserError):
            raise
        return checks.refused(e, record is None, made)
    finally:
        if world is not None:  # the process group ends on every way out, a failure or a stop included
            world.close()
    print(f"run.json: {record.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except StopRequested as e:  # a second signal while the first was being recorded: at once
        print(f"train.py: {e}; a second signal, exiting at once", file=sys.stderr)
        raise SystemExit(e.exit_code)
