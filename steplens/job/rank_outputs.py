"""A DDP run's own outputs across its ranks: the global bench rate, the rank evidence and its picture."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from typing import TYPE_CHECKING, Any

from steplens.atomic import write_atomic, write_json_atomic
from steplens.evidence import picture
from steplens.evidence.formatting import run_label
from steplens.project.ranks import RanksError, across, format_text, headline, rank_figures

if TYPE_CHECKING:
    from steplens.job.distributed import World
    from steplens.job.runrecord import RunRecord

BENCH_OUTPUTS = ("world_size", "rank_samples_per_sec", "longest_window_rank", "rank_rate_spread")


def bench_results(world: World, results: dict[str, Any]) -> dict[str, Any]:
    """The global rate: world_size x window samples / the longest window of any rank; each rank's own beside it.
    world: a distributed.World; in a world of one, results as they are."""
    if not world.active:
        return results
    mine = {
        "rank": world.rank,
        "samples_per_sec": results["samples_per_sec"],
        "window_seconds": results["window_seconds"],
        "window_samples": results["window_samples"],
        "peak_allocated_mb": results.get("peak_allocated_mb"),  # each rank's own GPU
        "host": platform.node(),
        "device": str(world.device),
    }
    every = world.all_gather(mine)
    # In DDP every rank waits for the slowest at each allreduce: the windows end up nearly equal,
    # and the longest one (often not the straggler's) sets the job's rate. The traces name the straggler.
    slowest = max(every, key=lambda r: r["window_seconds"])
    rates = [r["samples_per_sec"] for r in every]
    total = sum(r["window_samples"] for r in every)
    return {
        **results,
        "samples_per_sec": total / slowest["window_seconds"],
        "rank_samples_per_sec": results["samples_per_sec"],
        "world_size": world.world_size,
        "global_window_samples": total,
        "global_window_seconds": slowest["window_seconds"],
        "longest_window_rank": slowest["rank"],
        "rank_rate_spread": (max(rates) - min(rates)) / statistics.median(rates),
        "rank_window_spread_seconds": slowest["window_seconds"] - min(r["window_seconds"] for r in every),
        "ranks": every,
    }


def describe_bench(results: dict[str, Any]) -> str:
    """The bench line's DDP part: how the global rate was made; empty in a world of one."""
    if "ranks" not in results:
        return ""
    own = ", ".join(f"{r['samples_per_sec']:.1f}" for r in results["ranks"])
    return (
        f"; {results['world_size']} ranks: global rate over the longest window "
        f"({results['global_window_seconds']:.3f}s, rank {results['longest_window_rank']}); "
        f"the ranks' own rates {own} samples/s"
    )


def profile_evidence(world: World, record: RunRecord, results: dict[str, Any]) -> dict[str, Any]:
    """Each rank's per-step figures, gathered on rank 0, which writes and logs the evidence across ranks."""
    if not world.active:
        return {}
    every = world.all_gather(rank_figures([c["trace"] for c in results["cycles"]], rank=world.rank))
    if not world.is_leader:
        return {}
    try:
        result = across(every)
    except RanksError as e:  # a world of one, say: the traces stand, the comparison is absent
        results["across_ranks"] = {"error": str(e)}
        print(f"ranks: no evidence across ranks ({e})", file=sys.stderr)
        return {}
    base = os.path.join(record.out_dir, "traces", "ranks")
    record.log_file(write_json_atomic(base + ".evidence.json", result), "evidence-ranks")
    record.log_file(write_atomic(base + ".evidence.txt", format_text(result)), "evidence-ranks-table")
    results["across_ranks"] = top = headline(result)
    print(f"ranks: {top['verdict']}", file=sys.stderr)
    top["pictures"] = draw_ranks(every, record, top["verdict"])
    return {k: v for k, v in top.items() if v is not None and k not in ("verdict", "pictures")}


def draw_ranks(every: list[dict[str, Any]], record: RunRecord, said: str) -> list[str]:
    """One picture per cycle with every rank's steps, a lane pair per step (picture.py), saved and logged by rank 0;
    the pictures' paths (none, and one line saying why, without matplotlib)."""
    by_rank = sorted((f for f in every if not f.get("left_out")), key=lambda f: f["rank"])  # left out: no rows
    paths = []
    for k in range(min(len(f["drawn"]) for f in by_rank)):
        cycle = [f["drawn"][k] for f in by_rank]
        path = os.path.join(record.out_dir, "traces", f"picture-ranks-cycle{k + 1}.png")
        try:
            picture.draw_groups(
                [(f"rank {f['rank']} ", c["rows"]) for f, c in zip(by_rank, cycle)],
                path,
                f"{run_label(record['settings'])}: cycle {k + 1}, every rank",
                said,
                all(c["has_gpu"] for c in cycle),
                any(c["gpu_slots"] for c in cycle),
            )
        except picture.NoPicture as e:
            print(f"ranks: {e}", file=sys.stderr)
            return []
        record.log_image(path, f"steps-ranks-cycle{k + 1}")
        paths.append(path)
    return paths
