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
from conftest import FEW, ROOT, TINY, single_run
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
    # lean: the capture's cost buys this test nothing; 4 unprofiled steps a side, not 10: the stop needs only a block
    argv = ["--mode", "profile", *TINY, "--profile-detail", "lean", *FEW]
    # 100 ms a sample: the block's 4 steps take 1.6 s, far longer than the signal takes to arrive
    code, stderr, workers = signal_at(
        argv, tmp_path, "unprofiled steps after the capture (", signal.SIGTERM, timeout=900, slow_sample_ms=100
    )  # the marker comes after both profiled cycles
    record = assert_stopped(tmp_path, code, stderr, signal.SIGTERM, workers, {"unprofiled timing after"})
    res = record.get("results")
    assert res and res["evidence"]["verdict"], "the profiled cycles' results were dropped"
    assert len(res["cycles"]) == 2 and all(os.path.exists(c["evidence_json"]) for c in res["cycles"])
    assert 1 <= res["unprofiled_after"]["steps"] <= 4 and res["unprofiled"]["steps"] == 4
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


# Each test below pins one edge of the rules, with figures worked out by hand in its comments.

NULLS = {
    "unprofiled_drift": None,
    "distortion_low": None,
    "distortion_high": None,
    "distortion_uncertain": None,
    "unprofiled_before_ms": None,
    "unprofiled_before_sd_ms": None,
    "unprofiled_before_steps": None,
    "unprofiled_after_ms": None,
    "unprofiled_after_sd_ms": None,
    "unprofiled_after_steps": None,
}


def drifted(before_ms, after_ms):
    return (
        f"the unprofiled steps before the capture took {before_ms} ms and those after it {after_ms} ms, further "
        "apart than their own spread allows: the host's pace drifted across the capture"
    )


def test_no_block_leaves_every_key_null():
    assert distortion.distortion_interval(20.0, PROFILED, []) == NULLS


def test_a_block_without_per_step_times_leaves_the_interval_and_its_spread_null():
    out = distortion.distortion_interval(20.0, PROFILED, [("before", 10.0, None, 40)])
    assert out == {**NULLS, "unprofiled_before_ms": 10.0, "unprofiled_before_steps": 40}


def test_a_block_of_two_steps_has_a_spread():
    """[9, 11]: mean 10, sample sd sqrt(((-1)^2 + 1^2) / 1) = sqrt(2)."""
    out = distortion.distortion_interval(20.0, PROFILED, [("before", 10.0, [9.0, 11.0], 2)])
    assert out["unprofiled_before_sd_ms"] == pytest.approx(math.sqrt(2))
    assert out["distortion_low"] < 2.0 < out["distortion_high"]


@pytest.mark.parametrize("profiled_ms", [None, 0.0])
def test_no_profiled_time_gives_no_ratio_and_no_doubt(profiled_ms):
    """Without a profiled time there is no ratio: no interval, and no drift to move it (blocks far apart)."""
    blocks = blocks_of(STEADY, DRIFTED)
    out = distortion.distortion_interval(profiled_ms, PROFILED, blocks)
    assert out["distortion_low"] is None and out["distortion_high"] is None
    assert out["distortion_uncertain"] is None and out["unprofiled_drift"] == pytest.approx(1.25)


def test_a_block_of_one_step_cannot_be_tested_for_drift():
    """One step has no spread: the blocks cannot be compared, whichever of the two it is."""
    for before, after in (([10.0], DRIFTED), (STEADY, [12.5])):
        out = distortion.distortion_interval(20.0, PROFILED, blocks_of(before, after))
        assert out["distortion_uncertain"] is None and out["distortion_low"] is None
        assert out["unprofiled_drift"] == pytest.approx(12.5 / 10.0)


def test_blocks_of_two_steps_are_tested_for_drift():
    """Before [10.0, 10.2]: mean 10.1, variance 0.02, vb = 0.01; DRIFTED: mean 12.5, variance 0.025, va = 0.005.
    Welch: se sqrt(0.015) = 0.122, df 0.015^2 / (0.01^2 / 1 + 0.005^2 / 4) = 2.1, t 4.30: 2.4 ms apart is
    far beyond 0.53. The ratio 20 / 10.1 = 1.98 against 20 / 12.5 = 1.60 moves by 0.38, more than a quarter of
    20 / 11.3 - 1 = 0.77. The same with the two-step block after the capture."""
    out = distortion.distortion_interval(20.0, PROFILED, blocks_of([10.0, 10.2], DRIFTED))
    assert out["distortion_uncertain"] == drifted("10.10", "12.50")
    out = distortion.distortion_interval(20.0, PROFILED, blocks_of(DRIFTED, [10.0, 10.2]))
    assert out["distortion_uncertain"] == drifted("12.50", "10.10")


def test_the_welch_test_decides_on_its_own_degrees_of_freedom():
    """The profiled time sits midway between the blocks, so any drift moves the ratio more than a quarter of
    its distance from 1 (which is 0): the blocks are called apart exactly when Welch's test says so.

    Apart: [9.5, 10, 10.5] and [11, 11.5, 12], each variance 0.25, so vb = va = 0.25 / 3; se = sqrt(1/6) =
    0.408; df = (1/6)^2 / (2 x (1/12)^2 / 2) = 4, t 2.78: 1.5 ms apart is beyond 1.135 (t 4.30 at df 2 would
    not be: 1.755).
    Together: [9.5, 10.5] (variance 0.5, vb 0.25) and [11.5, 12.5, 13.5] (variance 1, va 1/3); se = sqrt(7/12)
    = 0.764; df = (7/12)^2 / (0.25^2 / 1 + (1/3)^2 / 2) = 2.88, t 4.30: 2.5 ms apart is within 3.28 (t 3.18 at
    df 3 would call them apart: 2.43)."""
    apart = distortion.distortion_interval(10.75, None, blocks_of([9.5, 10.0, 10.5], [11.0, 11.5, 12.0]))
    assert apart["distortion_uncertain"] == drifted("10.00", "11.50")
    together = distortion.distortion_interval(11.25, None, blocks_of([9.5, 10.5], [11.5, 12.5, 13.5]))
    assert together["distortion_uncertain"] is None and together["unprofiled_drift"] == pytest.approx(1.25)
    assert together["distortion_low"] is None, "no profiled per-step times: no interval"


def test_blocks_of_constant_steps_differ_when_their_means_do():
    """No spread at all (vb + va = 0): any difference is a drift; equal blocks are none."""
    out = distortion.distortion_interval(11.0, None, blocks_of([10.0] * 3, [12.0] * 3))
    assert out["distortion_uncertain"] == drifted("10.00", "12.00")
    out = distortion.distortion_interval(11.0, None, blocks_of([10.0] * 3, [10.0] * 3))
    assert out["distortion_uncertain"] is None and out["unprofiled_drift"] == 1.0


def test_a_drift_that_moves_the_ratio_by_exactly_a_quarter_of_its_distance_from_1_is_no_doubt():
    """Blocks 8 and 10 ms (clearly apart: se 0.41, t 2.78), profiled 90 ms: 90/8 - 90/10 = 2.25, and a quarter
    of 90/9 - 1 = 9 is 2.25: not more, so no doubt. At 20 ms the same drift moves 20/8 - 20/10 = 0.5, more
    than a quarter of 20/9 - 1 = 1.22 (0.31): it matters."""
    blocks = blocks_of([7.5, 8.0, 8.5], [9.5, 10.0, 10.5])
    assert distortion.distortion_interval(90.0, None, blocks)["distortion_uncertain"] is None
    assert distortion.distortion_interval(20.0, None, blocks)["distortion_uncertain"] == drifted("8.00", "10.00")


def test_the_ratio_s_degrees_of_freedom_and_steps_without_spread():
    """[9, 10, 11] over [4, 5, 6]: each variance 1, so the relative variances of the means are 1/3/100 and
    1/3/25; total 1/60, se 2 x sqrt(1/60) = 0.258; df (1/60)^2 / ((1/300)^2 / 2 + (1/75)^2 / 2) = 50/17."""
    se, df = distortion.ratio_se(2.0, [9.0, 10.0, 11.0], [4.0, 5.0, 6.0])
    assert se == pytest.approx(2 * math.sqrt(1 / 60)) and df == pytest.approx(50 / 17)
    assert distortion.ratio_se(2.0, [10.0, 10.0], [5.0, 5.0]) == (0.0, None), "no spread: no error, no df"


def test_pooled_pace_drops_a_slow_first_step_only_where_the_cpu_runs_ahead():
    """[15, 10, 10.5, 9.5]: the first is the slowest. Kept by default (mean 11.25), left out where the CPU runs
    ahead (mean 10)."""
    capture = {"unprofiled": block([15.0, 10.0, 10.5, 9.5])}
    assert distortion.pooled_pace(capture) == (
        11.25,
        [15.0, 10.0, 10.5, 9.5],
        [("before", 11.25, capture["unprofiled"]["step_ms_each"], 4)],
    )
    mean, steady, blocks = distortion.pooled_pace(capture, cpu_runs_ahead=True)
    assert mean == 10.0 and steady == [10.0, 10.5, 9.5] and blocks == [("before", 10.0, [10.0, 10.5, 9.5], 4)]


def test_pooled_pace_keeps_the_few_steps_of_a_block_cut_short():
    """A stop after two steps of the block after the capture: its steps [12, 14] (mean 13) are kept, not the
    synchronized 13.4 ms, and pooled with the six before (mean 10): (60 + 12 + 14) / 8 = 10.75."""
    after = {"steps": 2, "step_ms": 13.4, "step_ms_each": [12.0, 14.0]}
    capture = {"unprofiled": block([10.0] * 6), "unprofiled_after": after}
    mean, steady, blocks = distortion.pooled_pace(capture)
    assert mean == 10.75 and steady == [10.0] * 6 + [12.0, 14.0]
    assert blocks[1] == ("after", 13.0, [12.0, 14.0], 2)


def test_pooled_pace_weighs_blocks_without_per_step_times_by_their_steps():
    """10 ms over 4 steps and 12 ms over 6: (40 + 72) / 10 = 11.2. A block that does not say its steps counts
    as one: 10 ms (unknown steps) and 13 ms over 2: (10 + 26) / 3 = 12."""
    capture = {"unprofiled": {"steps": 4, "step_ms": 10.0}, "unprofiled_after": {"steps": 6, "step_ms": 12.0}}
    assert distortion.pooled_pace(capture)[:2] == (pytest.approx(11.2), None)
    capture = {"unprofiled": {"step_ms": 10.0}, "unprofiled_after": {"steps": 2, "step_ms": 13.0}}
    assert distortion.pooled_pace(capture)[:2] == (12.0, None)


def test_the_unprofiled_pace_at_the_edges_of_its_rules():
    """Three steps are enough for per-step times; a first step as slow as the slowest other, or slower than
    all but the second, is not the lone slow start and stays in."""
    assert distortion.unprofiled_pace({"steps": 3, "step_ms": 10.5, "step_ms_each": [10.0, 11.0, 12.0]}) == (
        11.0,
        [10.0, 11.0, 12.0],
    )
    tied = [12.0, 10.0, 12.0, 10.0]
    assert distortion.unprofiled_pace({"steps": 4, "step_ms_each": tied}, cpu_runs_ahead=True) == (11.0, tied)
    second = [12.0, 13.0, 10.0, 9.0]
    assert distortion.unprofiled_pace({"steps": 4, "step_ms_each": second}, cpu_runs_ahead=True) == (11.0, second)


SE_WORDS = ", give or take 0.20 (one standard error, from the spread of the profiled and the unprofiled steps)"
LOADER = (
    "; with DataLoader workers both timings can be paced by the loader, which hides the profiler's cost to the "
    "main process"
)


@pytest.mark.parametrize(
    "args,kw,expect",
    [
        (
            (1.78, 0, False),
            {"se": 0.2, "df": 8, "interval": (1.5, 2.1), "uncertain": "the blocks drifted"},
            "profiled steps take 1.78x the unprofiled ones" + SE_WORDS + ", but the distortion is uncertain: the "
            "blocks drifted; against either block it lies between 1.50 and 2.10 (mode=bench times the pace)",
        ),
        (
            (1.78, 0, False),
            {"uncertain": "the blocks drifted"},
            "profiled steps take 1.78x the unprofiled ones, but the distortion is uncertain: the blocks drifted "
            "(mode=bench times the pace)",
        ),
        (
            (1.3, 2, False),
            {"se": 0.2, "df": 4, "interval": (0.9, 1.7)},
            "profiled steps take 1.30x the unprofiled ones" + SE_WORDS + "; 95% interval 0.90 to 1.70 against the "
            "steps before and after the capture: too uncertain to tell the profiler's cost from none" + LOADER,
        ),
        (
            (1.3, 0, False),
            {"interval": (0.9, 1.7)},
            "profiled steps take 1.30x the unprofiled ones; 95% interval 0.90 to 1.70 against the steps before and "
            "after the capture: too uncertain to tell the profiler's cost from none",
        ),
        (
            (1.3, 0, True),
            {"se": 0.2, "df": 4, "interval": (1.1, 1.5)},  # the interval decides, not the standard error
            "profiled steps take 1.30x the unprofiled ones" + SE_WORDS + "; 95% interval 1.10 to 1.50 against the "
            "steps before and after the capture: the trace's CPU times are inflated; the GPU's figures are not",
        ),
        (
            (0.79, 2, False),
            {"spread": (9.5, 12.3)},
            "profiled steps take 0.79x the unprofiled ones, which the profiler cannot cause: the DataLoader workers "
            "had batches queued during the profiler's pauses (see refilled_by), so the trace understates the input "
            "wait; the unprofiled step (unprofiled steps 9.5 to 12.3 ms) is the closer figure of the loader-bound "
            "pace",
        ),
        (
            (0.79, 2, False),
            {},
            "profiled steps take 0.79x the unprofiled ones, which the profiler cannot cause: the DataLoader workers "
            "had batches queued during the profiler's pauses (see refilled_by), so the trace understates the input "
            "wait; the unprofiled step is the closer figure of the loader-bound pace",
        ),
        (
            (0.85, 0, False),
            {},
            "profiled steps take 0.85x the unprofiled ones, which the profiler cannot cause: the host's pace "
            "changed between the two timings, so the ratio says nothing of the profiler's cost here",
        ),
        (
            (1.6, 4, False),
            {},
            "profiled steps take 1.60x the unprofiled ones: the profiler slows the main process while the 4 "
            "DataLoader workers run unprofiled in their own processes, so each profiled step gives them more time "
            "to load and input waits the bench feels may not show in the trace (compare --profile-detail lean)",
        ),
        (
            (1.6, 4, False),
            {"detail": "lean"},
            "profiled steps take 1.60x the unprofiled ones: the profiler slows the main process while the 4 "
            "DataLoader workers run unprofiled in their own processes, so each profiled step gives them more time "
            "to load and input waits the bench feels may not show in the trace (a lean capture still records "
            "every operator)",
        ),
        (
            (1.6, 0, False),
            {},
            "profiled steps take 1.60x the unprofiled ones: loading runs in the profiled main process, so the "
            "trace overstates the in-process input cost (compare --profile-detail lean)",
        ),
    ],
)
def test_each_distortion_sentence_word_for_word(args, kw, expect):
    assert distortion.distortion_sentence(*args, **kw) == expect


def test_a_ratio_whose_interval_ends_at_1_is_not_too_uncertain():
    """The interval must hold 1 inside it: an end at 1 exactly, or 1.49 exactly 1.96 x 0.25 = 0.49 from 1,
    does not."""
    assert "overstates" in distortion.distortion_sentence(1.3, 0, False, interval=(1.0, 1.5))
    assert "host's pace changed" in distortion.distortion_sentence(0.85, 0, False, interval=(0.7, 1.0))
    assert "overstates" in distortion.distortion_sentence(1.49, 0, False, se=0.25)


# The queue model in exact binary figures: a batch every 0.5 s, steps computing 0.375 s, so the loader makes
# 0.75 of a batch per step. Without pauses step 0 waits 0.5 s and every later one (1 - 0.75) x 0.5 = 0.125 s,
# a quarter of a batch's time: exactly the WAITED_AT threshold (0.25 x 0.5).
PACE, COMPUTE = 0.5, [0.375] * 12


def refilled(cycles, pauses, **kw):
    return distortion.refills(cycles, pauses, queue_depth=8, pace_s=PACE, compute_s=COMPUTE[: len(pauses)], **kw)


def test_a_wait_of_exactly_the_threshold_is_a_wait_and_what_it_hides_is_flagged():
    """A 1 s pause before step 2 queues 2 batches: steps 2, 3, 4 find one each (queue 2.75, 2.5, 2.25) and
    would each have waited 0.125 s without it, exactly the threshold: flagged. A one-step cycle whose
    would-be wait is exactly the threshold is flagged too."""
    pauses = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    entry = {"before_step": 2, "seconds": 1.0, "batches": 2.0, "what": "profiler.step()", "dump": False}
    assert refilled([{"cycle": 1, "profiler_steps": [2, 4]}], pauses) == {1: [{**entry, "steps": [2, 3, 4]}]}
    assert refilled([{"cycle": 1, "profiler_steps": [2, 2]}], pauses) == {1: [{**entry, "steps": [2]}]}


def test_measured_waits_of_exactly_a_quarter_of_the_would_be_waits_keep_a_cycle_unflagged():
    """Cycle [2, 4] would wait 3 x 0.125 = 0.375 s without the pause; a quarter is 0.09375. Measured waits
    adding up to exactly that are not less: no refill. A measured wait after the cycle (step 5) is not the
    cycle's."""
    pauses = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    cycles = [{"cycle": 1, "profiler_steps": [2, 4]}]
    assert refilled(cycles, pauses, measured_waits={2: 0.09375, 3: 0.0, 4: 0.0}) == {1: []}
    one = [{"cycle": 1, "profiler_steps": [2, 2]}]
    assert [r["steps"] for r in refilled(one, pauses, measured_waits={2: 0.0, 3: 0.5})[1]] == [[2]]


def test_a_wait_seen_in_the_trace_counts_with_and_without_the_pauses():
    """A 2 s pause before step 2 queues 4 batches, enough for steps 2 to 9 (the queue falls by 0.25 a step);
    step 9 was seen waiting 0.25 s. Without the pause the cycle's steps would wait 7 x 0.125 + 0.25 = 1.125 s;
    with it they waited 0.25 s (step 9), less than a quarter (0.28125): steps 2 to 8 were served, not 9. Step 1
    waited 0.125 s, the threshold, so the refill is put down to a pause after it."""
    pauses = [0.0, 0.0, 2.0] + [0.0] * 7
    found = refilled([{"cycle": 1, "profiler_steps": [2, 9]}], pauses, seen_waits={9: 0.25})
    assert found == {
        1: [
            {
                "before_step": 2,
                "seconds": 2.0,
                "batches": 4.0,
                "steps": [2, 3, 4, 5, 6, 7, 8],
                "what": "profiler.step()",
                "dump": False,
            }
        ]
    }


def test_a_step_seen_waiting_the_threshold_starts_the_search_for_the_pause_anew():
    """A 3 s pause before step 1, whose step was seen waiting 0.125 s (the threshold) all the same, then a 1 s
    pause before step 2 that serves steps 2 to 4: those are put down to the second pause, not the larger
    first one."""
    pauses = [0.0, 3.0, 1.0, 0.0, 0.0, 0.0]
    found = refilled([{"cycle": 1, "profiler_steps": [2, 4]}], pauses, seen_waits={1: 0.125})
    assert [(r["before_step"], r["steps"]) for r in found[1]] == [(2, [2, 3, 4])]


def test_a_cycle_that_runs_past_the_recorded_pauses_reads_the_steps_recorded():
    """A stop after step 4 of a cycle meant to reach step 6: steps 5 and 6 have no pause, no time, no wait."""
    pauses = [0.0, 0.0, 1.0, 0.0, 0.0]
    found = refilled([{"cycle": 1, "profiler_steps": [2, 6]}], pauses)
    assert [r["steps"] for r in found[1]] == [[2, 3, 4]]


def test_unknown_compute_times_count_as_one_batch_time():
    """compute_s absent: each step computes for one batch's time, so the loader keeps up with it and no
    step after the first waits, with the 1 s pause or without it: nothing hidden."""
    found = distortion.refills([{"cycle": 1, "profiler_steps": [2, 4]}], [0.0, 0.0, 1.0, 0.0, 0.0], 8, PACE)
    assert found == {1: []}


def test_the_figures_of_a_refill_are_rounded_to_their_own_precision():
    """A 0.05432 s pause at a 0.02 s pace is 2.716 batches: said as 0.0543 s and 2.72 batches."""
    cycles = [{"cycle": 1, "profiler_steps": [2, 4]}, {"cycle": 2, "profiler_steps": [7, 9]}]
    pauses = [0] * 10
    pauses[6] = 0.05432
    found = distortion.refills(cycles, pauses, queue_depth=8, pace_s=0.02, compute_s=[0.01] * 10)
    assert [(r["seconds"], r["batches"], r["steps"]) for r in found[2]] == [(0.0543, 2.72, [7, 8, 9])]


def test_refills_without_a_queue_or_a_pace():
    """No worker queue: nothing is refilled, even with the pace unknown. Pace unknown: no pause, nothing
    flagged; with pauses, every traced step but the loop's first (its queue starts empty) and those seen
    waiting, each put down to the longest pause since the last step seen waiting."""
    one = [{"cycle": 1, "profiler_steps": [0, 2]}, {"cycle": 2, "profiler_steps": [4, 5]}]
    pauses = [0.0, 0.3, 0.1, 0.0, 0.5, 0.2]
    assert distortion.refills(one, pauses, queue_depth=0, pace_s=None) == {1: [], 2: []}
    assert distortion.refills(one, [0.0] * 6, queue_depth=8, pace_s=None) == {1: [], 2: []}
    found = distortion.refills(one, pauses, queue_depth=8, pace_s=None)
    assert found == {
        1: [
            {"before_step": 1, "seconds": 0.3, "batches": 8, "steps": [1, 2], "what": "profiler.step()", "dump": False}
        ],
        2: [
            {"before_step": 4, "seconds": 0.5, "batches": 8, "steps": [4, 5], "what": "profiler.step()", "dump": False}
        ],
    }
    start = distortion.refills([{"cycle": 1, "profiler_steps": [1, 2]}], [0.4, 0.1, 0.0], queue_depth=8, pace_s=None)
    assert [(r["before_step"], r["what"], r["steps"]) for r in start[1]] == [(0, "the profiler's start", [1, 2])]
    seen = distortion.refills(
        [{"cycle": 1, "profiler_steps": [1, 3]}], [0.4, 0.1, 0.05, 0.02], 8, None, seen_waits={1: 0.05}
    )
    assert [(r["before_step"], r["steps"]) for r in seen[1]] == [(2, [2, 3])], "after the wait seen at step 1"


def test_a_step_seen_waiting_exactly_the_threshold_was_not_served():
    """A 1.5 s pause before step 2 queues 3 batches, enough for steps 2 to 6; step 6 was seen waiting 0.125 s
    all the same, the threshold: it waited, so it is not listed. The cycle would have waited 5 x 0.125 =
    0.625 s and waited 0.125 s, less than a quarter (0.15625): flagged, with steps 2 to 5."""
    pauses = [0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0]
    found = refilled([{"cycle": 1, "profiler_steps": [2, 6]}], pauses, seen_waits={6: 0.125})
    assert [(r["before_step"], r["batches"], r["steps"]) for r in found[1]] == [(2, 3.0, [2, 3, 4, 5])]


def test_blocks_of_equal_spread_are_tested_on_their_own_degrees_of_freedom():
    """[9.5, 10, 10.5] and [10.5, 11, 11.5]: vb = va = 0.25 / 3, se sqrt(1/6) = 0.408, df 4, t 2.78: 1 ms
    apart is within 1.135 (1.96 standard errors, 0.80, would call it a drift). The profiled time midway."""
    out = distortion.distortion_interval(10.5, None, blocks_of([9.5, 10.0, 10.5], [10.5, 11.0, 11.5]))
    assert out["distortion_uncertain"] is None


def test_a_difference_of_exactly_t975_standard_errors_is_within_the_spread():
    """[1.9375, 2.0625] (vb = 0.0625^2) and two steps 0.125 either side of c (va = 0.125^2): se sqrt(5/256),
    df (5/256)^2 / ((1/256)^2 + (1/64)^2) = 25/17, t 12.71. With c = 2 + 12.71 x se to the last bit the means
    are exactly t975 standard errors apart: not more, so no drift. The profiled time midway."""
    c = 2.0 + 12.71 * math.sqrt(5 / 256)
    assert c - 2.0 == 12.71 * math.sqrt(5 / 256), "the tie holds in floating point"
    out = distortion.distortion_interval((2.0 + c) / 2, None, blocks_of([1.9375, 2.0625], [c - 0.125, c + 0.125]))
    assert out["distortion_uncertain"] is None
    wider = 2.0 + 12.72 * math.sqrt(5 / 256)
    out = distortion.distortion_interval(
        (2.0 + wider) / 2, None, blocks_of([1.9375, 2.0625], [wider - 0.125, wider + 0.125])
    )
    assert out["distortion_uncertain"] is not None, "a hair further apart is a drift"
