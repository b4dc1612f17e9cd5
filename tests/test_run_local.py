"""scripts/run-local.sh (make run, make bench-alternating): bad settings refused in one line before any job."""
import os
import subprocess

import pytest

from conftest import ROOT


@pytest.mark.parametrize("target,env,says", [
    ("alternating", {"REPEATS": "abc"}, "REPEATS must be a whole number"),
    ("alternating", {"REPEATS": "0"}, "REPEATS must be a whole number"),
    ("main", {"DATA": "bogus"}, "DATA must be cifar10 or synthetic"),
    ("alternating", {"WORKERS": "0 x"}, "WORKERS must be whole numbers"),
    ("main", {"BENCH_STEPS": "-1"}, "BENCH_STEPS must be a whole number"),
    ("nothing", {}, "unknown target 'nothing'"),
])
def test_bad_settings_stop_before_any_job(tmp_path, target, env, says):
    full = {**os.environ, "POLYAXON_OFFLINE_ROOT": str(tmp_path), "PY": "false", **env}
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "run-local.sh"), target], env=full,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "runs").exists()
