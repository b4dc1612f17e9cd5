"""scripts/reevidence.py: stored profile runs read again with this checkout's evidence code."""

import glob
import json
import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reevidence  # noqa: E402

REPROFILE = os.path.join(ROOT, "results", "h200-reprofile")


def test_reading_a_run_again_with_the_same_code_gives_its_recorded_evidence(profile_run, tmp_path):
    """A CPU profile run of this checkout: its evidence derived again equals what run.json recorded, and
    the run's own files are left as they were."""
    before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(profile_run["outputs"], "**"), recursive=True)}
    again = reevidence.reread(profile_run["outputs"], str(tmp_path / "again"))
    with open(os.path.join(profile_run["outputs"], "run.json")) as f:
        recorded = json.load(f)["results"]["evidence"]
    live = recorded.pop("input")  # the DataLoader's figures come from the live run's timeline, not from its traces
    assert live["batches"]["rows"] and "input" not in again["evidence"]
    assert again["evidence"] == recorded
    assert {p: os.path.getmtime(p) for p in before} == before
    assert os.path.exists(tmp_path / "again" / "evidence.json")
    assert all(os.path.islink(p) for p in glob.glob(str(tmp_path / "again" / "traces" / "*.pt.trace.json.gz")))


def test_a_stored_h200_graph_run_reads_its_distortion_against_the_steady_unprofiled_steps(tmp_path):
    """The fp32 graph run of the H200 re-profile: the unprofiled pace leaves out the first step (which
    started on an empty GPU queue), the GPU work per step stays within the bench's event-timed GPU time,
    and no DataLoader means nothing refilled."""
    outputs = glob.glob(os.path.join(REPROFILE, "graph", "runs", "b91a1616*", "outputs"))[0]
    r = reevidence.reread(outputs, str(tmp_path / "b91a1616"))
    with open(os.path.join(outputs, "run.json")) as f:
        each = json.load(f)["results"]["unprofiled"]["step_ms_each"]
    e = r["evidence"]
    assert e["unprofiled_step_ms"] == pytest.approx(sum(each[1:]) / len(each[1:]))
    assert e["profiler_distortion"] == pytest.approx(e["profiled_step_ms"] / e["unprofiled_step_ms"])
    assert e["gpu_work_ms_per_step"] <= 7.031 and e["idle_basis"] == "gpu_timeline"
    assert all(c["refilled_by"] == [] for c in r["cycles"]) and e["headline_cycles"] == [1, 2]


def test_the_command_prints_a_row_per_profile_run_and_refuses_a_folder_without_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert reevidence.main([os.path.join(REPROFILE, "graph"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line[:8] in {"b91a1616", "aee51209"}]
    assert len(rows) == 2, text  # the two bench runs are not profile runs
    assert sorted(os.listdir(out)) == sorted(
        os.path.basename(os.path.dirname(os.path.dirname(p)))
        for p in glob.glob(os.path.join(REPROFILE, "graph", "runs", "*", "outputs", "traces"))
    )
    assert reevidence.main([str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err.startswith("reevidence.py: error: ")


def test_the_capture_read_back_carries_every_timing_the_run_recorded():
    """Step times and waits for input go back into the evidence as they were measured (a run with
    DataLoader workers: its queue depth is workers x prefetch_factor)."""
    run = {
        "results": {
            "profile_detail": "lean",
            "unprofiled": {"steps": 10, "step_ms": 9.0},
            "pauses_s": [0.1] * 10,
            "steps_s": [0.02] * 10,
            "inputs_s": [0.005] * 10,
        },
        "loader": {"kind": "DataLoader", "num_workers": 2, "prefetch_factor": 2},
    }
    cap = reevidence.capture_of(run)
    assert cap["steps_s"] == [0.02] * 10 and cap["inputs_s"] == [0.005] * 10
    assert cap["queue_depth"] == 4 and cap["workers"] == 2 and cap["detail"] == "lean" and not cap["device_input"]
