"""steplens compare and distributed runs: world sizes are never pooled, and the per-rank spread is shown."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from steplens.project import compare, comparison, runs


def rec(uuid, minute, rate, world_size=None, spread=None, **settings):
    base = {"mode": "bench", "workers": 4, "batch_size": 128, "data": "synthetic", "seed": 0, "repeat": minute}
    base.update(settings)
    outputs = {"samples_per_sec": rate}
    run_json = {
        "settings": base,
        "environment": {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"},
        "cpu_budget": {"cpus": 4},
    }
    if world_size is not None:
        run_json["distributed"] = {"world_size": world_size, "local_world_size": world_size}
        outputs.update(world_size=world_size, rank_rate_spread=spread)
    return runs.record_from(
        uuid, f"bench-{uuid}", f"2026-12-03T10:{minute:02d}:00", "succeeded", base, outputs, run_json
    )


def test_runs_of_different_world_sizes_are_never_pooled():
    """Same settings, one process vs 2 and 4 ranks: three groups, named by world size; runs from before
    DDP (no distributed facts in run.json) count as one process."""
    records = [
        rec("old", 0, 10_000.0),
        rec("one", 1, 11_000.0, world_size=1, spread=0.0),
        rec("two0", 2, 20_000.0, world_size=2, spread=0.02, ddp=True),
        rec("two1", 3, 21_000.0, world_size=2, spread=0.04, ddp=True),
        rec("four", 4, 39_000.0, world_size=4, spread=0.10, ddp=True),
    ]
    result = comparison.compare_records(records)
    assert "world_size" in result["varying"]
    sizes = {g["group"]: (g["n"], g["key"]) for g in result["tables"][0]["groups"]}
    by_size = {dict(key)["world_size"]: n for n, key in sizes.values()}
    assert by_size == {1: 2, 2: 2, 4: 1}
    two = next(g for g in result["tables"][0]["groups"] if dict(g["key"])["world_size"] == 2)
    assert two["rank_spread"] == {"world_size": 2, "median": 0.03, "max": 0.04}
    text = compare.markdown(result)
    assert "Distributed runs" in text and "| 2 | 20.50k | 3.0% | 4.0% |" in text


def test_grouping_sees_nproc_per_node():
    """4 ranks as 4 x 1 or 2 x 2 processes per machine are different groups."""
    a = rec("a", 1, 40_000.0, world_size=4, spread=0.01, ddp=True)
    b = rec("b", 2, 38_000.0, world_size=4, spread=0.01, ddp=True)
    b["settings"]["nproc_per_node"] = 2
    result = comparison.compare_records([a, b])
    assert result["varying"] == ["nproc_per_node"] and len(result["tables"][0]["groups"]) == 2


def test_compare_splits_a_real_ddp_bench_run_from_a_single_process_one(tmp_path, ddp_bench, bench_run):
    """The DDP bench run (2 ranks) beside a one-process bench run: two groups, the DDP one with its spread."""
    root = tmp_path / "study"
    os.makedirs(root / "runs")
    for run in (ddp_bench, bench_run):  # copies: the shared runs stay as they were made
        shutil.copytree(os.path.join(run["root"], "runs", run["uuid"]), root / "runs" / run["uuid"])
    out = subprocess.run(
        [sys.executable, "-m", "steplens", "compare", "--offline", str(root), "--out", str(tmp_path / "cmp")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "cmp" / "comparison.json") as f:
        result = json.load(f)
    assert len(result["tables"][0]["groups"]) == 2 and all(g["n"] == 1 for g in result["tables"][0]["groups"])
    ddp = next(g for g in result["tables"][0]["groups"] if "world_size=2" in g["group"])
    with open(os.path.join(ddp_bench["outputs"], "run.json")) as f:
        a, b = (r["samples_per_sec"] for r in json.load(f)["results"]["ranks"])
    # (max - min) / median of the two ranks' own rates, worked out here from run.json
    assert ddp["rank_spread"]["world_size"] == 2 and a != b
    assert ddp["rank_spread"]["median"] == pytest.approx(abs(a - b) / ((a + b) / 2))
    assert "Distributed runs" in out.stdout
