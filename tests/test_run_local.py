"""scripts/run-local.sh (make run, make bench-alternating): bad settings refused in one line before any job."""

import os
import subprocess

import pytest
from conftest import ROOT


@pytest.mark.parametrize(
    "target,env,says",
    [
        ("alternating", {"REPEATS": "abc"}, "REPEATS must be a whole number"),
        ("alternating", {"REPEATS": "0"}, "REPEATS must be a whole number"),
        ("main", {"DATA": "bogus"}, "DATA must be cifar10 or synthetic"),
        ("alternating", {"WORKERS": "0 x"}, "WORKERS must be whole numbers"),
        ("main", {"BENCH_STEPS": "-1"}, "BENCH_STEPS must be a whole number"),
        ("nothing", {}, "unknown target 'nothing'"),
    ],
)
def test_bad_settings_stop_before_any_job(tmp_path, target, env, says):
    full = {**os.environ, "POLYAXON_OFFLINE_ROOT": str(tmp_path), "PY": "false", **env}
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "run-local.sh"), target],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and says in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_alternating_runs_six_repeats_by_default(tmp_path):
    """Without REPEATS, make bench-alternating runs 6 repeats per worker count: the fewest pairs for which
    steplens compare's sign test can give a verdict."""
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    # A stand-in interpreter: says "no CUDA" to the probe, records each train.py call, runs nothing.
    fake.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit 1\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "REPEATS"}
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "run-local.sh"), "alternating"],
        env={**env, "POLYAXON_OFFLINE_ROOT": str(tmp_path), "PY": str(fake), "DATA": "synthetic"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    repeats = sorted({c.split("--repeat ")[1].split()[0] for c in calls})
    assert repeats == [str(i) for i in range(1, 7)], calls
    assert len(calls) == 12, "6 repeats x workers 0 and 4"


def test_a_job_stopped_by_ctrl_c_stops_the_jobs_after_it(tmp_path):
    """make run's first job ends with 130 (Ctrl-C reached train.py): the script stops there, with that status and
    one line, instead of starting the next three jobs."""
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit 1\necho "$*" >> {log}\nexit 130\n')
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "run-local.sh"), "main"],
        env={**os.environ, "POLYAXON_OFFLINE_ROOT": str(tmp_path), "PY": str(fake), "DATA": "synthetic"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 130, proc.stderr
    assert len(log.read_text().splitlines()) == 1, "the jobs after the stopped one ran"
    assert proc.stderr.count("*** stopped (exit 130)") == 1 and "FAILED" not in proc.stderr, proc.stderr


def test_make_run_s_decision_reads_the_runs_of_its_own_settings(capsys):
    """scripts/decide_pairs.py (make run's decision) leaves out local runs that compare would put in other groups,
    which would leave no group to be the baseline, and names the settings that differ. Profile and bench runs may
    differ in mode settings (bench_steps...); bench runs not (the latest one's window counts); a setting switched
    off reads as absent in an older run.json; a run without settings is kept (compare says what it does with it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("decide_pairs", os.path.join(ROOT, "scripts", "decide_pairs.py"))
    decide_pairs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decide_pairs)

    def run(mode, workers, created, **settings):
        base = {"workers": workers, "batch_size": 128, "data": "synthetic", "bench_steps": 100, "compile": "off"}
        return {"mode": mode, "status": "succeeded", "created_at": created, "settings": {**base, **settings}}

    older = run("bench", 0, 4)
    del older["settings"]["compile"]  # an older run.json, before the option existed: off
    ours = [run("profile", 0, 5, bench_steps=5), run("profile", 4, 6, bench_steps=5), older, run("bench", 4, 8)]
    failed = {"mode": "bench", "status": "failed", "created_at": 9, "settings": {}}
    other_batch = [run("profile", 0, 1, batch_size=4), run("bench", 0, 2, batch_size=4)]
    other_window = [run("bench", 0, 3, bench_steps=5)]
    assert decide_pairs.same_study(other_batch + other_window + ours + [failed], [0, 4]) == ours + [failed]
    out = capsys.readouterr().out
    assert "3 local runs of other settings left out (batch_size, bench_steps)" in out, out
    assert decide_pairs.same_study(ours, [0, 4]) == ours and not capsys.readouterr().out
    assert decide_pairs.same_study(other_window, [0, 4]) == other_window, "no profile run: nothing to read"
