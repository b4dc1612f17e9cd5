"""The profiler's distortion bracketed by unprofiled steps before and after the capture.

The rule: the 95% interval covers the ratio against either block, each give or take its own sampling
error; blocks further apart than their own spread make the distortion uncertain, naming both means.
"""

import glob
import json
import math
import os
import signal
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT, single_run
from test_profiling import SHORT, capture, two_cycles
from test_stopping import assert_stopped, signal_at

from steplens import stats
from steplens.evidence import cycle_evidence, distortion
from steplens.job import overview

PROFILED = [19.0, 20.0, 21.0, 20.5, 19.5]  # mean 20 ms
STEADY = [10.0, 10.2, 9.8, 10.1, 9.9]  # mean 10 ms
DRIFTED = [12.5, 12.3, 12.7, 12.4, 12.6]  # mean 12.5 ms: far beyond the blocks' spread of 0.16 ms


def block(each):
    return {"steps": len(each), "seconds": sum(each) / 1e3, "step_ms": statistics.fmean(each), "step_ms_each": each}


def own_interval(profiled, each):
    """The ratio's 95% interval against one block alone, on the log scale (it never reaches 0)."""
    ratio = statistics.fmean(profiled) / statistics.fmean(each)
    se, df = distortion.ratio_se(ratio, profiled, each)
    half = stats.t975(df) * se / ratio
    return ratio * math.exp(-half), ratio * math.exp(half)


def blocks_of(before, after):
    """The two blocks as (name, mean ms, per-step ms, steps timed), written out here."""
    return [
        ("before", statistics.fmean(before), list(before), len(before)),
        ("after", statistics.fmean(after), list(after), len(after)),
    ]


def interval(before, after):
    """The pooled mean of every step (the CPU does not run ahead) and the interval against the two blocks."""
    return statistics.fmean(before + after), distortion.distortion_interval(
        statistics.fmean(PROFILED), PROFILED, blocks_of(before, after)
    )


def test_pooled_pace_pools_both_blocks_steps_and_keeps_each_block():
    capture = {"unprofiled": block(STEADY), "unprofiled_after": block(DRIFTED)}
    mean, steady, blocks = distortion.pooled_pace(capture)
    assert mean == pytest.approx(11.25) and steady == STEADY + DRIFTED
    assert blocks == [("before", pytest.approx(10.0), STEADY, 5), ("after", pytest.approx(12.5), DRIFTED, 5)]


def test_agreeing_blocks_give_the_old_interval_and_no_doubt():
    """Two blocks alike: the interval is the one block's own, the drift 1, nothing uncertain."""
    mean, out = interval(STEADY, list(STEADY))
    assert mean == pytest.approx(10.0)
    assert (out["distortion_low"], out["distortion_high"]) == pytest.approx(own_interval(PROFILED, STEADY))
    assert out["unprofiled_drift"] == pytest.approx(1.0) and out["distortion_uncertain"] is None
    assert out["unprofiled_before_steps"] == out["unprofiled_after_steps"] == 5
    assert out["unprofiled_before_sd_ms"] == pytest.approx(statistics.stdev(STEADY))


def test_drift_widens_the_interval_to_cover_the_ratio_against_either_block():
    """Blocks 10 and 12.5 ms: the interval reaches from 1.6's own low end to 2.0's own high end."""
    mean, out = interval(STEADY, DRIFTED)
    low_after, _ = own_interval(PROFILED, DRIFTED)
    _, high_before = own_interval(PROFILED, STEADY)
    assert out["distortion_low"] == pytest.approx(low_after) and out["distortion_high"] == pytest.approx(high_before)
    assert out["unprofiled_drift"] == pytest.approx(1.25)
    ratio = statistics.fmean(PROFILED) / mean
    assert out["distortion_low"] < ratio < out["distortion_high"], "the pooled ratio lies inside the interval"
    alike = interval(STEADY, list(STEADY))[1]
    assert out["distortion_high"] - out["distortion_low"] > alike["distortion_high"] - alike["distortion_low"]


def test_blocks_that_disagree_make_the_distortion_uncertain_and_say_why():
    _, out = interval(STEADY, DRIFTED)
    why = out["distortion_uncertain"]
    assert why and "10.00 ms" in why and "12.50 ms" in why, why
    said = distortion.distortion_sentence(1.78, 0, False, se=0.05, df=8, interval=(1.5, 2.1), uncertain=why)
    assert "uncertain" in said and "10.00 ms" in said and "12.50 ms" in said and "1.50 and 2.10" in said
    assert "overstates" not in said, "an uncertain distortion asserts no effect"


def test_a_drift_that_barely_moves_the_ratio_is_no_doubt():
    """Graph replays: blocks of 2.474 and 2.485 ms, each almost constant, differ beyond their spread (Welch),
    but move a 1.05x slow-down by 0.005: no doubt about it."""
    profiled = [2.60, 2.601, 2.599, 2.600, 2.600]
    before, after = [2.474, 2.4741, 2.4739, 2.474, 2.474], [2.485, 2.4851, 2.4849, 2.485, 2.485]
    out = distortion.distortion_interval(statistics.fmean(profiled), profiled, blocks_of(before, after))
    assert out["distortion_uncertain"] is None
    assert 1.04 < out["distortion_low"] < out["distortion_high"] < 1.06


def test_the_interval_stays_above_zero_however_noisy_the_steps():
    noisy = [1.0, 30.0, 2.0, 25.0, 3.0]
    _, out = interval(noisy, noisy)
    assert 0 < out["distortion_low"] < out["distortion_high"]


def test_a_difference_within_the_blocks_spread_is_no_drift():
    noisy = [8.0, 12.0, 9.0, 11.0, 10.0]
    _, out = interval(noisy, [9.0, 12.5, 8.5, 11.5, 10.5])  # means 10.0 and 10.4, each spread about 1.6 ms
    assert out["distortion_uncertain"] is None and out["unprofiled_drift"] == pytest.approx(1.04)


def test_the_interval_decides_too_uncertain_as_the_standard_error_did():
    """Agreeing blocks: the interval reads the ratio as the old rule did, whichever way it falls."""
    t = stats.t975(4)
    for ratio, se, expect in ((1.3, 0.2, True), (1.69, 0.05, False)):
        old = distortion.distortion_sentence(ratio, 2, False, se=se, df=4)
        new = distortion.distortion_sentence(ratio, 2, False, se=se, df=4, interval=(ratio - t * se, ratio + t * se))
        assert ("too uncertain" in old) == ("too uncertain" in new) == expect, (old, new)


def test_the_verdict_caveat_reads_the_bracketed_interval():
    v = {"stage": "GPU compute", "part": "busy", "share": 0.9, "next": None, "sentence": "GPU compute holds it."}
    head = {
        "profiler_distortion": 1.3,
        "profiler_distortion_se": 0.01,
        "profiler_distortion_df": 30,
        "unprofiled_step_ms": 10.0,
        "distortion_low": 0.9,
        "distortion_high": 1.7,
    }
    assert cycle_evidence.profiler_caveat(v, [{"steps": 1, "gpu_busy_us": 9000}], head) == v, (
        "1 inside the bracketed interval: no caveat, however small the standard error"
    )
    head.update(distortion_low=1.1, distortion_uncertain="the blocks drifted")
    said = cycle_evidence.profiler_caveat(v, [{"steps": 1, "gpu_busy_us": 9000}], head)["sentence"]
    assert "1.10x to 1.70x as long" in said


def test_a_run_without_the_after_block_reads_as_before(tmp_path):
    """run.json files recorded before the second block: the first block alone, the old interval."""
    cycles = two_cycles(tmp_path)
    cap = capture([SHORT] * 10, depth=0, workers=0, step_ms=0.05)
    cap["unprofiled"]["step_ms_each"] = [0.09, 0.05, 0.07]
    head = cycle_evidence.write_evidence(cycles, cap)
    assert head["unprofiled_after_ms"] is None and head["unprofiled_drift"] is None
    assert head["distortion_uncertain"] is None and head["unprofiled_step_ms"] == pytest.approx(0.07)
    profiled = [0.1, 0.1, 0.1, 0.06, 0.06, 0.06]
    assert (head["distortion_low"], head["distortion_high"]) == pytest.approx(
        own_interval(profiled, [0.09, 0.05, 0.07])
    )
    with open(cycles[0]["evidence_txt"]) as f:
        assert "just before the capture" in f.read()


def test_the_evidence_pools_both_blocks_and_names_a_drift(tmp_path):
    cycles = two_cycles(tmp_path)
    cap = capture([SHORT] * 10, depth=0, workers=0, step_ms=0.05)
    cap["unprofiled"] = block([0.050, 0.051, 0.049, 0.050])
    cap["unprofiled_after"] = block([0.040, 0.041, 0.039, 0.040])
    head = cycle_evidence.write_evidence(cycles, cap)
    assert head["unprofiled_step_ms"] == pytest.approx(0.045), "the unprofiled step pools both blocks"
    assert head["unprofiled_before_ms"] == pytest.approx(0.05) and head["unprofiled_after_ms"] == pytest.approx(0.04)
    assert head["distortion_low"] <= head["profiler_distortion"] <= head["distortion_high"]
    assert "0.05 ms" in head["distortion_uncertain"] and "0.04 ms" in head["distortion_uncertain"]
    assert "uncertain" in head["distortion_sentence"]
    with open(cycles[0]["evidence_txt"]) as f:
        text = f.read()
    assert "just after it" in text and "95% interval" in text, text


def test_a_profile_run_times_equal_blocks_before_and_after_the_capture(profile_run):
    """A real CPU profile-mode run: both blocks in run.json, the same number of steps each side."""
    with open(os.path.join(profile_run["outputs"], "run.json")) as f:
        res = json.load(f)["results"]
    before, after = res["unprofiled"], res["unprofiled_after"]
    assert before["steps"] == after["steps"] == 10
    assert len(before["step_ms_each"]) == len(after["step_ms_each"]) == 10
    e = res["evidence"]
    assert e["unprofiled_before_steps"] == e["unprofiled_after_steps"] == 10
    assert (
        min(e["unprofiled_before_ms"], e["unprofiled_after_ms"])
        <= e["unprofiled_step_ms"]
        <= max(e["unprofiled_before_ms"], e["unprofiled_after_ms"])
    )
    assert e["distortion_low"] <= e["profiler_distortion"] <= e["distortion_high"]
    assert e["unprofiled_drift"] == pytest.approx(e["unprofiled_after_ms"] / e["unprofiled_before_ms"])


def test_a_stop_during_the_after_block_keeps_the_profiled_results(tmp_path):
    """SIGTERM in the second unprofiled block: it ends there, the evidence is written with the steps it
    completed, and run.json says stopped with the results."""
    argv = ["--mode", "profile", "--device", "cpu", "--data", "synthetic", "--batch-size", "16", "--warmup-steps", "1"]
    code, stderr, workers = signal_at(
        argv, tmp_path, "unprofiled steps after the capture (", signal.SIGTERM, timeout=900
    )  # the marker comes after both profiled cycles
    record = assert_stopped(tmp_path, code, stderr, signal.SIGTERM, workers, {"unprofiled timing after"})
    res = record.get("results")
    assert res and res["evidence"]["verdict"], "the profiled cycles' results were dropped"
    assert len(res["cycles"]) == 2 and all(os.path.exists(c["evidence_json"]) for c in res["cycles"])
    assert 1 <= res["unprofiled_after"]["steps"] <= 10 and res["unprofiled"]["steps"] == 10
    assert res["evidence"]["unprofiled_after_steps"] == res["unprofiled_after"]["steps"]
    _, outputs = single_run(tmp_path)
    assert len(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz"))) == 2
    assert "results are kept" in overview.ended(record)[1]


def test_the_distortion_table_pairs_each_profile_run_with_its_repeat_s_bench(tmp_path):
    """Synthetic run.json files: profiled/bench inside or outside each run's interval, counted per configuration."""

    def run(uuid, **data):
        path = tmp_path / "runs" / uuid / "outputs"
        path.mkdir(parents=True)
        (path / "run.json").write_text(json.dumps({"device": "cpu", **data}))

    def profile(repeat, detail, low, high, profiled=20.0, workers=0):
        return {
            "mode": "profile",
            "settings": {"workers": workers, "repeat": repeat, "profile_detail": detail},
            "results": {
                "evidence": {
                    "profiled_step_ms": profiled,
                    "unprofiled_step_ms": 15.0,
                    "unprofiled_before_ms": 14.0,
                    "unprofiled_after_ms": 16.0,
                    "unprofiled_drift": 16 / 14,
                    "profiler_distortion": 20 / 15,
                    "distortion_low": low,
                    "distortion_high": high,
                }
            },
        }

    bench = lambda repeat, ms, workers=0: {
        "mode": "bench",
        "settings": {"workers": workers, "repeat": repeat},  # noqa: E731
        "results": {"window_seconds": ms * 300 / 1e3, "window_steps": 300},
    }
    run("a1", **bench(1, 10.0))
    run("a2", **profile(1, "full", 1.5, 2.5))  # 20 / 10 = 2.0: inside
    run("a3", **profile(1, "lean", 1.1, 1.6))  # 2.0: outside
    run("a4", **bench(2, 16.0))
    run("a5", **profile(2, "full", 1.1, 1.4))  # 20 / 16 = 1.25: inside
    run("b1", **profile(1, "full", 1.0, 2.0, workers=4))  # no bench of its repeat
    run("c1", **bench(1, 10.0, workers=8), environment={"boot_id": "bootAAAA-1", "gpu_uuid": "GPU-gpuAAAAA"})
    run(
        "c2",
        **profile(1, "full", 1.5, 2.5, workers=8),
        environment={"boot_id": "bootBBBB-1", "gpu_uuid": "GPU-gpuAAAAA"},
    )
    out = tmp_path / "table.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "distortion_table.py"), str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "--workers 0: inside for 2 of 3" in text, text
    assert (
        "--workers 4: inside for 0 of 0 (1 without an interval or a bench job of the same repeat and machine)" in text
    )
    # the same repeat on another machine (another boot) is no bench of this run's
    assert "--workers 8: inside for 0 of 0 (1 without" in text and "| bootBBBB/gpuAAAAA |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.split("|")[4].strip()[:1] == "a"]
    assert [r.split("|")[-2].strip() for r in rows] == ["yes", "yes", "no"], rows  # full 1, full 2, lean 1
    assert (
        "| 2.000 |" in rows[0]
        and "| 10.00 |" in rows[0]
        and "| recorded |" in rows[0]
        and "14.00" in rows[0]
        and "16.00" in rows[0]
    )
    assert not glob.glob(str(tmp_path / ".partial-*"))
    # a second study that reuses the repeat numbers: each profile run pairs with the bench of its own study
    second = tmp_path / "second"
    for uuid, data in (("d1", bench(1, 20.0)), ("d2", profile(1, "full", 0.9, 1.1))):  # 20 / 20 = 1.0: inside
        (second / "runs" / uuid / "outputs").mkdir(parents=True)
        (second / "runs" / uuid / "outputs" / "run.json").write_text(json.dumps({"device": "cpu", **data}))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "distortion_table.py"),
            str(tmp_path),
            str(second),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "--workers 0: inside for 3 of 4" in text and f"2 = {second}" in text, text
    (row,) = [line for line in text.splitlines() if "| d2 |" in line]
    assert row.split("|")[2].strip() == "2" and "| 20.00 | 1.000 |" in row and row.split("|")[-2].strip() == "yes", row
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "distortion_table.py"), str(empty)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0 and "no runs/ folder" in bad.stderr


def test_the_distortion_study_refuses_bad_arguments_before_any_job(tmp_path):
    script = os.path.join(ROOT, "scripts", "distortion_study.sh")
    for args in (["x"], [str(tmp_path / "r"), "0"], [str(tmp_path / "r"), "1", "--bench-steps", "0"]):
        proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith("usage:"), (args, proc.stderr)
    assert not (tmp_path / "r").exists(), "a refused study made its root"


def test_the_table_reads_re_derived_evidence_where_there_is_some(tmp_path):
    """distortion_table.py --reevidence: a run found there reads its evidence from there, and says so."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import distortion_table

    root = tmp_path / "root"
    run_dir = root / "runs" / "aaaa1111" / "outputs"
    run_dir.mkdir(parents=True)
    recorded = {"profiled_step_ms": 20.0, "profiler_distortion": 2.0, "distortion_low": 1.5, "distortion_high": 2.5}
    (run_dir / "run.json").write_text(
        json.dumps(
            {"mode": "profile", "settings": {"repeat": 1, "profile_detail": "lean"}, "results": {"evidence": recorded}}
        )
    )
    again = tmp_path / "again" / "aaaa1111"
    again.mkdir(parents=True)
    (again / "evidence.json").write_text(
        json.dumps({"evidence": {**recorded, "distortion_low": 1.9, "distortion_high": 2.1}})
    )
    ((_, plain),) = distortion_table.load(str(root))
    ((_, redone),) = distortion_table.load(str(root), str(tmp_path / "again"))
    assert plain["results"]["evidence"]["distortion_low"] == 1.5 and not plain.get("rederived")
    assert redone["results"]["evidence"]["distortion_low"] == 1.9 and redone["rederived"]
    assert distortion_table.main([str(root), "--reevidence", str(tmp_path / "nowhere")]) == 2
