"""The steplens command: its subcommands, the options every trace reader shares, and an install without torch."""

import os
import subprocess
import sys
import venv

import pytest
from conftest import ROOT

from steplens import cli, viewer

TRACE_READERS = ("summarize", "picture", "ranks")


def stored_h200_trace():
    runs = os.path.join(ROOT, "results", "h200-warmup", "offline", "runs")
    found = sorted(os.path.join(d, f) for d, _, fs in os.walk(runs) for f in fs if f.endswith(".pt.trace.json.gz"))
    assert found, "no stored H200 trace under results/h200-warmup"
    return found[0]


def steplens(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "steplens", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_help_lists_every_subcommand_and_an_unknown_one_is_refused_in_one_line():
    shown = steplens("--help")
    assert shown.returncode == 0 and all(name in shown.stdout for name in cli.COMMANDS), shown.stdout
    bad = steplens("summarise", "x.json")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown subcommand 'summarise'" in bad.stderr


@pytest.mark.parametrize("name", TRACE_READERS)
def test_every_subcommand_that_reads_a_trace_takes_the_same_reading_options(name):
    """--input-scope means the same thing wherever a trace is read (the step picture's legend names it too)."""
    out = steplens(name, "--help")
    assert out.returncode == 0, out.stderr
    assert "--input-scope NAME" in out.stdout and "enumerate(DataLoader)" in " ".join(out.stdout.split()), out.stdout


def test_picture_reads_the_input_scope_it_is_given(tmp_path):
    """steplens picture --input-scope: a name the trace does not hold is drawn as no input, not refused."""
    out = tmp_path / "p.png"
    done = steplens("picture", stored_h200_trace(), "--out", str(out), "--input-scope", "my/fetch")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_viewer_starts_offline_on_localhost_and_refuses_a_folder_without_runs(tmp_path):
    """The UI loads its scripts from public CDNs unless POLYAXON_UI_OFFLINE=true: the viewer always sets it."""
    env = viewer.viewer_env({"PATH": "/bin"})
    assert env["POLYAXON_UI_OFFLINE"] == "true" and env["PATH"] == "/bin"
    cmd = viewer.viewer_command("haupt", str(tmp_path), 8123)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--path") + 1] == str(tmp_path)
    refused = steplens("viewer", "--path", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "no runs/ folder" in refused.stderr


def test_pip_install_gives_a_command_that_reads_a_stored_h200_trace_without_torch(tmp_path):
    """A fresh virtual environment, `pip install .[pictures]` from this checkout (no torch, no Polyaxon): the
    console command gives the verdict and the kernel classes of a stored H200 trace, and draws its picture."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-compile", f"{ROOT}[pictures]"],
        capture_output=True,
        text=True,
        env=clean,
        timeout=900,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    have = subprocess.run(
        [py, "-c", "import importlib.util as u; print([m for m in ('torch', 'polyaxon') if u.find_spec(m)])"],
        capture_output=True,
        text=True,
        env=clean,
    )
    assert have.stdout.strip() == "[]", f"the toolkit pulled in {have.stdout}"
    command = str(env_dir / "bin" / "steplens")
    trace = stored_h200_trace()
    read = subprocess.run([command, "summarize", trace], capture_output=True, text=True, env=clean, cwd=tmp_path)
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.startswith("verdict: GPU compute holds the step"), read.stdout[:500]
    assert "convolution forward" in read.stdout and "GPU time by kernel class" in read.stdout
    png = tmp_path / "steps.png"
    drawn = subprocess.run(
        [command, "picture", trace, "--out", str(png)], capture_output=True, text=True, env=clean, cwd=tmp_path
    )
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("command", ["summarize", "picture"])
def test_a_folder_for_a_trace_is_refused_in_one_line_before_reading_any_trace(tmp_path, command):
    args = [stored_h200_trace(), str(tmp_path)] if command == "summarize" else [str(tmp_path)]
    done = steplens(command, *args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stdout == "", done.stderr
    assert f"{tmp_path} is a folder" in done.stderr and "Traceback" not in done.stderr
    assert os.listdir(tmp_path) == []


def test_a_picture_into_a_missing_folder_is_refused_in_one_line(tmp_path):
    done = steplens("picture", stored_h200_trace(), "--out", str(tmp_path / "missing" / "x.png"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "is not a folder" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("labelled", [True, False])
def test_an_input_scope_the_trace_lacks_is_named_in_the_verdict(labelled):
    """A typo in --input-scope, on our own trace and on a loop without labels: the verdict says no annotation has
    that name, not that none was given."""
    trace = stored_h200_trace() if labelled else os.path.join(ROOT, "results", "h100-delays", "launch.pt.trace.json.gz")
    done = steplens("summarize", "--input-scope", "my/fetchh", trace)
    first = done.stdout.splitlines()[0]
    assert done.returncode == 0 and "no user annotation named 'my/fetchh'" in first, first
    assert "no --input-scope" not in first, first


def test_a_closed_pipe_ends_the_command_quietly():
    """steplens summarize --json TRACE | true: no BrokenPipeError traceback when the reader stops before it."""
    proc = subprocess.run(
        f"{sys.executable} -m steplens summarize --json {stored_h200_trace()} | true",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_the_viewer_names_the_page_of_the_local_runs():
    assert viewer.runs_page(8001) == "http://127.0.0.1:8001/ui/default/pytorch-training-profiler/runs"
