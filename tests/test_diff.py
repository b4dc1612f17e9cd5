"""steplens diff and steplens decide: names matched across runs, what changed per step, and the tutorial's three
outcomes, on hand-made traces and bench rows, then on stored NVIDIA H200 runs."""

import json
import os

import pytest
from test_delays import LOADER, Loop

from steplens.project import decide, diff

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_loose_names_drop_template_arguments_parameter_lists_and_triton_numbers():
    assert diff.loose_name("void gemm<float, 128>(int, float*)") == "void gemm<>()"
    assert diff.loose_name("void k<a<b>, c>()") == "void k<>()"
    assert diff.loose_name("triton_poi_fused_add_mul_3") == "triton_poi_fused_add_mul"
    assert diff.loose_name("triton_red_fused_sum_12") == "triton_red_fused_sum"
    assert diff.loose_name("aten::add") == "aten::add"


def test_names_match_exactly_then_loosely_and_the_rest_are_counted():
    before = {"aten::mm": [2, 10.0], "k<float>": [1, 5.0], "triton_poi_fused_add_0": [1, 3.0], "gone": [1, 1.0]}
    after = {"aten::mm": [2, 8.0], "k<half>": [1, 2.0], "triton_poi_fused_add_7": [1, 3.0], "new": [4, 4.0]}
    pairs, only_b, only_a = diff.match(before, after)
    assert sorted(p[0] for p in pairs) == ["aten::mm", "k<>", "triton_poi_fused_add"]
    assert only_b == ["gone"] and only_a == ["new"]


def side(names, steps=2):
    return {"steps": steps, "names": {"kernels": names, "operators": {}}}


def test_each_name_is_added_removed_called_more_or_less_or_faster_or_slower():
    before = side({"same": [2, 20.0], "fast": [2, 40.0], "slow": [2, 4.0], "fewer": [8, 8.0], "gone": [2, 6.0]})
    after = side({"same": [2, 20.2], "fast": [2, 10.0], "slow": [2, 8.0], "fewer": [2, 2.0], "new": [6, 60.0]})
    ch = diff.name_changes(before, after, "kernels")
    names = {
        k: [r["name"] for r in ch[k]] for k in ("added", "removed", "fewer calls", "more calls", "faster", "slower")
    }
    assert names == {
        "added": ["new"],
        "removed": ["gone"],
        "fewer calls": ["fewer"],
        "more calls": [],
        "faster": ["fast"],
        "slower": ["slow"],
    }, "a 1% change ('same') is no change"
    fast = ch["faster"][0]
    assert fast["before_us_per_call"] == 20.0 and fast["after_us_per_call"] == 5.0
    assert fast["change_ms_per_step"] == pytest.approx((5.0 - 20.0) / 1e3)
    assert ch["added"][0]["after_per_step"] == 3 and (ch["matched"], ch["only_before"], ch["only_after"]) == (4, 1, 1)


def loop(input_us):
    """Three 1000 µs steps: the loader for input_us, then a kernel that fills the rest."""
    lp = Loop()
    for n in range(3):
        t0 = n * 1000
        lp.step(n + 1, t0, t0 + 1000)
        lp.cpu(LOADER, t0, t0 + input_us)
        lp.kernel(t0 + input_us, t0 + input_us + 10, 1000 - input_us - 20)
    return lp


def write(lp, path):
    import json

    with open(path, "w") as f:
        json.dump({"traceEvents": lp.events}, f)
    return str(path)


def test_diff_of_two_loops_names_the_delay_that_shrank_and_where_the_step_went(tmp_path):
    before = diff.read_side(write(loop(700), tmp_path / "a.pt.trace.json"))
    after = diff.read_side(write(loop(100), tmp_path / "b.pt.trace.json"))
    d = diff.diff(before, after)
    assert d["delays"]["input"]["change_ms"] == pytest.approx(-0.6)
    assert d["delays"]["compute"]["change_ms"] == pytest.approx(0.6)
    assert sum(r["after_share"] for r in d["delays"].values()) == pytest.approx(1.0)
    assert d["summary"].startswith("input wait shrank by 0.60 ms a step")
    assert (
        "the step now goes to GPU compute 88% (was 28%)" in d["summary"] and "the step kept its length" in d["summary"]
    )
    text = diff.format_diff(d)
    assert "verdict before: The GPU idles" in text and "verdict after:  GPU compute holds the step" in text
    assert "host: n/a (no CPU use or host memory beside these traces" in text, "no .evidence.json beside them"


def test_diff_refuses_a_missing_side_in_one_line(tmp_path, capsys):
    assert diff.main([str(tmp_path / "nope.json"), str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or folder" in err


def bench_row(ratios, verdict):
    above = sum(r > 1 for r in ratios)
    from steplens.stats import sign_test

    test = sign_test(ratios)
    assert (test["above_1"], test["below_1"]) == (above, sum(r < 1 for r in ratios)), "ties are dropped"
    return {"sign_test": test, "verdict": verdict, "paired": {"median": sorted(ratios)[len(ratios) // 2]}, "ratio": 1}


def sided(input_ms, step_ms=10.0, stage="waiting for input", share=0.5):
    return {"delays_ms": {"input": input_ms}, "step_ms": step_ms, "verdict": {"stage": stage, "share": share}}


HOST = {
    "cpus_used": 3.98,
    "cpu_throttled_share": 0.12,
    "cpu_sentence": "the job used 3.98 of its 4 CPUs",
    "input_transport_ms": 1.5,
    "input_make_ms": 20.0,
    "workers_pss_mb": 900.0,
    "shm_peak_mb": 30.0,
}


def test_faster_with_shorter_gaps_supports_the_change():
    d = decide.decide(sided(6.0), sided(0.5, 4.0, "GPU compute", 0.8), bench_row([1.5] * 6, "faster"), HOST)
    assert d["outcome"] == "supports" and d["sentence"].startswith("The evidence supports the change")


def test_gaps_gone_without_a_gain_name_the_stage_that_now_holds_the_step():
    ratios = [1.01, 0.99, 1.02, 0.98, 1.0, 1.01]
    d = decide.decide(
        sided(6.0), sided(0.5, 10.0, "host-side launch overhead", 0.6), bench_row(ratios, "within the noise"), HOST
    )
    assert d["outcome"] == "another stage"
    assert "after the change, host-side launch overhead holds the step (60%)" in d["sentence"]
    assert d["more_pairs"] is not None and d["more_pairs"] > 0


def test_a_slower_change_names_the_cpu_and_transport_figures():
    d = decide.decide(sided(6.0), sided(5.0), bench_row([0.8] * 6, "slower"), HOST)
    assert d["outcome"] == "slower"
    for said in ("the job used 3.98 of its 4 CPUs", "throttled 12.0%", "travels 1.50 ms", "900 MB PSS", "30 MB"):
        assert said in d["sentence"], said


def test_too_few_pairs_cannot_decide_and_say_how_many_more():
    row = bench_row([1.5] * 5, "too few repeats for a verdict (n=5 pairs, need 6)")
    d = decide.decide(sided(6.0), sided(0.5), row, HOST)
    assert d["outcome"] == "undecided" and d["more_pairs"] == 1 and "cannot decide yet" in d["sentence"]


def test_more_pairs_counts_the_pairs_a_mixed_sign_test_still_needs():
    from steplens.stats import sign_test

    assert decide.more_pairs(sign_test([1.1] * 6)) is None
    # 4 of 6 above 1: 10 of 12 is the first split below 0.05 (p 0.039; 9 of 11 is 0.065)
    assert decide.more_pairs(sign_test([1.1] * 4 + [0.9] * 2)) == 6
    assert decide.more_pairs(sign_test([])) == 6


def test_a_cpu_only_pair_is_undecided_and_says_more_pairs_cannot_help():
    """CPU-only traces have no input-wait figure (it is the GPU's idle): the reason names the CPU-only side, not lost
    GPU records, and asks for no more pairs."""
    cpu = {**sided(None), "evidences": [{"has_gpu": False}]}
    d = decide.decide(cpu, {**sided(None), "evidences": [{"has_gpu": False}]}, bench_row([1.2] * 6, "faster"), HOST)
    assert d["outcome"] == "undecided" and d["more_pairs"] is None
    assert d["reason"].startswith("the before and after traces are CPU-only") and "lost" not in d["reason"]
    lost = decide.decide(sided(None), sided(1.0), bench_row([1.2] * 6, "faster"), HOST)
    assert lost["outcome"] == "undecided" and "GPU records lost" in lost["reason"]


def test_faster_without_shorter_gaps_is_not_credited_to_the_input():
    d = decide.decide(sided(0.2), sided(0.2), bench_row([1.2] * 6, "faster"), HOST)
    assert d["outcome"] == "faster, other cause"


EAGER = os.path.join(ROOT, "results", "h200-reprofile", "eager", "runs")
SWEEP = os.path.join(ROOT, "results", "h100-workers-sweep")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The stored H100 workers sweep's runs (packed without their traces), unpacked, and the decisions made on the
    machine from those traces."""
    import tarfile

    root = tmp_path_factory.mktemp("sweep")
    with tarfile.open(os.path.join(SWEEP, "offline.tar.xz")) as tar:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.11.4 and later
        tar.extractall(root, **kw)
    with open(os.path.join(SWEEP, "decisions.json")) as f:
        decided = {(d["before"], d["after"]): d for d in json.load(f)}
    return os.path.join(root, "offline"), decided


@pytest.mark.parametrize(
    "pair, outcome", [((1, 2), "supports"), ((2, 4), "faster, other cause"), ((4, 8), "no change")]
)
def test_the_stored_h100_workers_sweep_is_decided_as_the_tutorial_would(sweep, pair, outcome):
    """Six alternating bench repeats a setting on an NVIDIA H100 machine, with the input wait its profile runs read:
    two workers against one is faster and closes the input gap; four against two is faster while the profiled gap
    was already closed, so the trace cannot credit the input; eight against four moves nothing."""
    from steplens.project.comparison import compare_records
    from steplens.project.runs import gather_offline

    root, decided = sweep
    records, _ = gather_offline(root)
    _, row = decide.group_row(compare_records(records, baseline=f"workers={pair[0]}"), f"workers={pair[1]}")
    gap = decided[pair]["input_gap_ms"]
    d = decide.decide(sided(gap["before"]), sided(gap["after"]), row, decide.transport(records, row["uuids"]))
    assert d["outcome"] == outcome == decided[pair]["outcome"] and d["bench"]["pairs"] == 6, d["sentence"]


def test_diff_reads_each_side_by_the_step_scope_it_is_given(tmp_path, capsys):
    lp = loop(700)
    lp.events = [dict(e, name="iteration") if e["name"].startswith("ProfilerStep#") else e for e in lp.events]
    path = write(lp, tmp_path / "a.pt.trace.json")
    assert diff.main([path, path, "--step-scope", "iteration", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["before"]["steps"] == 3 and d["delays"]["input"]["change_ms"] == 0


# --------------------------------------------------------------------------- profile runs on a Polyaxon server

WARMUP = os.path.join(ROOT, "results", "h200-warmup", "offline")
PROFILE_128, PROFILE_256 = "800f5572ae85436bac69a4f9b0656ec4", "ea5ded09fa184bd0963ecc4331c113e9"
BENCH_128, BENCH_256 = "9d66084c872246af9328c410c4b9a8d0", "d343c8b21df64b41bcb4daf2fc3f169c"  # repeat 1 each


@pytest.fixture(scope="module")
def server_study(sandbox, tmp_path_factory):
    """Stored NVIDIA H200 runs on the sandbox in project "decide": the profile runs of batch 128 and 256 and one
    bench run of each. A push sends a run's record; its files go to the server's store, as a job's sidecar puts
    them there."""
    import shutil

    from test_compare import push_run

    root = tmp_path_factory.mktemp("decide-runs")
    sandbox.cli("project", "create", "--name", "decide")
    for uuid in (PROFILE_128, PROFILE_256, BENCH_128, BENCH_256):
        shutil.copytree(os.path.join(WARMUP, "runs", uuid), root / "runs" / uuid)
        push_run(sandbox, "decide", uuid, root)
        shutil.copytree(root / "runs" / uuid / "outputs", os.path.join(sandbox.store, uuid, "outputs"))
    return sandbox


def run_steplens(*args, env):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "steplens", *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )


def test_diff_of_two_runs_on_a_server_equals_the_diff_of_their_folders(server_study):
    """`steplens diff -p PROJECT UUID UUID` downloads both runs' traces and gives the diff of the same runs'
    folders here, each side named by its run and its traces by their paths on the server."""
    proc = run_steplens("diff", "-p", "decide", PROFILE_128, PROFILE_256, "--json", env=server_study.env())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    local = diff.diff(*(diff.read_side(os.path.join(WARMUP, "runs", u)) for u in (PROFILE_128, PROFILE_256)))
    for side, uuid in (("before", PROFILE_128), ("after", PROFILE_256)):
        assert got[side].pop("path") == f"run {uuid} of project decide"
        assert got[side].pop("traces") == [
            "outputs/traces/trace-cycle1-steps2-4.pt.trace.json.gz",
            "outputs/traces/trace-cycle2-steps7-9.pt.trace.json.gz",
        ]
        local[side].pop("path"), local[side].pop("traces")
    assert got["before"]["host"] is not None or local["before"]["host"] is None, "the evidence files came along"
    assert got == json.loads(json.dumps(local)), "the server's copies read as the stored folders do"


def test_a_run_not_in_the_project_or_without_traces_stops_before_any_download(server_study, monkeypatch, tmp_path):
    """Every run is checked before a file is downloaded: an unknown uuid, or a bench run (no traces), is one
    error naming the run, and the valid run beside it was not downloaded; decide checks its bench groups first."""
    from polyaxon.client import RunClient

    from steplens.project import runs

    server_study.run_client("decide")  # the client's host: the sandbox
    downloads = []
    monkeypatch.setattr(RunClient, "download_artifact", lambda self, path, **kw: downloads.append(path))
    with pytest.raises(runs.CompareError, match=f"run {'0' * 32} is not in project default/decide"):
        runs.fetch_traces("default/decide", [PROFILE_128, "0" * 32], str(tmp_path))
    with pytest.raises(runs.CompareError, match=f"run {BENCH_128} of project default/decide has no traces"):
        runs.fetch_traces("default/decide", [PROFILE_128, BENCH_128], str(tmp_path))
    bad_label = ["-p", "default/decide", "--before", "batch_size=128", "--after", "batch_size=64"]
    assert decide.main([PROFILE_128, PROFILE_256, *bad_label]) == 1, "a bench group the project lacks"
    assert downloads == [] and os.listdir(tmp_path) == []
    proc = run_steplens("diff", "-p", "decide", PROFILE_128, BENCH_128, env=server_study.env())
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "has no traces" in proc.stderr, proc.stderr


def test_decide_inside_a_polyaxon_run_writes_the_decision_into_its_readme(server_study):
    """Run as a Polyaxon run, `steplens decide -p` on two profile runs' uuids sets the run's readme to the decision
    (its outcome line first), its description to the outcome, and logs decision.md and decision.json."""
    run, env = server_study.managed_run("decide", "decide-batch")
    args = ["-p", "decide", "--before", "batch_size=128", "--after", "batch_size=256", "--json"]
    proc = run_steplens("decide", PROFILE_128, PROFILE_256, *args, env=env)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert out["outcome"] == "undecided" and out["more_pairs"] == 5, out["sentence"]  # one pair of the six
    done = server_study.run_client("decide", run.uuid)
    done.refresh_data()
    readme = done.run_data.readme or ""
    assert readme.splitlines()[:3] == [
        "# The decision on batch_size=128 -> batch_size=256",
        "",
        f"**Decision:** {out['sentence']}",
    ], readme
    assert f"run {PROFILE_128} of project decide" in readme
    assert done.run_data.description == "batch_size=128 -> batch_size=256: the measurement cannot decide yet"
    names = {a.name for a in done.get_artifacts_lineage().results or []}
    assert {"decision-markdown", "decision-json"} <= names, (names, proc.stderr)
    with open(os.path.join(server_study.store, run.uuid, "outputs", "decision.json")) as f:
        assert json.load(f)["sentence"] == out["sentence"]


def test_decide_names_its_own_flag_when_the_before_label_is_no_group(tmp_path, capsys):
    """The label is checked against the bench groups before any trace is read, and the error says --before."""
    from steplens.project import decide

    missing = str(tmp_path / "none")
    assert decide.main([missing, missing, "--offline", WARMUP, "--before", "batch_size=3", "--after", "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("steplens decide: error: --before 'batch_size=3' is none of the groups"), err
    assert "\n" not in err


REPROFILE = os.path.join(ROOT, "results", "h200-reprofile", "eager", "runs")
W0_RUN, W4_RUN = (
    os.path.join(REPROFILE, u) for u in ("cd71033606ba42f6b997804deb9ae741", "4220df20529845b38750930bef04749a")
)


def test_decide_refuses_traces_whose_own_run_has_another_setting(tmp_path, capsys):
    """workers=0 and workers=4 profile runs given as --before workers=2 --after workers=8: their run.json says
    otherwise, so the decision would mix two settings' traces with two others' bench runs. One line, exit 1,
    before any trace is read; the labels the runs do have pass."""
    offline = os.path.join(ROOT, "results", "h200", "offline")
    code = decide.main([W0_RUN, W4_RUN, "--offline", offline, "--before", "workers=2", "--after", "workers=8"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err, err
    assert "has workers=0, not --before workers=2" in err and err.startswith(f"steplens decide: error: {W0_RUN}"), err
    decide.check_label(W0_RUN, "workers=0", "--before")
    decide.check_label(W4_RUN, "batch_size=128, workers=4, amp=off", "--after")  # off matches the run's "off"
    decide.check_label(W4_RUN, "workers=4, bench_steps=300", "--after")  # a bench-only setting is not checked
    with pytest.raises(decide.DecideError, match="has amp=off, not --after amp=bf16"):
        decide.check_label(W4_RUN, "amp=bf16", "--after")
    # The run's folder, its traces folder and one of its traces lead to the same run.json; a folder of no run, none.
    trace = os.path.join(W0_RUN, "outputs", "traces", "trace-cycle2-steps7-9.pt.trace.json.gz")
    found = {decide.side_record(p)[0] for p in (W0_RUN, os.path.dirname(trace), trace)}
    assert found == {os.path.join(W0_RUN, "outputs", "run.json")}
    assert decide.side_record(str(tmp_path)) is None
    decide.check_label(str(tmp_path), "workers=2", "--before")
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"workers": 0}}))  # a uuid is no file: not looked up
    assert decide.side_record(str(tmp_path / "0d8412e990df407a934d53950e5efccf")) is None
