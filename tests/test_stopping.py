"""A stopped run is recorded and never vanishes; bad places and senseless sizes get one line before heavy work.

Real train.py processes receive real signals at a chosen moment: the test reads the process's stderr
until the line that marks the phase, then signals it.
"""

import glob
import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import (
    FEW,
    ROOT,
    TINY,
    alive,
    load_offline_run,
    offline_runs,
    polyaxon_env,
    popen_train,
    run_train,
    single_run,
)

from steplens import errors
from steplens.job import checks, data
from steplens.job.settings import parse_settings

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def children(pid):
    """The pids whose parent is pid (DataLoader workers), from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def signal_at(args, offline_root, marker, signum, slow_export=None, second=False, timeout=300, slow_sample_ms=None):
    """Start train.py (each trace export slowed by slow_export seconds, each sample by slow_sample_ms, if given),
    wait for a stderr line containing marker, send signum (twice if second); return (returncode, stderr, worker
    pids seen at the signal). A slow sample sleeps: it makes a phase last without the CPU work of a larger batch."""
    script = (
        [os.path.join(ROOT, "tests", "slow_export.py"), str(slow_export)]
        if slow_export
        else [os.path.join(ROOT, "train.py")]
    )
    proc = popen_train(
        [*script, *args], offline_root, **({data.SLOW_SAMPLE_ENV: str(slow_sample_ms)} if slow_sample_ms else {})
    )
    lines, deadline = [], time.time() + timeout
    try:
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                break
            assert time.time() < deadline, "the marker never came:\n" + "".join(lines)
        else:
            raise AssertionError(f"exited before {marker!r}:\n" + "".join(lines))
        workers = children(proc.pid)
        proc.send_signal(signum)
        if second:
            time.sleep(0.2)
            proc.send_signal(signum)
        rest = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(lines) + rest, workers


def assert_stopped(offline_root, returncode, stderr, signum, workers, phases):
    """run.json and the offline Polyaxon run say stopped; nothing half-written; no worker left; one line."""
    assert returncode == 128 + signum, stderr
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: stopped by " + signal.Signals(signum).name), last
    uuid, outputs = single_run(offline_root)
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    assert record["status"] == "stopped", record.get("error")
    assert record["stopped"]["signal"] == signal.Signals(signum).name
    assert record["stopped"]["phase"] in phases, record["stopped"]
    assert load_offline_run(offline_root, uuid)["status"] == "stopped"
    assert not glob.glob(os.path.join(str(offline_root), "**", ".partial-*"), recursive=True), "a temp file remains"
    for trace in glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz")):
        with gzip.open(trace, "rt") as f:
            assert json.load(f)["traceEvents"], f"{trace} does not open"
    time.sleep(0.5)
    assert not [w for w in workers if alive(w)], f"DataLoader workers survived: {workers}"
    return record


# name, extra args, stderr marker, phases the stop may land in, seconds each trace export is slowed, ms each sample
PHASES = [
    ("start-up", ["--mode", "bench"], "outputs:", {"start-up", "warm-up"}, None, None),
    ("warm-up", ["--mode", "bench", "--warmup-steps", "400", "--workers", "1"], "warm-up:", {"warm-up"}, None, None),
    # 100 ms a sample: the steps of cycle 2 that wait on the worker (it runs two batches ahead) and the cycle's export
    # take seconds of sleep, time for the signal on a busy machine
    ("profiled steps", ["--mode", "profile", "--workers", "1", *FEW], "profile: cycle 1", {"profile"}, None, 100),
    ("trace export", ["--mode", "profile", "--workers", "1", *FEW], "profile: writing a trace", {"profile"}, 3, None),
    # the bench window: test_polyaxon_lists_a_stopped_run
]


# SIGTERM at every phase; SIGINT (the same handler) where its DataLoader worker and the trace writer differ.
CASES = [("SIGTERM", *p) for p in PHASES] + [("SIGINT", *p) for p in PHASES if p[0] in ("warm-up", "trace export")]


@pytest.mark.parametrize("signame,phase,args,marker,phases,export,sample", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_signal_stops_the_run_cleanly(tmp_path, signame, phase, args, marker, phases, export, sample):
    """SIGTERM (Kubernetes, `polyaxon ops stop`) and SIGINT (Ctrl-C) at each phase: a recorded stop."""
    base = {"--device": "cpu", "--data": "synthetic", "--batch-size": "4", "--warmup-steps": "1"}
    for k in args[::2]:
        base.pop(k, None)
    argv = args + [x for kv in base.items() for x in kv]
    signum = SIGNALS[signame]
    code, stderr, workers = signal_at(argv, tmp_path, marker, signum, export, slow_sample_ms=sample)
    record = assert_stopped(tmp_path, code, stderr, signum, workers, phases)
    if phase == "trace export":
        # The trace being written when the signal came is completed, and nothing after it.
        traces = sorted(
            os.path.basename(p)
            for p in glob.glob(os.path.join(tmp_path, "runs", "*", "outputs", "traces", "*.pt.trace.json.gz"))
        )
        assert traces == ["trace-cycle1-steps2-4.pt.trace.json.gz"], traces
        assert record["stopped"]["steps_completed_in_phase"] == 5


def test_a_stop_during_the_unprofiled_timing_counts_its_completed_steps(tmp_path):
    """Profile mode times 10 unprofiled steps before the capture: a stop there says so and counts the steps
    that completed before the boundary that honoured it (at least the one in flight when the signal came)."""
    # 100 ms a sample: the block's 10 steps take seconds, far longer than the signal takes to arrive
    argv = ["--mode", "profile", *TINY]
    code, stderr, workers = signal_at(argv, tmp_path, "unprofiled steps", signal.SIGTERM, slow_sample_ms=100)
    record = assert_stopped(tmp_path, code, stderr, signal.SIGTERM, workers, {"unprofiled timing"})
    assert 1 <= record["stopped"]["steps_completed_in_phase"] <= 10, record["stopped"]
    assert ", 0 steps completed in it" not in stderr


def test_polyaxon_lists_a_stopped_run(tmp_path):
    """SIGTERM in the bench window: a recorded stop without a rate, and `polyaxon ops ls --offline` shows the
    stopped run (it skipped runs without offline data)."""
    code, stderr, workers = signal_at(
        ["--mode", "bench", "--bench-steps", "100000", "--workers", "1", *TINY],
        tmp_path,
        "bench: timing",
        signal.SIGTERM,
    )
    record = assert_stopped(tmp_path, code, stderr, signal.SIGTERM, workers, {"bench"})
    assert "results" not in record, "a stopped window must not report a rate"
    ls = subprocess.run(
        [sys.executable, "-m", "polyaxon", "ops", "ls", "--offline", "--path", str(tmp_path)],
        env=polyaxon_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert offline_runs(tmp_path)[0] in ls.stdout and "stopped" in ls.stdout, ls.stdout + ls.stderr


def test_a_second_signal_stops_at_once(tmp_path):
    """The first signal waits for the step boundary; a second one does not wait (and is still recorded)."""
    code, stderr, workers = signal_at(
        ["--mode", "profile", *TINY, *FEW],
        tmp_path,
        "profile: writing a trace",
        signal.SIGTERM,
        30,
        second=True,
        timeout=120,
    )
    record = assert_stopped(tmp_path, code, stderr, signal.SIGTERM, workers, {"profile"})
    assert record["stopped"]["steps_completed_in_phase"] == 4, "the second signal must not wait for the export"
    assert not glob.glob(os.path.join(str(tmp_path), "runs", "*", "outputs", "traces", "*.pt.trace.json.gz"))


# --------------------------------------------------------------------------- bad places and sizes


def assert_refused(proc, tmp_path, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("train.py: error:"), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "offline").exists(), "a Polyaxon run was left behind"


BAD_PLACES = [
    ("output dir on a file", lambda t: ["--output-dir", str(t / "file")], {}, ["--output-dir", "is a file"]),
    (
        "output dir not writable",
        lambda t: ["--output-dir", "/sys/profiler-companion-test"],
        {},
        ["--output-dir", "not a writable folder"],
    ),
    (
        "data dir on a file",
        lambda t: ["--data", "cifar10", "--data-dir", str(t / "file")],
        {},
        ["--data-dir", "is a file"],
    ),
    (
        "offline root on a file",
        lambda t: [],
        {"POLYAXON_OFFLINE_ROOT": "{file}"},
        ["POLYAXON_OFFLINE_ROOT", "is a file"],
    ),
    (
        "offline root not writable",
        lambda t: [],
        {"POLYAXON_OFFLINE_ROOT": "/sys/profiler-companion-test"},
        ["POLYAXON_OFFLINE_ROOT", "not a writable folder"],
    ),
]


@pytest.mark.parametrize("name,argv,env,words", BAD_PLACES, ids=[b[0] for b in BAD_PLACES])
def test_a_bad_output_place_is_refused_in_one_line(tmp_path, name, argv, env, words):
    (tmp_path / "file").write_text("not a folder")
    env = {k: v.format(file=tmp_path / "file") for k, v in env.items()}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "bench", *TINY, *argv(tmp_path)],
        cwd=ROOT,
        env={**polyaxon_env(tmp_path / "offline"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_refused(proc, tmp_path, *words)
    assert (tmp_path / "file").read_text() == "not a folder"


def test_folders_made_for_a_refused_run_are_removed(tmp_path):
    """A new --output-dir is made, then removed again when a later place is refused."""
    (tmp_path / "file").write_text("x")
    proc = run_train(
        ["--mode", "bench", *TINY, "--output-dir", str(tmp_path / "new" / "out")], tmp_path / "file", timeout=120
    )
    assert proc.returncode == 2 and "POLYAXON_OFFLINE_ROOT" in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists()


def test_far_too_many_workers_are_refused_before_torch(tmp_path):
    proc = run_train(["--mode", "bench", *TINY, "--workers", "1000"], tmp_path / "offline", timeout=120)
    assert_refused(proc, tmp_path, "--workers 1000", "CPU budget", "--force-workers")


def test_workers_above_the_budget_warn_and_are_recorded():
    budget = {"cpus": 2.0, "source": "affinity"}
    args = parse_settings(["--mode", "bench", "--workers", "3"])
    note = checks.check_workers(args, budget)
    assert "above the CPU budget (2 CPUs, affinity)" in note
    assert checks.check_workers(parse_settings(["--mode", "bench", "--workers", "2"]), budget) is None
    with pytest.raises(errors.UserError, match="at most 8"):
        checks.check_workers(parse_settings(["--mode", "bench", "--workers", "9"]), budget)
    forced = parse_settings(["--mode", "bench", "--workers", "9", "--force-workers"])
    assert "above the CPU budget" in checks.check_workers(forced, budget)


def test_a_batch_larger_than_the_synthetic_set_is_refused_before_torch(tmp_path):
    proc = run_train(
        ["--mode", "bench", "--device", "cpu", "--data", "synthetic", "--batch-size", "100000"],
        tmp_path / "offline",
        timeout=60,
    )
    assert_refused(proc, tmp_path, "--batch-size", "50000")


# --------------------------------------------------------------------------- the real data path


def write_cifar10_folder(root, per_batch=60, seed=0):
    """CIFAR-10's own Python format: five pickled training batches and batches.meta, small."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        batch = {
            "batch_label": f"training batch {i} of 5",
            "data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, size=per_batch).tolist(),
            "filenames": [f"img{i}_{j}.png" for j in range(per_batch)],
        }
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(
            {
                "label_names": [
                    "airplane",
                    "automobile",
                    "bird",
                    "cat",
                    "deer",
                    "dog",
                    "frog",
                    "horse",
                    "ship",
                    "truck",
                ],
                "num_vis": 3072,
                "num_cases_per_batch": per_batch,
            },
            f,
        )
    return folder


def test_a_cifar10_folder_is_read_as_torchvision_reads_it(tmp_path):
    """Channel-first rows become HWC images, labels kept, and the pixels are the file's."""
    folder = write_cifar10_folder(tmp_path, per_batch=7)
    images, targets = data.read_cifar10(str(folder))
    assert images.shape == (35, 32, 32, 3) and images.dtype == np.uint8 and len(targets) == 35
    with open(folder / "data_batch_2", "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    row = batch["data"][3]
    assert (images[7 + 3, 5, 6] == [row[5 * 32 + 6], row[1024 + 5 * 32 + 6], row[2048 + 5 * 32 + 6]]).all()
    assert targets[7 + 3] == batch["labels"][3]


def test_train_runs_on_a_cifar10_folder(tmp_path):
    """--data cifar10 on a folder in CIFAR-10's format: the loading code users run on a cluster, no network."""
    write_cifar10_folder(tmp_path / "data")
    proc = run_train(
        [
            "--mode",
            "bench",
            "--device",
            "cpu",
            "--data",
            "cifar10",
            "--data-dir",
            str(tmp_path / "data"),
            "--batch-size",
            "4",
            "--warmup-steps",
            "1",
            "--bench-steps",
            "2",
        ],
        tmp_path / "offline",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    _, outputs = single_run(tmp_path / "offline")
    with open(os.path.join(outputs, "run.json")) as f:
        record = json.load(f)
    assert record["data"]["name"] == "cifar10" and record["data"]["images"] == 300
    assert record["status"] == "succeeded"


def test_a_corrupt_cifar10_folder_names_the_folder_and_synthetic(tmp_path):
    folder = write_cifar10_folder(tmp_path / "data")
    with open(folder / "data_batch_3", "r+b") as f:
        f.truncate(100)
    proc = run_train(
        [
            "--mode",
            "bench",
            "--device",
            "cpu",
            "--data",
            "cifar10",
            "--data-dir",
            str(tmp_path / "data"),
            "--batch-size",
            "4",
            "--warmup-steps",
            "1",
            "--bench-steps",
            "2",
        ],
        tmp_path / "offline",
        timeout=300,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert str(folder) in last and "data_batch_3" in last and "--data synthetic" in last, last
    assert "Traceback" not in proc.stderr


def test_a_failed_download_removes_what_it_created(tmp_path, monkeypatch):
    """A download that fails half-way leaves neither the new folder nor a partial archive."""
    import urllib.error

    import torchvision.datasets

    def fail_after_writing(self):
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, "cifar-10-python.tar.gz"), "wb") as f:
            f.write(b"partial")
        raise urllib.error.URLError("fake: connection reset")

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", fail_after_writing)
    fresh = tmp_path / "fresh"
    with pytest.raises(errors.UserError, match="--data synthetic"):
        data.build_dataset(parse_settings(["--mode", "bench", "--data-dir", str(fresh)]), None)
    assert not fresh.exists()
    deep = tmp_path / "new" / "deeper" / "data"
    with pytest.raises(errors.UserError):
        data.build_dataset(parse_settings(["--mode", "bench", "--data-dir", str(deep)]), None)
    assert not (tmp_path / "new").exists(), "every folder made for the missing --data-dir must be removed"
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("the user's")
    with pytest.raises(errors.UserError):
        data.build_dataset(parse_settings(["--mode", "bench", "--data-dir", str(kept)]), None)
    assert os.listdir(kept) == ["mine.txt"]
