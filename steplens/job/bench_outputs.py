"""What a bench run prints at its end and logs as Polyaxon outputs: the rate, its peak memory, GPU-bound share,
ceiling and loss."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from steplens.job import learning, loader_timeline, phases, rank_outputs

if TYPE_CHECKING:
    from steplens.job.runrecord import RunRecord

BENCH_OUTPUTS = (
    "samples_per_sec",
    "window_seconds",
    "window_steps",
    "epoch_restarts_in_window",
    "gpu_ms_per_step",
    "gpu_time_samples_per_sec",
    "loss_first",
    "loss_final",
    "loss_diverged_step",
    "gpu_bound_share",
    "flops_per_sample",
    "model_tflops_per_sec",
    "mfu",
    "peak_tflops",
    "peak_precision",
    "peak_allocated_mb",
    "peak_reserved_mb",
    "peak_memory_note",
)


def log_bench(record: RunRecord, results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The rate, the GPU-bound share (--cuda-graph) and the hardware ceiling on stdout; the same as Polyaxon outputs."""
    bound = ""
    if args.cuda_graph and results.get("gpu_bound_share") is not None:
        bound = (
            f"; the step's GPU time allows {results['gpu_time_samples_per_sec']:.1f} samples/s "
            f"({results['gpu_ms_per_step']:.3f} ms/step): GPU-bound share {results['gpu_bound_share']:.1%}"
        )
    elif args.cuda_graph:
        bound = f"; GPU-bound share n/a: {results['gpu_time']['note']}"
    print(
        f"bench: {results['samples_per_sec']:.1f} samples/s ({args.bench_steps} batches of "
        f"{args.batch_size} in {results['window_seconds']:.3f}s, device {record['environment']['gpu']}, "
        f"workers {args.workers}){bound}{rank_outputs.describe_bench(results)}"
    )
    print(memory_line(results))
    c = results["ceiling"]
    mfu = (
        f"MFU {c['mfu']:.1%} of the {c['peak_precision']} dense peak, {c['peak_tflops']:g} TFLOP/s"
        if c["mfu"] is not None
        else f"MFU n/a: {c['note']}"
    )
    tflops = "n/a" if c["model_tflops_per_sec"] is None else f"{c['model_tflops_per_sec']:.2f}"
    print(
        f"bench: {results['flops_per_sample'] / 1e9:.3f} GFLOP per training sample (model FLOPs) -> "
        f"{tflops} TFLOP/s {'per GPU' if record['device'].startswith('cuda') else 'on the CPU'}; {mfu}"
    )
    print(learning.log_losses(record, results))
    said = results.get("input") or {}
    if said.get("verdict") or said.get("note"):
        cpu = (said.get("cpu") or {}).get("cpu_sentence")
        print(f"bench: input: {said.get('verdict') or said['note']}{f'; {cpu}' if cpu else ''}")
    for line in phases.bench_lines(results):  # --profile-phase validation or checkpoint: its own window
        print(line)
    outputs = {k: results[k] for k in (*BENCH_OUTPUTS, *rank_outputs.BENCH_OUTPUTS) if results.get(k) is not None}
    return {**outputs, **loader_timeline.outputs(results.get("input")), **phases.outputs(results)}


def memory_line(results: dict[str, Any]) -> str:
    """The window's peak GPU memory beside its rate, or why there is none."""
    if results.get("peak_allocated_mb") is None:
        return f"bench: peak memory n/a: {results.get('peak_memory_note') or 'not recorded'}"
    return (
        f"bench: the window peaked at {results['peak_allocated_mb']:.1f} MB allocated, "
        f"{results['peak_reserved_mb']:.1f} MB reserved by the caching allocator (MB = 10^6 bytes)"
    )
