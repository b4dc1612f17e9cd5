"""steplens compare: paired statistics and the exact sign test on fabricated records, machines never pooled,
all-or-none outputs, real offline runs, and the Polyaxon-client path."""

import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY, load_offline_run, run_train

from steplens import stats
from steplens.job import machine
from steplens.project import compare, comparison, runs
from steplens.project.runs import CompareError

H200 = {"hostname": "vm", "gpu": "NVIDIA H200", "driver": "570.86.15", "torch": "2.11.0+cu130", "cuda": "13.0"}


def rec(uuid, index, rate, mode="bench", status="succeeded", env=None, minute=None, **settings):
    """A bench (or profile) run of repeat `index`, started at minute `minute` (default: the index)."""
    base = {
        "mode": mode,
        "workers": 0,
        "batch_size": 128,
        "data": "synthetic",
        "seed": 0,
        "bench_steps": 100,
        "warmup_steps": 20,
        "repeat": index,
    }
    base.update(settings)
    outputs = (
        {"samples_per_sec": rate}
        if mode == "bench"
        else {"profiled_step_ms": 90.0, "gpu_idle_share": 0.9, "input_gap_share": 0.8}
    )
    run_json = {"settings": base, "environment": {**H200, **(env or {})}, "cpu_budget": {"cpus": 4}}
    minute = index if minute is None else minute
    return runs.record_from(
        uuid, f"{mode}-{uuid}", f"2026-12-02T10:{minute // 60:02d}:{minute % 60:02d}", status, base, outputs, run_json
    )


def study(a_rates, b_rates, **b_settings):
    """Alternating repeats: A then B in each round, repeat index = the round."""
    a = [rec(f"a{i}", i, r, minute=2 * i) for i, r in enumerate(a_rates)]
    b = [rec(f"b{i}", i, r, minute=2 * i + 1, **({"workers": 4} | b_settings)) for i, r in enumerate(b_rates)]
    return a + b


def table(result, i=0):
    return result["tables"][i]


def groups(result, i=0):
    return {g["group"]: g for g in table(result, i)["groups"]}


# --------------------------------------------------------------------------- unpaired figures, pairs, verdicts


def test_groups_by_the_differing_setting_with_exact_unpaired_statistics():
    """Median, min, max and spread per group, the ratio of medians and its min/max bounds; repeat splits nothing."""
    result = comparison.compare_records(study([1.0, 2.0, 3.0, 4.0, 100.0], [10.0, 20.0, 30.0]))
    assert result["varying"] == ["workers"], "repeat must not split groups"
    a, b = table(result)["groups"]
    assert (a["group"], a["n"], a["median"], a["min"], a["max"]) == ("workers=0", 5, 3.0, 1.0, 100.0)
    assert a["spread"] == pytest.approx(99 / 3) and a["verdict"] == "baseline"
    assert (b["group"], b["median"], b["spread"]) == ("workers=4", 20.0, 1.0)
    assert b["ratio"] == pytest.approx(20 / 3)
    assert b["ratio_bounds"] == pytest.approx((10 / 100, 30 / 1))
    assert [p["ratio"] for p in b["pairs"]] == pytest.approx([10.0, 10.0, 10.0]), "pairs of the same repeat index"
    assert b["paired"] == pytest.approx({"n": 3, "median": 10.0, "min": 10.0, "max": 10.0})
    assert b["verdict"] == "too few repeats for a verdict (n=3 pairs, need 6)"
    assert "bootstrap" not in compare.markdown(result)


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_runs_per_group_give_no_verdict(n):
    """`make run` then `make compare`: one window each, 3% apart, is no evidence; nor is a threefold gap at n=2."""
    for gain in (1.03, 3.0):
        g = table(comparison.compare_records(study([100.0] * n, [100.0 * gain] * n)))["groups"][1]
        assert g["verdict"] == f"too few repeats for a verdict (n={n} pairs, need 6)"
        assert g["sign_test"]["p"] == pytest.approx(min(1.0, 2 / 2**n))


def test_exact_sign_test_p_values_and_the_pairs_it_needs():
    """p = 2 P(Binomial(n, 1/2) <= min(k, n - k)); the floor 2/2^n first drops below 0.05 at n = 6."""
    assert stats.pairs_needed() == 6
    assert stats.smallest_p(5) == pytest.approx(0.0625) and stats.smallest_p(6) == pytest.approx(0.03125)
    assert stats.sign_test([1.1] * 6)["p"] == pytest.approx(2 / 64)
    assert stats.sign_test([1.1] * 5 + [0.9])["p"] == pytest.approx(2 * 7 / 64)
    assert stats.sign_test([1.1, 0.9] * 4)["p"] == 1.0
    tied = stats.sign_test([1.0] + [1.1] * 6)
    assert (tied["pairs"], tied["untied"], tied["p"]) == (7, 6, pytest.approx(2 / 64))
    assert (
        stats.significance(stats.sign_test([1.0] * 2 + [1.1] * 5))
        == "too few repeats for a verdict (n=7 pairs, 5 untied, need 6)"
    )


def test_a_clear_difference_at_six_pairs_gets_a_verdict():
    """Six pairs all the same way: p = 1/32 < 0.05, "faster" (or "slower" the other way round)."""
    a = [100.0, 103.0, 98.0, 101.0, 99.0, 102.0]
    g = table(comparison.compare_records(study(a, [r * 1.5 for r in a])))["groups"][1]
    assert g["sign_test"]["p"] == pytest.approx(1 / 32) and g["verdict"] == "faster"
    g = table(comparison.compare_records(study(a, [r * 0.8 for r in a])))["groups"][1]
    assert g["sign_test"]["p"] < 0.05 and g["verdict"] == "slower"
    g = table(comparison.compare_records(study(a, [r * (1.2 if i % 2 else 0.9) for i, r in enumerate(a)])))["groups"][1]
    assert g["sign_test"]["p"] == 1.0 and g["verdict"] == "within the noise"


def test_identical_distributions_rarely_get_a_verdict():
    """Simulated studies with no true difference: no verdict below 6 pairs (the old overlap rule fired
    about 33% of the time at n=2), and at 6 or 8 pairs no more than the 5% the test allows."""
    rng = random.Random(0)
    for n, most in ((2, 0.0), (3, 0.0), (6, 0.05), (8, 0.05)):
        fired = 0
        for _ in range(1000):
            ratios = [rng.lognormvariate(0, 0.1) / rng.lognormvariate(0, 0.1) for _ in range(n)]
            fired += stats.significance(stats.sign_test(ratios)) in ("faster", "slower")
        assert fired / 1000 <= most, f"n={n}: {fired} of 1000 null studies got a verdict"


def test_pairs_follow_the_alternating_order_without_repeat_indices():
    """Without --repeat, a run pairs with its neighbour of the other group by start time, each run once."""
    runs = [
        rec("a0", 0, 100.0, minute=0, repeat=None),
        rec("b0", 0, 110.0, minute=1, workers=4, repeat=None),
        rec("b1", 0, 111.0, minute=2, workers=4, repeat=None),
        rec("a1", 0, 101.0, minute=3, repeat=None),
        rec("a2", 0, 102.0, minute=4, repeat=None),
        rec("a3", 0, 103.0, minute=5, repeat=None),
        rec("b2", 0, 112.0, minute=6, workers=4, repeat=None),
    ]
    g = table(comparison.compare_records(runs))["groups"][1]
    assert g["pairing"] == "start order"
    assert [(p["baseline"], p["run"]) for p in g["pairs"]] == [("a0", "b0"), ("a1", "b1"), ("a3", "b2")]


def test_a_slow_drift_unpaired_figures_call_noise_pairs_reveal():
    """The machine drifts by 10% per round; B is 3% faster than the A run beside it. The unpaired ranges
    overlap (bounds straddle 1), the pairs are all 1.03: "faster". Placing each B beside another A run
    (start order, no repeat index) pairs it differently, and the verdict goes."""
    a = [100.0 * 1.1**i for i in range(8)]
    g = table(comparison.compare_records(study(a, [r * 1.03 for r in a])))["groups"][1]
    assert g["ratio_bounds"][0] < 1 < g["ratio_bounds"][1], "unpaired, the drift hides the gain"
    assert g["paired"]["min"] == pytest.approx(1.03) and g["paired"]["max"] == pytest.approx(1.03)
    assert g["verdict"] == "faster" and g["sign_test"]["p"] == pytest.approx(2 / 256)
    # The same rates, but run B_i right after A_(7-i): the alternating order decides the pairs.
    runs = [rec(f"a{i}", i, r, minute=2 * i, repeat=None) for i, r in enumerate(a)] + [
        rec(f"b{i}", i, r * 1.03, minute=2 * (7 - i) + 1, workers=4, repeat=None) for i, r in enumerate(a)
    ]
    g = table(comparison.compare_records(runs))["groups"][1]
    assert [(p["baseline"], p["run"]) for p in g["pairs"]][:2] == [("a0", "b7"), ("a1", "b6")]
    assert g["verdict"] == "within the noise"


def test_pairs_by_repeat_index_whatever_the_start_order():
    a = [rec("a1", 1, 100.0, minute=0), rec("a2", 2, 100.0, minute=3)]
    b = [rec("b2", 2, 150.0, minute=1, workers=4), rec("b1", 1, 120.0, minute=2, workers=4)]
    g = table(comparison.compare_records(a + b))["groups"][1]
    assert g["pairing"] == "repeat index"
    assert sorted((p["baseline"], p["run"]) for p in g["pairs"]) == [("a1", "b1"), ("a2", "b2")]


# --------------------------------------------------------------------------- grouping and machines


def test_runs_that_differ_in_bench_or_warmup_steps_are_not_pooled():
    records = study([100.0, 101.0], [200.0, 201.0]) + [
        rec("c0", 5, 150.0, workers=4, bench_steps=300),
        rec("d0", 6, 150.0, workers=4, warmup_steps=5),
    ]
    result = comparison.compare_records(records)
    assert set(result["varying"]) == {"bench_steps", "warmup_steps", "workers"}
    assert {(g["group"], g["n"]) for g in table(result)["groups"]} == {
        ("bench_steps=100, warmup_steps=20, workers=0", 2),
        ("bench_steps=100, warmup_steps=20, workers=4", 2),
        ("bench_steps=300, warmup_steps=20, workers=4", 1),
        ("bench_steps=100, warmup_steps=5, workers=4", 1),
    }


def test_switched_off_and_absent_options_are_one_group():
    """An older run without the amp setting and a newer one with amp=off measured the same thing."""
    old = rec("a0", 0, 100.0)
    assert "amp" not in old["settings"]
    new = rec("a1", 1, 101.0, amp="off", fused_sgd=False)
    result = comparison.compare_records([old, new, rec("b0", 0, 200.0, workers=4), rec("b1", 1, 201.0, workers=4)])
    assert result["varying"] == ["workers"] and table(result)["groups"][0]["n"] == 2


def test_the_grouping_rule_is_the_one_docs_compare_states():
    """repeat, output_dir, data_dir, trace_format and profile_detail never split groups; any other setting
    does, --force-workers included, even though it changes nothing that is measured."""
    quiet = {"output_dir": "/x", "data_dir": "/d", "trace_format": "json", "profile_detail": "lean"}
    alike = study([100.0, 101.0], [200.0, 201.0]) + [rec("c0", 7, 102.0, **quiet)]
    assert comparison.compare_records(alike)["varying"] == ["workers"]
    forced = study([100.0, 101.0], [200.0, 201.0]) + [rec("c0", 7, 102.0, force_workers=True)]
    assert comparison.compare_records(forced)["varying"] == ["force_workers", "workers"]
    groups = open(os.path.join(ROOT, "docs", "COMPARE.md")).read().split("## Groups", 1)[1].split("\n## ", 1)[0]
    for name in ("repeat", "output_dir", "data_dir", "mode", "trace_format", "profile_detail", "force_workers"):
        assert f"`{name}`" in groups, f"docs/COMPARE.md's Groups section omits {name}"


@pytest.mark.parametrize(
    "env,named",
    [
        ({"hostname": "other"}, "host: other, vm"),
        ({"driver": "550.54.15"}, "driver: 550.54.15, 570.86.15"),
        ({"torch": "2.7.1+cu126"}, "torch: 2.11.0+cu130, 2.7.1+cu126"),
    ],
)
def test_runs_of_different_machines_are_refused_naming_what_differs(env, named):
    records = study([100.0, 101.0], [200.0, 201.0]) + [
        rec("c0", 0, 150.0, env=env),
        rec("c1", 1, 250.0, env=env, workers=4),
    ]
    with pytest.raises(runs.CompareError, match="different machines") as e:
        comparison.compare_records(records)
    assert named in str(e.value) and "--per-host" in str(e.value) and "\n" not in str(e.value)
    result = comparison.compare_records(records, per_host=True)
    assert len(result["tables"]) == 2
    assert sorted(sum(g["n"] for g in t["groups"]) for t in result["tables"]) == [2, 4]


ONE = {
    "machine_id": "3d1219c7c4c5404aaa1f6d2a48adfda4",
    "boot_id": "5171a097-051d-43fb-bfc8-dafd757006a4",
    "gpu_uuid": "GPU-8c1a2b3d-0000-1111-2222-333344445555",
}


def test_two_machines_sharing_a_hostname_are_compared_apart_and_never_paired():
    """Both record hostname "vm": the machine ids differ, so the runs are refused together, and with --per-host
    each machine gets its own table; no pair joins runs of the two machines."""
    other = {**ONE, "machine_id": "9f00aa11bb22cc33dd44ee55ff667788"}
    a = [rec(f"a{i}", i, 100.0 + i, minute=2 * i, env=ONE) for i in range(3)]
    b = [rec(f"b{i}", i, 200.0 + i, minute=2 * i + 1, env=other, workers=4) for i in range(3)]
    with pytest.raises(runs.CompareError, match="different machines") as e:
        comparison.compare_records(a + b)
    assert "machine_id: 3d1219c7c4c5404aaa1f6d2a48adfda4, 9f00aa11bb22cc33dd44ee55ff667788" in str(e.value)
    result = comparison.compare_records(a + b, per_host=True)
    assert len(result["tables"]) == 2
    for t in result["tables"]:
        assert [g["verdict"] for g in t["groups"]] == ["baseline"], "one machine's runs must not pair with the other's"
        assert t["machine_label"].startswith("host vm (machine ") and "GPU 8c1a2b3d" in t["machine_label"]
    assert {t["machine"]["machine_id"][:8] for t in result["tables"]} == {"3d1219c7", "9f00aa11"}


def three_machines(b_rates_per_machine, **b_settings):
    """Alternating pairs on three machines (boot ids differ): rates of machine k are k x 1000, so pooling the
    rates would mix machines, while each pair stays on its own machine."""
    out = []
    for k, b_rates in enumerate(b_rates_per_machine, start=1):
        env = {**ONE, "boot_id": f"boot-{k}"}
        for i, b in enumerate(b_rates):
            out.append(rec(f"a{k}{i}", i, 1000.0 * k, minute=100 * k + 2 * i, env=env))
            out.append(rec(f"b{k}{i}", i, 1000.0 * k * b, minute=100 * k + 2 * i + 1, env=env, **b_settings))
    return out


def test_pairs_of_several_machines_pool_into_one_sign_test_while_each_table_has_too_few():
    """3 machines with 1, 2 and 3 pairs, every lever run faster: no table reaches a verdict (need 6), the pooled
    test has 6 pairs all above 1 (p = 2/2^6) and says faster; no pair joins two machines."""
    result = comparison.compare_records(
        three_machines([[1.06], [1.06, 1.05], [1.02, 1.08, 1.01]], workers=4), per_host=True
    )
    assert [len(t["groups"][1]["pairs"]) for t in result["tables"]] == [1, 2, 3]
    assert all(t["groups"][1]["verdict"].startswith("too few repeats") for t in result["tables"])
    [pooled] = result["pooled"]
    assert (pooled["group"], pooled["baseline"]) == ("workers=4", "workers=0")
    assert [m["pairs"] for m in pooled["machines"]] == [1, 2, 3]
    assert sorted(pooled["ratios"]) == pytest.approx(sorted([1.06, 1.06, 1.05, 1.02, 1.08, 1.01]))
    assert pooled["sign_test"]["p"] == pytest.approx(2 / 2**6) and pooled["verdict"] == "faster"
    assert pooled["paired"]["median"] == pytest.approx((1.05 + 1.06) / 2)
    text = compare.markdown(result)
    assert "Pairs pooled across machines" in text and "| workers=4 | workers=0 | 1, 2, 3 (n=6) |" in text
    rows = [r for r in csv.DictReader(io.StringIO(compare.csv_text(result))) if r["machine"].startswith("pooled")]
    assert [(r["group"], r["pairs"], r["verdict"]) for r in rows] == [("workers=4", "6", "faster")]


def test_pooled_pairs_keep_a_slower_pair_and_a_worse_loss_and_skip_one_machine_groups():
    """One pair below 1 among 6: p = 2 x 7/64 > 0.05, within the noise; a group paired on one machine only is not
    pooled; a loss worse than the baseline on one machine marks the pooled verdict."""
    records = three_machines([[1.06], [1.06, 0.97], [1.02, 1.08, 1.01]], workers=4)
    result = comparison.compare_records(records, per_host=True)
    [pooled] = result["pooled"]
    assert pooled["sign_test"]["above_1"] == 5 and pooled["sign_test"]["below_1"] == 1
    assert pooled["sign_test"]["p"] == pytest.approx(2 * 7 / 64) and pooled["verdict"] == "within the noise"
    one = three_machines([[1.06, 1.05, 1.04]], workers=4)
    assert comparison.compare_records(one, per_host=True)["pooled"] == []
    h100 = three_machines([[1.06, 1.05], [1.04]], workers=4)
    for r in h100[4:]:
        r["machine"]["gpu"] = "NVIDIA H100 80GB HBM3"
    assert comparison.compare_records(h100, per_host=True)["pooled"] == [], "an H100's pairs never join an H200's"
    unknown = three_machines([[1.06, 1.05], [1.04]], workers=4)
    for r in unknown:
        r["machine"].update(gpu=None, torch=None)
    assert comparison.compare_records(unknown, per_host=True)["pooled"] == [], "machines of no known kind never pool"
    for r in records:
        worse = r["settings"]["workers"] == 4 and r["machine"]["boot_id"] == "boot-2"
        r["outputs"]["loss_final"] = 0.5 if worse else 0.1
    pooled = comparison.compare_records(records, per_host=True)["pooled"][0]
    assert pooled["verdict"].endswith("; " + comparison.LOSS_WORSE) and len(pooled["loss_worse_on"]) == 1


def test_runs_of_one_machine_id_pool_and_its_label_stays_short():
    result = comparison.compare_records(
        [rec(f"a{i}", i, 100.0, minute=2 * i, env=ONE) for i in range(6)]
        + [rec(f"b{i}", i, 110.0, minute=2 * i + 1, env=ONE, workers=4) for i in range(6)]
    )
    (t,) = result["tables"]
    assert groups(result)["workers=4"]["verdict"] == "faster"
    assert t["machine_label"] == (
        "host vm (machine id 3d1219c7, boot id 5171a097, GPU 8c1a2b3d): NVIDIA H200, "
        "driver 570.86.15, torch 2.11.0+cu130, CUDA 13.0, 4 CPUs"
    )


def test_runs_with_and_without_machine_ids_are_never_pooled_silently():
    """A run recorded before the ids (no machine_id) and a run with them: two machines as far as steplens compare can
    tell, named "not recorded"; older runs alone still compare on the hostname and the other facts."""
    old = study([100.0, 101.0], [200.0, 201.0])
    assert len(comparison.compare_records(old)["tables"]) == 1
    assert comparison.machine_label(comparison.machine_key(old[0])).startswith(
        "host vm (machine id not recorded, boot id not recorded, GPU not recorded)"
    )
    new = [rec("n0", 0, 100.0, env=ONE)]
    with pytest.raises(runs.CompareError, match="machine_id: 3d1219c7c4c5404aaa1f6d2a48adfda4, not recorded"):
        comparison.compare_records(old + new)


def test_machine_ids_are_outputs_among_the_comparable_facts_and_read_back(tmp_path):
    """machine.host_ids reads the ids from their files (an empty or uninitialized machine id is none); the outputs carry
    them as env_*, and steplens compare reads them from the outputs as from run.json."""
    (tmp_path / "etc").write_text("uninitialized\n")
    (tmp_path / "dbus").write_text("abc123\n")
    (tmp_path / "boot").write_text("b00t\n")
    assert machine.host_ids([str(tmp_path / "etc"), str(tmp_path / "dbus")], str(tmp_path / "boot")) == {
        "machine_id": "abc123",
        "boot_id": "b00t",
    }
    assert machine.host_ids([str(tmp_path / "absent")], str(tmp_path / "absent")) == {
        "machine_id": None,
        "boot_id": None,
    }
    import torch

    assert machine.gpu_uuid(torch.device("cpu")) is None
    facts = machine.comparable_facts({**H200, **ONE}, {"cpus": 4})
    assert (facts["env_machine_id"], facts["env_boot_id"], facts["env_gpu_uuid"]) == (
        ONE["machine_id"],
        ONE["boot_id"],
        ONE["gpu_uuid"],
    )
    from_outputs = runs.record_from(
        "u", "n", None, "succeeded", {"mode": "bench"}, {**facts, "samples_per_sec": 1.0}, None
    )
    assert comparison.machine_key(from_outputs) == comparison.machine_key(rec("r", 0, 1.0, env=ONE))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_uuid_is_the_one_nvidia_smi_names():
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True)
    assert machine.gpu_uuid(torch.device("cuda", 0)) in smi.stdout.split(), smi.stdout


def test_the_shared_sign_test_is_the_binomial_tail():
    """steplens compare's two-sided p from ranks.sign_test_p equals 2 P(X <= min(k, n - k)) counted exactly."""
    import math

    for n in range(0, 13):
        for k in range(n + 1):
            exact = min(1.0, 2 * sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n)
            assert stats.sign_test([1.1] * k + [0.9] * (n - k))["p"] == pytest.approx(exact, abs=1e-12), (n, k)


def test_baseline_choice_and_unknown_baseline():
    result = comparison.compare_records(study([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]), baseline="workers=4")
    first, second = table(result)["groups"]
    assert first["group"] == "workers=4" and second["ratio"] == pytest.approx(2 / 20)
    with pytest.raises(CompareError, match="none of the groups"):
        comparison.compare_records(study([1.0], [2.0]), baseline="workers=3")


def test_a_baseline_named_by_settings_survives_a_group_that_joins_later():
    """--baseline batch_size=128 names its group by settings: when runs that vary in another setting join, the
    labels grow ("batch_size=128, workers=0"), and the baseline is still the one group with batch 128; a
    setting that several groups share is refused, naming the groups."""
    runs = study([1.0, 2.0, 3.0], [10.0, 20.0, 30.0], batch_size=256)  # groups differ in workers and batch_size
    result = comparison.compare_records(runs, baseline="batch_size=128")
    first, second = table(result)["groups"]
    assert first["group"] == "batch_size=128, workers=0" and second["ratio"] == pytest.approx(20 / 2)
    result = comparison.compare_records(runs, baseline="workers=4, batch_size=256")  # not a label: settings
    assert table(result)["groups"][0]["group"] == "batch_size=256, workers=4"
    off = study([1.0, 2.0], [3.0, 4.0], compile="default")  # groups: workers=0 (compile off), workers=4 + compile
    assert table(comparison.compare_records(off, baseline="compile=off"))["groups"][0]["group"] == "workers=0"
    assert table(comparison.compare_records(off, baseline="compile=default"))["groups"][0]["group"].endswith(
        "workers=4"
    )
    with pytest.raises(CompareError, match="matches 2 groups .all their runs have batch_size=128."):
        comparison.compare_records(study([1.0], [2.0]), baseline="batch_size=128")
    with pytest.raises(CompareError, match="none of the groups"):
        comparison.compare_records(runs, baseline="batch_size=512")


# --------------------------------------------------------------------------- left out, figures beside the rates


def test_profile_failed_and_inputless_runs_are_left_out_and_named():
    records = study([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) + [
        rec("p0", 30, None, mode="profile"),
        rec("f0", 31, 5.0, status="failed"),
        runs.record_from(
            "e0",
            "bench-workers0",
            "2026-12-02T11:00:00",
            "failed",
            None,
            None,
            None,
            [{"type": "failed", "reason": "UserError", "message": "CIFAR-10 is not in ./data"}],
        ),
    ]
    result = comparison.compare_records(records)
    why = {r["uuid"]: r["why"] for r in result["left_out"]}
    assert set(why) == {"p0", "f0", "e0"}
    assert "profile run" in why["p0"] and why["f0"].startswith("status failed")
    assert why["e0"] == "never logged its inputs (status failed: UserError: CIFAR-10 is not in ./data)"
    assert sum(g["n"] for g in table(result)["groups"]) == 6
    assert table(result)["groups"][0]["evidence"]["uuid"] == "p0", "the matching profile run's evidence sits beside"
    assert table(result)["groups"][1]["evidence"] is None
    assert "No profile run of the same settings on this machine: workers=4." in compare.markdown(result)


def test_the_evidence_row_names_its_capture_and_the_profiler_s_distortion():
    """A lean profile run of the baseline's settings: its row says `lean`, the unprofiled step and the
    ratio; the CSV carries them too."""
    profile = rec("p0", 30, None, mode="profile", profile_detail="lean")
    profile["outputs"].update(unprofiled_step_ms=9.94, profiler_distortion=1.578, profiler_distortion_se=0.157)
    result = comparison.compare_records(study([1.0, 2.0], [3.0, 4.0]) + [profile])
    text = compare.markdown(result)
    row = next(line for line in text.splitlines() if line.startswith("| workers=0 | lean |"))
    assert "| 90.0 | 9.9 | 1.58x +/- 0.16 |" in row
    profile["outputs"].update(profiler_distortion=1.0441, profiler_distortion_se=0.0021)  # a graph replay's
    text = compare.markdown(comparison.compare_records(study([1.0, 2.0], [3.0, 4.0]) + [profile]))
    assert "| 1.044x +/- 0.002 |" in text, "an error below 0.005 keeps three decimals, not +/- 0.00"
    rows = list(csv.DictReader(io.StringIO(compare.csv_text(result))))
    assert rows[0]["profile_detail"] == "lean" and float(rows[0]["profiler_distortion"]) == 1.578
    assert rows[1]["profile_detail"] == "" and rows[1]["profiler_distortion"] == ""


def test_a_window_that_crossed_an_epoch_boundary_is_named_in_a_warning():
    records = study([1.0, 2.0], [3.0, 4.0])
    records[1]["window_restarts"] = 1
    result = comparison.compare_records(records)
    assert any(w.startswith("the timed window of a1 crossed an epoch boundary") for w in result["warnings"])
    assert not any("epoch" in w for w in comparison.compare_records(study([1.0, 2.0], [3.0, 4.0]))["warnings"])
    r = runs.record_from(
        "x",
        "bench-x",
        "2026-12-02T10:00:00",
        "succeeded",
        {"mode": "bench"},
        {"samples_per_sec": 1.0},
        {"results": {"epoch_restarts_in_window": 2}},
    )
    assert r["window_restarts"] == 2


def test_only_profile_runs_is_an_error():
    with pytest.raises(runs.CompareError, match="no succeeded bench runs"):
        comparison.compare_records([rec("p0", 0, None, mode="profile")])


def test_a_profile_run_of_another_option_is_not_a_group_s_evidence():
    records = study([1.0, 2.0], [3.0, 4.0]) + [rec("p1", 30, None, mode="profile", workers=4, fused_sgd=True)]
    assert [g["evidence"] for g in table(comparison.compare_records(records))["groups"]] == [None, None]


def graphed(i, rate, ms, old_names=False):
    r = rec(f"g{i}", i, rate, gpu_input=True, cuda_graph=True)
    allowed = 128 / (ms / 1000)
    names = (
        ("gpu_limit_samples_per_sec", "share_of_gpu_limit")
        if old_names
        else ("gpu_time_samples_per_sec", "gpu_bound_share")
    )
    outputs = {"gpu_ms_per_step": ms, names[0]: allowed, names[1]: rate / allowed}
    return runs.record_from(
        r["uuid"],
        r["name"],
        r["created_at"],
        "succeeded",
        r["settings"],
        {**r["outputs"], **outputs},
        {"settings": r["settings"], "environment": H200, "cpu_budget": {"cpus": 4}},
    )


@pytest.mark.parametrize("old_names", [False, True])
def test_gpu_bound_share_only_where_every_run_measured_it(old_names):
    """--cuda-graph runs: the window's rate over the rate the step's GPU time allows; older runs' outputs
    (share_of_gpu_limit, gpu_limit_samples_per_sec) are read under the new name."""
    runs = [
        graphed(i, rate, ms, old_names)
        for i, (rate, ms) in enumerate([(50_000.0, 2.5), (51_000.0, 2.4), (49_000.0, 2.6)])
    ]
    result = comparison.compare_records(runs + [rec(f"p{i}", i, r) for i, r in enumerate([1e4, 1.1e4, 1.2e4])])
    by_label = groups(result)
    assert by_label["defaults"]["gpu_bound"] is None
    b = by_label["cuda_graph=True, gpu_input=True"]["gpu_bound"]
    assert b["median_gpu_ms_per_step"] == 2.5
    assert b["min_share"] == pytest.approx(min(50_000 * 2.5, 51_000 * 2.4, 49_000 * 2.6) / 128_000)
    text = compare.markdown(result)
    assert "GPU-bound share" in text and "Kernel-time limit" not in text


def with_flops(r, tflops, mfu, peak=494.5, precision="tf32"):
    r["outputs"].update(
        flops_per_sample=3_328_997_376, model_tflops_per_sec=tflops, mfu=mfu, peak_tflops=peak, peak_precision=precision
    )
    return r


def test_tflops_and_mfu_per_group_and_absent_for_older_runs():
    a = [rec(f"a{i}", i, r) for i, r in enumerate([3000.0, 3100.0])]  # older runs: no FLOP outputs
    b = [
        with_flops(rec(f"b{i}", i, r, workers=4), r * 3.329e9 / 1e12, r * 3.329e9 / 1e12 / 494.5)
        for i, r in enumerate([11_000.0, 12_000.0])
    ]
    result = comparison.compare_records(a + b)
    c = groups(result)["workers=4"]["ceiling"]
    assert c["median_tflops"] == pytest.approx(11_500 * 3.329e9 / 1e12)
    assert c["median_mfu"] == pytest.approx(c["median_tflops"] / 494.5) and c["peaks"] == [(494.5, "tf32")]
    assert groups(result)["workers=0"]["ceiling"] is None
    text = compare.markdown(result)
    assert "TFLOP/s and MFU absent for workers=0: these runs predate" in text
    assert "| workers=4 | 3.329 | 38.28 | 0.077 | 494.5 (tf32) |" in text


def test_a_run_without_its_flop_count_makes_the_group_s_gflop_per_sample_absent_not_zero():
    runs = [
        with_flops(rec(f"a{i}", i, r), r * 3.329e9 / 1e12, r * 3.329e9 / 1e12 / 494.5)
        for i, r in enumerate([11_000.0, 12_000.0])
    ]
    del runs[1]["outputs"]["flops_per_sample"]
    result = comparison.compare_records(runs)
    assert table(result)["groups"][0]["ceiling"]["flops_per_sample"] is None
    assert "| all runs | n/a | 38.28 |" in compare.markdown(result)


def test_mfu_absent_on_the_cpu_says_why():
    runs = [
        with_flops(rec(f"a{i}", i, 10.0, env={"gpu": "cpu", "driver": None}), 0.03, None, None, None) for i in range(2)
    ]
    c = table(comparison.compare_records(runs))["groups"][0]["ceiling"]
    assert c["median_mfu"] is None and c["mfu_note"] == "CPU run: no GPU peak"


# --------------------------------------------------------------------------- files


def test_outputs_written_and_the_plot_is_a_png(tmp_path):
    paths, note = compare.write_outputs(
        comparison.compare_records(study([1.0, 2.0, 3.0, 4.0, 100.0], [10.0, 20.0, 30.0])), str(tmp_path)
    )
    assert note is None
    with open(paths["png"], "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(paths["png"]) > 5000
    with open(paths["csv"], newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0][:4] == ["machine", "group", "n", "median"] and len(rows) == 3
    assert rows[1][1:5] == ["workers=0", "5", "3.0", "1.0"]
    assert rows[2][compare.CSV_COLUMNS.index("verdict")] == "too few repeats for a verdict (n=3 pairs, need 6)"
    with open(paths["markdown"]) as f:
        assert "| workers=4 | 3 | 20.0 |" in f.read()
    assert sorted(os.listdir(tmp_path)) == ["comparison.csv", "comparison.json", "comparison.md", "comparison.png"]


@pytest.mark.parametrize("breaks", ["plot", "csv_text"])
def test_outputs_are_all_or_none(tmp_path, monkeypatch, breaks):
    """A failure while writing any output leaves the previous outputs exactly as they were, and no temp file."""
    result = comparison.compare_records(study([1.0, 2.0], [3.0, 4.0]))
    compare.write_outputs(result, str(tmp_path))
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(compare, breaks, fail)
    with pytest.raises(RuntimeError, match="disk full"):
        compare.write_outputs(comparison.compare_records(study([5.0, 6.0], [7.0, 8.0])), str(tmp_path))
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def write_offline_run(root, uuid, created_at, inputs, outputs, status="succeeded"):
    """A minimal offline run folder (run.plx.json only), as train.py leaves one."""
    os.makedirs(os.path.join(root, "runs", uuid), exist_ok=True)
    with open(os.path.join(root, "runs", uuid, "run.plx.json"), "w") as f:
        json.dump(
            {
                "uuid": uuid,
                "name": f"bench-{uuid}",
                "created_at": created_at,
                "status": status,
                "inputs": inputs,
                "outputs": outputs,
            },
            f,
        )


def fabricated_offline(root, hosts=("vm",)):
    for h, host in enumerate(hosts):
        for i in range(2):
            for w, workers in enumerate((0, 4)):
                facts = {
                    "env_host": host,
                    "env_gpu": "NVIDIA H200",
                    "env_driver": "570.86.15",
                    "env_torch": "2.11.0+cu130",
                    "env_cuda": "13.0",
                    "env_cpu_budget": 4,
                }
                write_offline_run(
                    root,
                    f"{host}{i}{w}",
                    f"2026-12-02T1{h}:0{i}:{w}0+00:00",
                    {"mode": "bench", "workers": workers, "repeat": i},
                    {"samples_per_sec": 1000.0 * (1 + 3 * w) + i, **facts},
                )


def run_compare(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "steplens", "compare", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_an_offline_folder_that_does_not_exist_is_named_so(tmp_path):
    """A mistyped --offline path is said not to exist, in one line, not to hold no runs."""
    proc = run_compare("--offline", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "nowhere does not exist" in lines[0] and "holds no offline runs" not in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_runs_of_two_hosts_in_one_line_and_splits_them_per_host(tmp_path):
    root = tmp_path / "offline"
    fabricated_offline(str(root), hosts=("gpu-a", "gpu-b"))
    proc = run_compare("--offline", str(root), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1 and not (tmp_path / "out").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "different machines (host: gpu-a, gpu-b)" in lines[0], proc.stderr
    proc = run_compare("--offline", str(root), "--out", str(tmp_path / "out"), "--per-host", "--baseline", "workers=0")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert text.count("Machine: host gpu-") == 2 and text.count("| workers=4 | 2 |") == 2


def test_without_matplotlib_the_tables_are_written_and_one_line_says_so(tmp_path):
    root = tmp_path / "offline"
    fabricated_offline(str(root))
    out = tmp_path / "out"
    out.mkdir()
    (out / "comparison.png").write_bytes(b"an older picture")
    code = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['steplens', 'compare', '--offline', {str(root)!r}, '--out', {str(out)!r}]; "
        "runpy.run_module('steplens', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("steplens compare: note:")]
    assert len(notes) == 1 and "needs matplotlib (pip install matplotlib)" in notes[0], proc.stderr
    assert sorted(os.listdir(out)) == ["comparison.csv", "comparison.json", "comparison.md"], (
        "the older picture no longer matches the tables"
    )


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def offline_study(tmp_path_factory, profile_run, bench_run):
    """Real offline runs: bench workers 0 once (a copy of the shared bench run) and workers 1 twice, plus a copy of
    the profile run. A run uuid lives in one server project only: only this module pushes the shared runs."""
    root = tmp_path_factory.mktemp("study")
    os.makedirs(root / "runs")
    for run in (profile_run, bench_run):
        shutil.copytree(os.path.join(run["root"], "runs", run["uuid"]), root / "runs" / run["uuid"])
    for repeat in (1, 2):
        proc = run_train(
            ["--mode", "bench", "--bench-steps", "3", "--workers", "1", "--repeat", str(repeat), *TINY], root
        )
        assert proc.returncode == 0, proc.stderr
    return root


def test_compare_cli_over_real_offline_runs(offline_study, tmp_path):
    proc = run_compare("--offline", str(offline_study), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "comparison.json") as f:
        result = json.load(f)
    t = result["tables"][0]
    assert [(g["group"], g["n"]) for g in t["groups"]] == [("workers=0", 1), ("workers=1", 2)]
    assert t["groups"][1]["verdict"] == "too few repeats for a verdict (n=1 pairs, need 6)"
    assert [r["why"] for r in result["left_out"]] == ["profile run: profiled steps are not throughput evidence"]
    assert all(r > 0 for g in t["groups"] for r in g["rates"])
    assert t["machine"]["gpu"] == "cpu" and t["machine"]["cpu_budget"] > 0
    assert all(g["ceiling"]["median_tflops"] > 0 and g["ceiling"]["median_mfu"] is None for g in t["groups"])
    assert (tmp_path / "comparison.png").stat().st_size > 0


def test_compare_reads_runs_through_the_polyaxon_client(sandbox, offline_study, bench_run, tmp_path):
    """Offline runs pushed to a real server (`polyaxon ops push`), the server shows their outputs, and steplens
    compare -p reads them back from the listing's outputs alone: train.py's env_* outputs make every run.json
    download unnecessary."""
    sandbox.cli("project", "create", "--name", "study")
    for uuid in os.listdir(offline_study / "runs"):
        push_run(sandbox, "study", uuid, offline_study)
    shown = sandbox.cli("ops", "get", "-p", "study", "-uid", bench_run["uuid"], "-o", "json").stdout
    pushed = json.loads(shown[shown.index("{") :])
    local = load_offline_run(bench_run["root"], bench_run["uuid"])
    assert pushed["outputs"]["samples_per_sec"] == pytest.approx(local["outputs"]["samples_per_sec"])
    assert pushed["status"] == "succeeded" and pushed["name"] == local["name"]
    proc = run_compare("-p", "study", "--out", str(tmp_path), env=sandbox.env())
    assert proc.returncode == 0, proc.stderr
    assert "no machine facts" not in proc.stderr, "no run.json download was needed"
    with open(tmp_path / "comparison.json") as f:
        result = json.load(f)
    t = result["tables"][0]
    assert [(g["group"], g["n"]) for g in t["groups"]] == [("workers=0", 1), ("workers=1", 2)]
    assert len(result["left_out"]) == 1
    assert t["machine"]["gpu"] == "cpu" and t["machine"]["host"], "the facts came from the runs' outputs"


def push_stored_runs(sandbox, project, uuids, root):
    """Stored H200 runs (results/h200/offline) copied under root and pushed to a new server project. A uuid lives in
    one server project only: each test pushes runs of its own."""
    for uuid in uuids:
        shutil.copytree(os.path.join(ROOT, "results", "h200", "offline", "runs", uuid), root / "runs" / uuid)
    sandbox.cli("project", "create", "--name", project)
    for uuid in uuids:
        push_run(sandbox, project, uuid, root)


def push_run(sandbox, project, uuid, root):
    """`polyaxon ops push` of one offline run under root, asked again until the server lists it."""
    for _ in range(3):  # a push the sandbox answered with 405 can still exit 0: check that the run arrived
        sandbox.cli("ops", "push", "-uid", uuid, "--path", str(root), "--reset-project", "-p", project)
        listed = sandbox.run_client(project).list(limit=100).results or []
        if uuid in {str(r.uuid).replace("-", "") for r in listed}:
            return
        time.sleep(2)
    raise AssertionError(f"run {uuid} never reached project {project} on the sandbox")


def test_compare_downloads_run_json_for_older_runs(sandbox, tmp_path):
    """Runs that predate the env_* outputs (the stored H200 study) get their facts from run.json."""
    old = ["1415924bea474f68bb553b3e2ea07a2a", "21df9af3083c46e69c64643299aaa60c"]  # workers 0 and 4, repeat 1
    push_stored_runs(sandbox, "old", old, tmp_path / "old")
    proc = run_compare("-p", "old", "--out", str(tmp_path / "out"), env=sandbox.env())
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "comparison.json") as f:
        t = json.load(f)["tables"][0]
    assert t["machine"]["gpu"] == "NVIDIA H200" and t["machine"]["torch"] == "2.11.0+cu130"
    assert [(g["group"], g["n"]) for g in t["groups"]] == [("workers=0", 1), ("workers=4", 1)]
    assert t["groups"][1]["ceiling"] is None, "older runs carry no FLOP count"


def test_compare_inside_a_polyaxon_run_logs_the_picture(sandbox, offline_study, tmp_path):
    """Run as a Polyaxon run, steplens compare logs its PNG as an image event and its tables as artifacts."""
    sandbox.cli("project", "create", "--name", "cmp")
    run, env = sandbox.managed_run("cmp", "compare-study")
    proc = run_compare("--offline", str(offline_study), "--out", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    store = os.path.join(sandbox.store, run.uuid)
    images = [f for d, _, fs in os.walk(store) for f in fs if "comparison" in f and "image" in d]
    assert images, f"no image event under {store}: {list(os.walk(store))}"
    # The tables as artifacts: the server's lineage of this run names each of them.
    lineage = sandbox.run_client("cmp", run.uuid).get_artifacts_lineage().results or []
    names = {a.name for a in lineage}
    assert {"comparison-markdown", "comparison-csv", "comparison-json"} <= names, names
    # Each one is where its lineage says, in the run's folder on the server's store.
    paths = [os.path.join(store, a.path) for a in lineage if a.name.startswith("comparison-")]
    assert all(os.path.isfile(p) for p in paths), (paths, list(os.walk(store)))


def test_the_lever_study_turns_its_order_each_round(tmp_path):
    """scripts/lever_study.sh with a stand-in Python that only logs its arguments: round 1 runs a b c, round 2
    b c a, round 3 c a b, then MORE rounds of the MORE_CONFIGS turn on; every job carries its round."""
    stub = tmp_path / "py"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    stub.chmod(0o755)
    env = {
        **os.environ,
        "PY": str(stub),
        "PIN": "",
        "PROFILE": "0",
        "CONFIGS": "--seed 1;--seed 2;--seed 3",
        "MORE_CONFIGS": "--seed 1;--seed 3",
    }
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "lever_study.sh"), str(tmp_path / "root"), "3", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    jobs = [(c.split("--seed ")[1].split()[0], c.split("--repeat ")[1].split()[0]) for c in calls if "train.py" in c]
    assert jobs == [
        ("1", "1"),
        ("2", "1"),
        ("3", "1"),
        ("2", "2"),
        ("3", "2"),
        ("1", "2"),
        ("3", "3"),
        ("1", "3"),
        ("2", "3"),
        ("3", "4"),
        ("1", "4"),
        ("1", "5"),
        ("3", "5"),
    ], jobs
    assert calls[-1].startswith("-m steplens compare --offline")


def test_groups_that_differ_in_two_settings_are_warned_about_and_one_setting_is_not():
    """B changes workers and batch size at once: a difference cannot be pinned on either, and the result says so;
    a study that changes workers alone carries no such warning."""
    two = comparison.compare_records(study([100.0] * 3, [200.0] * 3, batch_size=256))
    assert two["varying"] == ["batch_size", "workers"]
    assert any("more than one setting (batch_size, workers)" in w for w in two["warnings"]), two["warnings"]
    one = comparison.compare_records(study([100.0] * 3, [200.0] * 3))
    assert not any("more than one setting" in w for w in one["warnings"]), one["warnings"]
    assert "more than one setting" in compare.markdown(two), "the warning reaches the Markdown report"


def test_the_study_goes_on_past_a_failing_job_then_exits_1(tmp_path):
    """scripts/study.sh, which the README offers for testing one's own change, with a stand-in Python: the job
    of the second configuration fails in round 1; every other job still runs, alternating, then the comparison;
    the study exits 1 and names one failure."""
    stub = tmp_path / "py"
    stub.write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\ncase "$*" in *"--seed 2"*"--repeat 1"*) exit 3 ;; esac\nexit 0\n'
    )
    stub.chmod(0o755)
    env = {**os.environ, "PY": str(stub), "PIN": "", "CONFIGS": "--seed 1;--seed 2"}
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "study.sh"), str(tmp_path / "root"), "2", "--no-profile"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failure(s)" in proc.stderr, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    jobs = [(c.split("--seed ")[1].split()[0], c.split("--repeat ")[1].split()[0]) for c in calls if "train.py" in c]
    assert jobs == [("1", "1"), ("2", "1"), ("1", "2"), ("2", "2")], jobs
    assert calls[-1].startswith("-m steplens compare --offline"), calls[-1]


def test_the_host_side_stands_beside_each_rate_and_is_empty_where_not_logged():
    """CPUs used, throttled share, the workers' supply and host memory: medians where every run logged them, an
    empty cell (never 0) where a run did not; the supply from input_supply_ms in runs that logged only that."""
    records = study([100.0, 110.0], [300.0, 310.0])
    logged = [
        {"cpus_used": 1.5, "cpu_throttled_share": 0.0, "input_supply_per_sec": 40.0, "pss_peak_mb": 900.0},
        {"cpus_used": 1.7, "cpu_throttled_share": 0.1, "input_supply_ms": 20.0, "pss_peak_mb": 1100.0},
    ]
    for r, outputs in zip(records[2:], logged):
        r["outputs"].update(outputs)
    result = comparison.compare_records(records)
    g = groups(result)
    assert g["workers=4"]["host"] == {
        "cpus_used": 1.6,
        "cpu_throttled_share": 0.05,
        "input_supply_per_sec": 45.0,  # 40 and 1000 / 20 ms
        "pss_peak_mb": 1000.0,
        "shm_peak_mb": None,  # neither run logged it
        "batch_size": 128,
    }
    assert all(v is None for k, v in g["workers=0"]["host"].items() if k != "batch_size")
    text = compare.markdown(result)
    assert "| workers=4 | 305.0 | 2.4 | 1.60 | 0.05 | 45.0 | 1000 |  |" in text, text
    assert "| workers=0 | 105.0 | 0.8 |  |  |  |  |  |" in text, text
    assert "(the budget: 4 CPUs)" in text
    rows = {r["group"]: r for r in csv.DictReader(io.StringIO(compare.csv_text(result)))}
    assert rows["workers=4"]["cpus_used"] == "1.6" and rows["workers=4"]["input_supply_per_sec"] == "45.0"
    assert rows["workers=4"]["shm_peak_mb"] == "" and rows["workers=0"]["cpus_used"] == ""
    by_group = {x["group"]: x for x in json.loads(compare.json_text(result))["tables"][0]["groups"]}
    assert by_group["workers=4"]["host"]["pss_peak_mb"] == 1000.0 and by_group["workers=0"]["host"]["cpus_used"] is None
