"""What `polyaxon run -u` uploads, read with Polyaxon's own ignore rules: train.py and the package, and the job runs."""

import os
import shutil
import subprocess
import sys
import warnings

from conftest import ROOT


def uploaded(monkeypatch):
    """The files Polyaxon's client uploads from this folder (it reads .polyaxonignore from the working directory)."""
    warnings.filterwarnings("ignore")
    from polyaxon._managers.ignore import IgnoreConfigManager

    monkeypatch.chdir(ROOT)
    return sorted(os.path.normpath(p) for p in IgnoreConfigManager.get_unignored_filepaths(".") if os.path.isfile(p))


def test_the_upload_holds_train_py_and_the_package_and_no_runs_results_or_caches(monkeypatch):
    files = uploaded(monkeypatch)
    package = sorted(
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, fs in os.walk(os.path.join(ROOT, "steplens"))
        for f in fs
        if f.endswith(".py")
    )
    assert "train.py" in files and "requirements.txt" in files and "polyaxonfile.yaml" in files
    assert set(package) <= set(files), f"the job would miss {sorted(set(package) - set(files))}"
    heavy = [
        f
        for f in files
        if f.split(os.sep)[0]
        in ("results", "tests", "docs", "scripts", ".venv", ".ruff_cache", ".polyaxon-offline", "data", "build")
    ]
    assert not heavy, f"uploaded for nothing: {heavy[:10]}"


def test_train_py_runs_from_the_uploaded_files_alone(monkeypatch, tmp_path):
    """The job's working directory holds only the upload: train.py finds steplens there, not in a checkout."""
    for f in uploaded(monkeypatch):
        os.makedirs(tmp_path / os.path.dirname(f), exist_ok=True)
        shutil.copy(os.path.join(ROOT, f), tmp_path / f)
    code = "import steplens, train; print(steplens.__file__); raise SystemExit(train.main(['--workers', '-1']))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.stdout.startswith(str(tmp_path)), f"steplens came from elsewhere: {proc.stdout}"
    assert proc.returncode == 2 and "--workers" in proc.stderr, proc.stderr
