import glob
import json
import os
import statistics
import subprocess
import sys
import urllib.error

import pytest
import torch
from conftest import FEW, ROOT, TINY, load_offline_run, polyaxon_env, run_train, shared_offline_run

import train
from steplens import atomic, errors, scopes
from steplens.job import data, machine, runrecord
from steplens.job.settings import parse_settings
from steplens.trace import reader


def read_json(path):
    with open(path) as f:
        return json.load(f)


def test_model_is_the_cifar_resnet18_variant():
    """3x3 stride-1 first conv without bias, no max-pool, 10 outputs, 11,173,962 parameters."""
    model = train.build_model()
    conv = model.conv1
    assert (conv.kernel_size, conv.stride, conv.padding, conv.bias) == ((3, 3), (1, 1), (1, 1), None)
    assert isinstance(model.maxpool, torch.nn.Identity)
    assert model.fc.out_features == 10
    assert sum(p.numel() for p in model.parameters()) == 11_173_962
    with torch.no_grad():
        assert model.eval()(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_four_scopes_in_each_profiled_step_in_order(profile_run):
    """Every ProfilerStep of a real CPU trace holds the four scopes once each, in the tutorial's order."""
    traces = glob.glob(os.path.join(profile_run["outputs"], "traces", "*.pt.trace.json.gz"))
    assert traces
    for trace in traces:
        events = [e for e in reader.load_events(trace) if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        assert len(steps) == 3, f"{trace}: {len(steps)} active steps, expected 3"
        for st in steps:
            s0, s1 = st["ts"], st["ts"] + st["dur"]
            inside = sorted(
                (e for e in events if e["name"] in scopes.SCOPES and s0 <= e["ts"] < s1), key=lambda e: e["ts"]
            )
            assert [e["name"] for e in inside] == list(scopes.SCOPES), f"{st['name']}: {[e['name'] for e in inside]}"
            for a, b in zip(inside, inside[1:]):
                assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, f"{a['name']} overlaps {b['name']}"
            assert inside[-1]["ts"] + inside[-1]["dur"] <= s1 + 1e-3, "a scope ends after its step"


def test_profile_writes_two_traces_tables_evidence_and_run_json(profile_run):
    """Two distinctly named traces, the self-CPU tables, evidence files and a complete run.json."""
    out = profile_run["outputs"]
    traces = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "traces", "*.pt.trace.json.gz")))
    assert traces == ["trace-cycle1-steps2-4.pt.trace.json.gz", "trace-cycle2-steps7-9.pt.trace.json.gz"]
    for n in (1, 2):
        with open(os.path.join(out, "operators", f"cycle{n}-by-self-cpu.txt")) as f:
            table = f.read()
        assert "Self CPU" in table and "aten::" in table
        assert os.path.exists(os.path.join(out, "traces", f"trace-cycle{n}-steps{5 * n - 3}-{5 * n - 1}.evidence.json"))
    record = read_json(os.path.join(out, "run.json"))
    assert record["status"] == "succeeded"
    for key in ("environment", "settings", "input_transform", "data", "cpu_budget", "torch_threads", "results"):
        assert record.get(key) is not None, f"run.json lacks {key}"
    env = record["environment"]
    assert env["gpu"] == "cpu" and env["torch"] == torch.__version__ and env["polyaxon"]
    assert record["settings"]["seed"] == 0 and record["settings"]["mode"] == "profile"
    assert record["data"]["name"] == "synthetic"
    assert "RandomCrop(size=(32, 32), padding=4)" in record["input_transform"]
    results = record["results"]
    assert results["gpu_tracks"] is False and "CPU-only" in results["note"]
    assert results["activities"] == ["CPU"]
    assert [c["profiler_steps"] for c in results["cycles"]] == [[2, 4], [7, 9]]
    assert not glob.glob(os.path.join(out, "**", ".partial-*"), recursive=True), "a temp file was left behind"
    assert "profiling the CPU alone" in profile_run["proc"].stderr


def test_profile_outputs_reach_polyaxon(profile_run):
    """The offline run carries the headline trace figures as outputs and the files as lineage."""
    run = load_offline_run(profile_run["root"], profile_run["uuid"])
    assert run["status"] == "succeeded"
    assert run["outputs"]["profiled_step_ms"] > 0
    out = run["outputs"]
    assert out["profiler_distortion"] == pytest.approx(out["profiled_step_ms"] / out["unprofiled_step_ms"])
    lineage = read_json(os.path.join(profile_run["root"], "runs", profile_run["uuid"], "lineages.plx.json"))
    names = {a["name"] for a in lineage}
    assert {"run-json", "packages", "trace-cycle1", "trace-cycle2"} <= names, names


def test_profile_measures_the_profiler_s_distortion_and_its_pauses(profile_run):
    """Unprofiled steps timed in the same process before the capture; every pause between profiled steps
    timed; the ratio and the dumps stated in run.json and in each cycle's evidence."""
    results = read_json(os.path.join(profile_run["outputs"], "run.json"))["results"]
    assert results["unprofiled"]["steps"] == scopes.UNPROFILED_STEPS and results["unprofiled"]["seconds"] > 0
    assert len(results["pauses_s"]) == scopes.PROFILE_STEPS and all(p >= 0 for p in results["pauses_s"])
    ev = results["evidence"]
    each = results["unprofiled"]["step_ms_each"]
    assert len(each) == scopes.PROFILE_STEPS and all(v > 0 for v in each)
    after = results["unprofiled_after"]["step_ms_each"]
    assert len(after) == scopes.PROFILE_STEPS
    # the CPU does not run ahead of a device: every step before and after the capture counts, pooled
    assert ev["unprofiled_step_ms"] == pytest.approx(statistics.fmean(each + after))
    assert len(results["steps_s"]) == len(results["inputs_s"]) == scopes.PROFILE_STEPS
    assert all(0 <= w <= t for w, t in zip(results["inputs_s"], results["steps_s"])), "a wait is part of its step"
    assert ev["profiler_distortion"] == pytest.approx(ev["profiled_step_ms"] / ev["unprofiled_step_ms"])
    assert results["profile_detail"] == "full" and results["options"]["with_stack"] is True
    assert [c["dump_before_step"] for c in results["cycles"]] == [5, 10]
    assert ev["headline_cycles"] == [1, 2], "workers=0: no queue for a pause to refill"
    for c in results["cycles"]:
        with open(c["evidence_txt"]) as f:
            text = f.read()
        assert "the profiler's cost (--profile-detail full)" in text and "profiler_distortion" in text
        # each cycle's file repeats the run's pooled figure: it says so, naming the cycles it pools
        assert "for the whole run (cycle(s) 1, 2, not this cycle alone)" in text
        assert read_json(c["evidence_json"])["capture"]["dumps"] == [
            {"cycle": d["cycle"], "seconds": d["dump_seconds"], "before_step": d["dump_before_step"]}
            for d in results["cycles"]
        ]
        assert ("after cycle 1's trace was written" in text) == (c["cycle"] == 2)


@pytest.fixture(scope="module")
def lean_profile_run(tmp_path_factory):
    """One --profile-detail lean profile run, made once for the tests below whichever worker runs them."""
    return shared_offline_run(
        tmp_path_factory,
        "offline-lean-profile",
        lambda root: run_train(["--mode", "profile", "--profile-detail", "lean", *TINY, *FEW], root),
    )


def test_lean_profile_records_no_shapes_memory_or_stacks(lean_profile_run):
    """--profile-detail lean: no Python-function slices, no input shapes, no memory events in the trace."""
    outputs = lean_profile_run["outputs"]
    results = read_json(os.path.join(outputs, "run.json"))["results"]
    assert results["profile_detail"] == "lean" and not any(results["options"].values())
    trace = sorted(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz")))[0]
    events = reader.load_events(trace)
    assert not [e for e in events if e.get("cat") == "python_function"]
    assert not [e for e in events if e.get("cat") == "cpu_op" and "Input Dims" in (e.get("args") or {})]
    assert not [e for e in events if e.get("name") == "[memory]"]
    assert [e for e in events if e.get("cat") == "cpu_op"], "operators are still recorded"
    assert results["evidence"]["unprofiled_step_ms"] > 0


def test_unprofiled_steps_sets_both_blocks_and_the_evidence_says_so(lean_profile_run):
    """--unprofiled-steps 4: four steps timed on each side of the capture, each timed alone, the slow-down read
    against those eight; the evidence names the blocks' sizes, and the flag reaches Polyaxon's inputs."""
    outputs = lean_profile_run["outputs"]
    record = read_json(os.path.join(outputs, "run.json"))
    results = record["results"]
    assert record["settings"]["unprofiled_steps"] == 4
    for block in (results["unprofiled"], results["unprofiled_after"]):
        assert block["steps"] == 4 and len(block["step_ms_each"]) == 4
    each = results["unprofiled"]["step_ms_each"] + results["unprofiled_after"]["step_ms_each"]
    ev = results["evidence"]
    assert ev["unprofiled_step_ms"] == pytest.approx(statistics.fmean(each))
    assert ev["unprofiled_before_steps"] == ev["unprofiled_after_steps"] == 4
    with open(results["cycles"][0]["evidence_txt"]) as f:
        assert "4 steps in the same process just before the capture" in f.read()
    assert load_offline_run(lean_profile_run["root"], lean_profile_run["uuid"])["inputs"]["unprofiled_steps"] == 4


def test_bench_rate_matches_its_window(bench_run):
    """samples_per_sec is window steps x batch size / window seconds, and Polyaxon holds the same value."""
    record = read_json(os.path.join(bench_run["outputs"], "run.json"))
    r = record["results"]
    assert r["window_steps"] == 3 and r["window_samples"] == 12
    assert r["window_seconds"] > 0
    assert r["samples_per_sec"] == pytest.approx(3 * 4 / r["window_seconds"])
    run = load_offline_run(bench_run["root"], bench_run["uuid"])
    assert run["outputs"]["samples_per_sec"] == pytest.approx(r["samples_per_sec"])
    assert run["outputs"]["window_steps"] == 3
    assert run["inputs"]["workers"] == 0 and run["inputs"]["mode"] == "bench"


def test_polyaxon_cli_reads_the_offline_run(bench_run):
    """`polyaxon ops ls --offline` and `ops get --offline` show the local run with its outputs."""
    env = polyaxon_env(bench_run["root"])
    cli = [sys.executable, "-m", "polyaxon"]
    ls = subprocess.run(
        cli + ["ops", "ls", "--offline", "--path", str(bench_run["root"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ls.returncode == 0 and bench_run["uuid"] in ls.stdout, ls.stdout + ls.stderr
    get = subprocess.run(
        cli + ["ops", "get", "--offline", "-uid", bench_run["uuid"], "--path", str(bench_run["root"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert get.returncode == 0, get.stdout + get.stderr
    assert "samples_per_sec" in get.stdout and "succeeded" in get.stdout


BAD_FLAGS = [
    ([], "--mode"),
    (["--mode", "weird"], "--mode"),
    (["--mode", "bench", "--workers", "-1"], "--workers"),
    (["--mode", "bench", "--workers", "abc"], "--workers"),
    (["--mode", "bench", "--batch-size", "0"], "--batch-size"),
    (["--mode", "bench", "--bench-steps", "0"], "--bench-steps"),
    (["--mode", "bench", "--warmup-steps", "-2"], "--warmup-steps"),
    (["--mode", "bench", "--data", "imagenet"], "--data"),
    (["--mode", "bench", "--device", "tpu"], "--device"),
    (["--mode", "bench", "--lr", "-0.1"], "--lr"),
    (["--mode", "bench", "--momentum", "1.5"], "--momentum"),
    (["--mode", "bench", "--seed", "x"], "--seed"),
    (["--mode", "bench", "--trace-format", "zip"], "--trace-format"),
]


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[" ".join(a) or "no-mode" for a, _ in BAD_FLAGS])
def test_bad_flag_refused_in_one_line_before_heavy_work(tmp_path, argv, flag):
    """Exit 2, one line naming the flag, and nothing created: no data download, no Polyaxon run."""
    data_dir = tmp_path / "data"
    proc = run_train(
        argv + ["--data-dir", str(data_dir)] if "--data-dir" not in argv else argv, tmp_path / "offline", timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error:") and flag in lines[0], proc.stderr
    assert not data_dir.exists() and not (tmp_path / "offline").exists()


def test_bad_flags_never_import_torch():
    """Flags are checked before torch (and CUDA) is touched, through train.main as the job runs it: a bad flag
    costs one line and exit 2, not torch's load time."""
    code = (
        "import sys, train\n"
        "try:\n    train.main(['--mode', 'bench', '--workers', '-1'])\nexcept SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, f"not one line: {proc.stderr!r}"


def test_the_settings_module_never_imports_torch():
    """steplens/job/settings.py (every flag and its checks) imports no torch, so a bad flag costs no torch start-up."""
    code = (
        "import sys\nfrom steplens.job import settings\n"
        "settings.parse_settings(['--mode', 'bench', '--workers', '2', '--data', 'synthetic'])\n"
        "print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False"], proc.stdout + proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_an_error(tmp_path):
    """--device cuda on a CPU machine exits 2 in one line instead of running on the CPU."""
    proc = run_train(["--mode", "bench", "--device", "cuda", "--data", "synthetic"], tmp_path / "offline", timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0], proc.stderr
    assert not (tmp_path / "offline").exists(), "the offline root made for the refused run was left behind"


def test_failed_download_names_synthetic_and_fails_the_run(failed_download_run):
    """A CIFAR-10 download that fails exits 1 with a message naming --data synthetic; the run is failed, and
    the folders made for the missing --data-dir are gone."""
    proc, root = failed_download_run["proc"], failed_download_run["root"]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: CIFAR-10") and "--data synthetic" in last
    record = read_json(os.path.join(failed_download_run["outputs"], "run.json"))
    assert record["status"] == "failed" and "--data synthetic" in record["error"]
    assert load_offline_run(root, failed_download_run["uuid"])["status"] == "failed"
    assert not (root / "new").exists(), "the folders made for the missing --data-dir must be removed"


def test_download_error_is_reported_in_process(tmp_path, monkeypatch):
    """build_dataset turns a fake failing download into a UserError that names --data synthetic."""
    import torchvision.datasets

    def fail(self):
        raise urllib.error.URLError("fake: no network")

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", fail)
    args = parse_settings(["--mode", "bench", "--data-dir", str(tmp_path)])
    with pytest.raises(errors.UserError, match="--data synthetic"):
        data.build_dataset(args, data.build_transform())


def write_cgroup(root, files, own="0::/\n"):
    """A fake cgroup tree under root and a fake /proc/self/cgroup saying which cgroup the process is in."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc = root / "proc-cgroup"
    proc.write_text(own)
    return str(proc)


@pytest.mark.parametrize(
    "files,expected,source",
    [
        ({"cpu.max": "400000 100000\n"}, 4.0, "cgroup v2"),
        ({"cpu.max": "150000 100000\n"}, 1.5, "cgroup v2"),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0, "cgroup v1"),
    ],
)
def test_cpu_budget_reads_the_cgroup_quota(tmp_path, monkeypatch, files, expected, source):
    """A pod's quota wins over the node's cores that affinity shows (a 4-CPU pod on 64 cores reads 4)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    proc = write_cgroup(tmp_path, files)
    budget = machine.cpu_budget(cgroup_root=str(tmp_path), proc_cgroup=proc)
    assert budget["cpus"] == expected and budget["source"].startswith(source) and budget["affinity_cpus"] == 64


NESTED = [
    # v2: the pod's quota (2 CPUs) binds its container, which sets none, and beats the node slice's 8.
    (
        {
            "cpu.max": "max 100000\n",
            "kubepods/cpu.max": "800000 100000\n",
            "kubepods/pod1/cpu.max": "200000 100000\n",
            "kubepods/pod1/ctr/cpu.max": "max 100000\n",
        },
        "0::/kubepods/pod1/ctr\n",
        2.0,
        "kubepods/pod1/cpu.max",
    ),
    # v2: the container's own quota is the smaller one.
    (
        {"kubepods/pod1/cpu.max": "400000 100000\n", "kubepods/pod1/ctr/cpu.max": "150000 100000\n"},
        "0::/kubepods/pod1/ctr\n",
        1.5,
        "kubepods/pod1/ctr/cpu.max",
    ),
    # v2 seen from inside a container without a cgroup namespace: its path is absent under the mount; the root holds it.
    ({"cpu.max": "300000 100000\n"}, "0::/kubepods/pod1/ctr\n", 3.0, "cgroup v2"),
    # v1: the cpu controller's own path from /proc/self/cgroup, then its parents; -1 is no quota.
    (
        {
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "300000\n",
            "cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_period_us": "100000\n",
        },
        "12:memory:/kubepods/pod1/ctr\n4:cpu,cpuacct:/kubepods/pod1/ctr\n0::/\n",
        3.0,
        "kubepods/pod1",
    ),
    # v1: a container quota under a larger pod quota.
    (
        {
            "cpu/kubepods/cpu.cfs_quota_us": "600000\n",
            "cpu/kubepods/cpu.cfs_period_us": "100000\n",
            "cpu/kubepods/ctr/cpu.cfs_quota_us": "50000\n",
            "cpu/kubepods/ctr/cpu.cfs_period_us": "100000\n",
        },
        "4:cpu,cpuacct:/kubepods/ctr\n",
        0.5,
        "kubepods/ctr",
    ),
]


@pytest.mark.parametrize(
    "files,own,expected,where", NESTED, ids=["v2-pod", "v2-container", "v2-no-namespace", "v1-pod", "v1-container"]
)
def test_cpu_budget_walks_the_nested_cgroups_and_the_smallest_quota_wins(
    tmp_path, monkeypatch, files, own, expected, where
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    proc = write_cgroup(tmp_path, files, own)
    budget = machine.cpu_budget(cgroup_root=str(tmp_path), proc_cgroup=proc)
    assert budget["cpus"] == expected and budget["cgroup_quota_cpus"] == expected, budget
    assert where in budget["source"], budget
    assert min(q["cpus"] for q in budget["cgroup_quotas"]) == expected


def test_cpu_budget_without_quota_is_affinity(tmp_path, monkeypatch):
    """cpu.max 'max' (no quota) and taskset both fall back on affinity."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    proc = write_cgroup(tmp_path, {"cpu.max": "max 100000\n"})
    assert machine.cpu_budget(cgroup_root=str(tmp_path), proc_cgroup=proc)["cpus"] == 3
    proc = write_cgroup(tmp_path, {"cpu.max": "800000 100000\n"})
    budget = machine.cpu_budget(cgroup_root=str(tmp_path), proc_cgroup=proc)
    assert budget["cpus"] == 3 and budget["cgroup_quota_cpus"] == 8


@pytest.mark.parametrize(
    "text",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc 12.3.0\n",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)  "
        "Thu Jan 23\n",
    ],
)
def test_driver_version_from_the_kernel_module_file(tmp_path, text):
    (tmp_path / "version").write_text(text)
    assert machine.driver_version(str(tmp_path / "version"), nvidia_smi=str(tmp_path / "absent")) == "550.54.15"


def test_driver_version_from_nvidia_smi_else_none(tmp_path):
    """No /proc file: nvidia-smi answers; neither: None (a CPU machine)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 570.86.15\n")
    smi.chmod(0o755)
    assert machine.driver_version(str(tmp_path / "absent"), nvidia_smi=str(smi)) == "570.86.15"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n")
    assert machine.driver_version(str(tmp_path / "absent"), nvidia_smi=str(smi)) is None
    assert machine.driver_version(str(tmp_path / "absent"), nvidia_smi=str(tmp_path / "absent")) is None


def test_bench_run_logs_its_comparable_facts_flops_and_step_metrics(bench_run):
    """Polyaxon outputs: host, GPU, torch, CPU budget and FLOPs per sample (names no metric uses); the warm-up
    step times as a metric by step; on the CPU, TFLOP/s but no MFU, and run.json says why."""
    run = load_offline_run(bench_run["root"], bench_run["uuid"])
    record = read_json(os.path.join(bench_run["outputs"], "run.json"))
    out = run["outputs"]
    assert out["env_host"] == record["environment"]["hostname"] and out["env_gpu"] == "cpu"
    assert out["env_torch"] == torch.__version__ and out["env_cpu_budget"] == record["cpu_budget"]["cpus"]
    assert "env_driver" not in out and record["environment"]["driver"] is None
    assert out["flops_per_sample"] == record["flops"]["flops_per_sample"] == pytest.approx(3.33e9, rel=0.01)
    r = record["results"]
    assert out["model_tflops_per_sec"] == pytest.approx(r["flops_per_sample"] * r["samples_per_sec"] / 1e12)
    assert "mfu" not in out and r["ceiling"]["mfu"] is None and "CPU run" in r["ceiling"]["note"]
    assert len(record["warmup_step_seconds"]) == 1 and record["warmup_step_seconds"][0] > 0
    events = os.path.join(bench_run["root"], "runs", bench_run["uuid"], "events", "metric")
    assert sorted(os.listdir(events)) == ["warmup_step_seconds.plx", "window_loss.plx"]


def test_profile_run_logs_each_profiled_step_as_a_metric(profile_run):
    """The profiled step times per ProfilerStep number (2-4, 7-9), charted on the run's dashboard."""
    path = os.path.join(
        profile_run["root"], "runs", profile_run["uuid"], "events", "metric", "profiled_step_wall_ms.plx"
    )
    with open(path) as f:
        text = f.read()
    lines = text.strip().splitlines()  # Polyaxon's event file: "step|timestamp|metric", one line per step
    assert lines[0] == "step|timestamp|metric"
    steps = sorted(int(line.split("|")[0]) for line in lines[1:])
    assert all(float(line.split("|")[2]) > 0 for line in lines[1:])
    assert steps == [2, 3, 4, 7, 8, 9], text


def test_batches_restart_cleanly_at_epoch_end():
    """A data set of 2.5 batches gives full batches forever, counting its restarts."""
    numbers = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10))
    loader = torch.utils.data.DataLoader(numbers, batch_size=4, drop_last=True)
    batches = data.Batches(loader)
    got = [next(batches)[0].shape[0] for _ in range(5)]
    assert got == [4] * 5 and batches.epoch_restarts == 2


def test_an_epoch_boundary_inside_the_bench_window_is_said():
    """Non-persistent workers restart at each epoch: inside the timed window that is start-up, not throughput."""
    data = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10))
    plain = torch.utils.data.DataLoader(data, batch_size=4)
    workers = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
    kept = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    assert train.window_note(0, workers) is None
    assert "shut the 2 DataLoader workers down" in train.window_note(2, workers)
    assert "2 epoch boundaries" in train.window_note(2, workers)
    assert (
        train.window_note(1, kept)
        == train.window_note(1, plain)
        == train.window_note(1, None)
        == "the timed window crossed 1 epoch boundary (a new shuffle inside the window)"
    )


def test_batches_refuse_a_data_set_smaller_than_a_batch():
    numbers = torch.utils.data.TensorDataset(torch.arange(3.0))
    with pytest.raises(errors.UserError, match="--batch-size"):
        data.Batches(torch.utils.data.DataLoader(numbers, batch_size=4, drop_last=True))


def test_synthetic_data_goes_through_the_cifar_transforms():
    """Fixed images whatever the run's seed, and normalized 3x32x32 tensors out of the PIL chain."""
    a = data.SyntheticCIFAR10(data.build_transform(), size=16)
    b = data.SyntheticCIFAR10(data.build_transform(), size=16)
    assert (a.data == b.data).all() and a.targets == b.targets
    image, target = a[3]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and 0 <= target < 10
    assert image.min() < -1.0 and image.max() > 1.0, "the CIFAR-10 normalization was not applied"


def test_write_atomic_keeps_the_old_file_when_a_write_fails(tmp_path):
    path = tmp_path / "run.json"
    atomic.write_json_atomic(str(path), {"status": "running"})
    with pytest.raises(TypeError):
        atomic.write_atomic(str(path), 12345)  # neither text nor bytes: fails inside the write
    assert read_json(path) == {"status": "running"}
    assert os.listdir(tmp_path) == ["run.json"]


def test_package_inventory_lists_torch():
    inventory = machine.package_inventory().splitlines()
    assert any(line.lower().startswith("torch==") for line in inventory)


class FlakyTracking:
    """A stand-in for polyaxon.tracking whose log_outputs refuses the first `failures` calls."""

    def __init__(self, out_dir, failures):
        import types

        self.out_dir, self.failures, self.calls, self.ended = str(out_dir), failures, 0, False
        self.TRACKING_RUN = types.SimpleNamespace(run_uuid="u" * 32, owner="default", project="p")

    def get_outputs_path(self):
        return self.out_dir

    def log_file_ref(self, path, name):
        pass

    def log_outputs(self, async_req=True, **outputs):
        assert async_req is False, "the last outputs must be logged synchronously"
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("(405) Method Not Allowed")

    def end(self):
        self.ended = True


@pytest.mark.parametrize("failures,logged", [(2, True), (5, False)])
def test_final_outputs_are_asked_again_and_never_cost_the_run(tmp_path, monkeypatch, failures, logged):
    """A server that refuses the final outputs is asked three times; after that the run still ends, run.json
    says the outputs were not logged, and nothing raises."""
    monkeypatch.setattr(runrecord.time, "sleep", lambda s: None)
    tracking = FlakyTracking(tmp_path, failures)
    record = runrecord.RunRecord(tracking, {"mode": "bench"}, "bench")
    record.succeeded({"samples_per_sec": 1.0})
    saved = read_json(tmp_path / "run.json")
    assert tracking.calls == min(failures + 1, 3) and tracking.ended and saved["status"] == "succeeded"
    assert ("outputs_not_logged" not in saved) == logged


def assert_traces_nest_for_perfetto(outputs):
    """Every trace profile mode wrote imports whole in Perfetto before v57.1, and run.json says what was repaired."""
    from steplens.trace import nesting

    cycles = read_json(os.path.join(outputs, "run.json"))["results"]["cycles"]
    for c in cycles:
        assert nesting.violations(reader.load_events(c["trace"])) == 0, f"{c['trace']} has crossing slices"
        p = c["perfetto"]
        assert {"clipped", "clipped_max_us", "moved", "violations_before"} <= set(p), p
        assert p["moved"] == 0, "a CPU-only trace has no GPU events to move"
        assert (p["clipped"] == 0) == (p["clipped_max_us"] == 0), p
        with open(c["evidence_txt"]) as f:
            assert f"Perfetto: {p['clipped']} Python slices clipped" in f.read()
    return cycles


def test_full_profile_traces_nest_for_every_perfetto(profile_run):
    """with_stack's Python slices cross the scopes in the raw export: the written traces no longer do."""
    cycles = assert_traces_nest_for_perfetto(profile_run["outputs"])
    assert all(c["perfetto"]["violations_before"] > 0 and c["perfetto"]["clipped"] > 0 for c in cycles), cycles


def test_lean_profile_traces_nest_for_every_perfetto(lean_profile_run):
    """--profile-detail lean has no Python slices: nothing to clip, and every slice nests."""
    cycles = assert_traces_nest_for_perfetto(lean_profile_run["outputs"])
    assert all(c["perfetto"]["clipped"] == 0 for c in cycles)
