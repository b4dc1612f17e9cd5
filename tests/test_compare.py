"""compare.py: exact statistics on fabricated records, real offline runs, and the Polyaxon-client path."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import compare
from conftest import ROOT, TINY, run_train


def rec(uuid, rates_index, rate, mode="bench", status="succeeded", gpu="NVIDIA H200", **settings):
    base = {"mode": mode, "workers": 0, "batch_size": 128, "data": "synthetic", "seed": 0, "repeat": rates_index}
    base.update(settings)
    outputs = {"samples_per_sec": rate} if mode == "bench" else {"profiled_step_ms": 90.0, "gpu_idle_share": 0.9,
                                                                 "input_gap_share": 0.8}
    run_json = {"settings": base, "environment": {"gpu": gpu, "torch": "2.11.0", "cuda": "13.0"},
                "cpu_budget": {"cpus": 4}}
    return compare.record_from(uuid, f"{mode}-{uuid}", f"2026-12-02T10:{rates_index:02d}:00", status, base,
                               outputs, run_json)


def fabricated():
    a = [rec(f"a{i}", i * 2, r, workers=0) for i, r in enumerate([1.0, 2.0, 3.0, 4.0, 100.0])]
    b = [rec(f"b{i}", i * 2 + 1, r, workers=4) for i, r in enumerate([10.0, 20.0, 30.0])]
    return a + b


def test_groups_by_the_differing_setting_with_exact_statistics():
    result = compare.compare_records(fabricated())
    assert result["varying"] == ["workers"], "repeat must not split groups"
    a, b = result["groups"]
    assert (a["group"], a["n"], a["median"], a["min"], a["max"]) == ("workers=0", 5, 3.0, 1.0, 100.0)
    assert a["spread"] == pytest.approx(99 / 3)
    assert (b["group"], b["median"], b["spread"]) == ("workers=4", 20.0, 1.0)
    assert b["ratio"] == pytest.approx(20 / 3)
    assert b["ratio_bounds"] == pytest.approx((10 / 100, 30 / 1))
    assert b["verdict"].startswith("within the noise"), "overlapping ranges with an outlier are noise"
    assert result["warnings"] == []


def test_clear_difference_exceeds_the_noise():
    records = [rec(f"a{i}", i, r) for i, r in enumerate([100, 101, 99, 100])] + \
              [rec(f"b{i}", 10 + i, r, workers=4) for i, r in enumerate([300, 305, 298, 301])]
    g = compare.compare_records(records)["groups"][1]
    lo, hi = g["ratio_ci95"]
    assert 2.9 < lo <= g["ratio"] <= hi < 3.1
    assert g["verdict"] == "exceeds the noise; the ranges do not overlap"


def test_profile_and_failed_runs_are_left_out_and_named():
    records = fabricated() + [rec("p0", 30, None, mode="profile", workers=0),
                              rec("f0", 31, 5.0, status="failed", workers=0)]
    result = compare.compare_records(records)
    why = {r["uuid"]: r["why"] for r in result["left_out"]}
    assert set(why) == {"p0", "f0"} and "profiled" in why["p0"] and "failed" in why["f0"]
    assert sum(g["n"] for g in result["groups"]) == 8
    assert result["groups"][0]["evidence"]["uuid"] == "p0", "the matching profile run's evidence sits beside"
    assert result["groups"][1]["evidence"] is None


def test_only_profile_runs_is_an_error():
    with pytest.raises(compare.CompareError, match="no succeeded bench runs"):
        compare.compare_records([rec("p0", 0, None, mode="profile")])


def test_mismatch_warnings_name_what_differs():
    records = fabricated()
    records[-1] = rec("b9", 40, 25.0, workers=4, gpu="NVIDIA A100")
    records.append(rec("c0", 41, 25.0, workers=4, batch_size=256))
    warnings = compare.compare_records(records)["warnings"]
    assert any("more than one setting" in w and "batch_size" in w for w in warnings)
    assert any("differ in gpu" in w and "A100" in w for w in warnings)


def test_baseline_choice_and_unknown_baseline():
    result = compare.compare_records(fabricated(), baseline="workers=4")
    assert result["groups"][0]["group"] == "workers=4" and result["groups"][1]["ratio"] == pytest.approx(3 / 20)
    with pytest.raises(compare.CompareError, match="none of the groups"):
        compare.compare_records(fabricated(), baseline="workers=3")


def test_outputs_written_and_the_plot_is_a_png(tmp_path):
    paths = compare.write_outputs(compare.compare_records(fabricated()), str(tmp_path))
    with open(paths["png"], "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(paths["png"]) > 5000
    with open(paths["csv"]) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("group,n,median") and len(lines) == 3 and lines[1].startswith("workers=0,5,3.0")
    with open(paths["markdown"]) as f:
        assert "| workers=4 | 3 | 20.0 |" in f.read()


@pytest.fixture(scope="module")
def offline_study(tmp_path_factory, profile_run):
    """Real offline runs: bench workers 0 once and workers 1 twice, plus a copy of the profile run.

    The bench runs are this module's own: a run uuid can live in one server project only, and
    test_server_e2e pushes the shared bench run to another.
    """
    root = tmp_path_factory.mktemp("study")
    os.makedirs(root / "runs")
    shutil.copytree(os.path.join(profile_run["root"], "runs", profile_run["uuid"]), root / "runs" / profile_run["uuid"])
    for workers, repeat in ((0, 1), (1, 1), (1, 2)):
        proc = run_train(["--mode", "bench", "--bench-steps", "3", "--workers", str(workers), "--repeat", str(repeat),
                          *TINY], root)
        assert proc.returncode == 0, proc.stderr
    return root


def test_compare_cli_over_real_offline_runs(offline_study, tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), "--offline", str(offline_study),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "comparison.json") as f:
        result = json.load(f)
    assert [(g["group"], g["n"]) for g in result["groups"]] == [("workers=0", 1), ("workers=1", 2)]
    assert [r["why"] for r in result["left_out"]] == ["mode=profile: profiled runs are not throughput evidence"]
    assert all(r > 0 for g in result["groups"] for r in g["rates"])
    assert (tmp_path / "comparison.png").stat().st_size > 0


def test_compare_reads_runs_through_the_polyaxon_client(sandbox, offline_study, tmp_path):
    """Offline runs pushed to a real server, read back by compare.py -p through Polyaxon's client."""
    sandbox.cli("project", "create", "--name", "study")
    for uuid in os.listdir(offline_study / "runs"):
        sandbox.cli("ops", "push", "-uid", uuid, "--path", str(offline_study), "--reset-project", "-p", "study")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), "-p", "study", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=sandbox.env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "comparison.json") as f:
        result = json.load(f)
    assert [(g["group"], g["n"]) for g in result["groups"]] == [("workers=0", 1), ("workers=1", 2)]
    assert len(result["left_out"]) == 1
    assert result["groups"][0]["environment"]["gpu"] == ["cpu"], "run.json was downloaded from the server"


def test_compare_inside_a_polyaxon_run_logs_the_picture(sandbox, offline_study, tmp_path):
    """Run as a Polyaxon run, compare.py logs its PNG as an image event and its tables as artifacts."""
    sandbox.cli("project", "create", "--name", "cmp")
    client = sandbox.run_client("cmp")
    run = client.create(name="compare-study")
    env = sandbox.env(POLYAXON_RUN_INSTANCE=f"default.cmp.runs.{run.uuid}", POLYAXON_IS_MANAGED="true",
                      POLYAXON_CONTEXT_ROOT=sandbox.context)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), "--offline", str(offline_study),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    store = os.path.join(sandbox.store, run.uuid)
    images = [f for d, _, fs in os.walk(store) for f in fs if "comparison" in f and "image" in d]
    assert images, f"no image event under {store}: {list(os.walk(store))}"
    lineage = sandbox.cli("ops", "get", "-p", "cmp", "-uid", run.uuid, "-o", "json")
    assert run.uuid in lineage.stdout


def test_kernel_time_limit_is_reported_only_where_every_run_measured_it():
    """--cuda-graph bench runs carry their GPU time per step: the group shows how close it ran to it."""
    graphed = []
    for i, (rate, ms) in enumerate([(50_000.0, 2.5), (51_000.0, 2.4), (49_000.0, 2.6)]):
        r = rec(f"g{i}", 10 + i, rate, gpu_input=True, cuda_graph=True)
        limit = 128 / (ms / 1000)
        r["outputs"].update(gpu_ms_per_step=ms, gpu_limit_samples_per_sec=limit, share_of_gpu_limit=rate / limit)
        graphed.append(r)
    plain = [rec(f"p{i}", i, r) for i, r in enumerate([10_000.0, 11_000.0, 12_000.0])]
    result = compare.compare_records(plain + graphed)
    by_label = {g["group"]: g for g in result["groups"]}
    base, g = by_label["defaults"], by_label["cuda_graph=True, gpu_input=True"]
    assert base["gpu_limit"] is None
    assert g["gpu_limit"]["median_gpu_ms_per_step"] == 2.5
    assert g["gpu_limit"]["min_share"] == pytest.approx(min(50_000 * 2.5, 51_000 * 2.4, 49_000 * 2.6) / 128_000)
    assert "Kernel-time limit" in compare.markdown(result)


def test_a_profile_run_of_another_option_is_not_a_group_s_evidence():
    """Bench groups that differ only in workers; a profile run with workers=4 and fused SGD is not theirs."""
    records = fabricated() + [rec("p1", 30, None, mode="profile", workers=4, fused_sgd=True)]
    result = compare.compare_records(records)
    assert [g["evidence"] for g in result["groups"]] == [None, None]
