"""The tests' fork server (tests/trainfork.py): a forked run must read as `python SCRIPT ARGS` does, since most
of the suite's train.py runs go through it."""

import gzip
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT, alive, fork_server, polyaxon_env, popen_train

pytestmark = pytest.mark.skipif(os.environ.get("STEPLENS_TEST_FRESH") == "1", reason="the fork server is off")

SCRIPT = """
import atexit, gzip, os, subprocess, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
left_open = gzip.open(sys.argv[2], "wt")  # never closed: Python's exit frees it, and the file is whole
left_open.write("whole" * 1000)
# a process left behind, holding stdout: subprocess.run reads to its end, so the late line is there
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); print('late line', flush=True)"])
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
print("argv", sys.argv[1:], "name", __name__, "file", os.path.basename(__file__))
print("cwd", os.getcwd(), "path0", sys.path[0])
print("env", os.environ.get("TRAINFORK_TEST"), "POLYAXON_OFFLINE_ROOT" in os.environ)
print("to stderr\\r\\nand a carriage return\\rend", file=sys.stderr)
what = sys.argv[1]
if what == "raise":
    raise ValueError("a failure")
if what == "message":
    sys.exit("a message")
sys.exit(int(what))
"""


def forked_and_fresh(argv, env):
    """argv (a script and its arguments; "{way}" in one reads "forked" or "fresh") run through the fork server and
    as a fresh process, in ROOT."""
    forked = fork_server().run([a.format(way="forked") for a in argv], env, ROOT, timeout=120)
    fresh = [sys.executable, *(a.format(way="fresh") for a in argv)]
    return forked, subprocess.run(fresh, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def both(tmp_path, *args):
    """SCRIPT through the fork server and as a fresh process, with the same environment."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = polyaxon_env(tmp_path / "offline", TRAINFORK_TEST="x")
    assert fork_server().serves(env)
    forked, fresh = forked_and_fresh([str(script), *args, str(tmp_path / "{way}.gz")], env)
    for name in ("forked.gz", "fresh.gz"):
        with gzip.open(tmp_path / name, "rt") as f:
            assert f.read() == "whole" * 1000, f"{name}: a file the script left open was not freed at its exit"
    return forked, fresh


@pytest.mark.parametrize("how", ["0", "3", "raise", "message"])
def test_a_forked_run_reads_as_a_fresh_process(tmp_path, how):
    """Same exit code, stdout and stderr: argv, __main__, the folder, sys.path[0], the environment, a non-daemon
    thread joined and the atexit handlers run before the exit, an uncaught exception's traceback, text mode."""
    forked, fresh = both(tmp_path, how)
    forked.stdout = forked.stdout.replace("forked.gz", "fresh.gz")
    forked.args[-1] = fresh.args[-1]
    # the line of the process left behind comes when it comes: the lines are compared as a set
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr)
    assert sorted(forked.stdout.splitlines()) == sorted(fresh.stdout.splitlines())
    assert forked.args == fresh.args
    lines = forked.stdout.splitlines()
    assert lines.index("thread done") < lines.index("atexit ran") and "late line" in lines
    assert forked.returncode == {"0": 0, "3": 3, "raise": 1, "message": 1}[how]
    if how == "raise":
        assert "ValueError: a failure" in forked.stderr and "Traceback" in forked.stderr


def test_a_script_that_does_not_compile_reads_as_in_a_fresh_process(tmp_path):
    """The SyntaxError names the script's line, with none of the server's frames."""
    script = tmp_path / "broken.py"
    script.write_text("x = 1\ny = (x +\n")
    env = polyaxon_env(tmp_path / "offline")
    forked, fresh = forked_and_fresh([str(script)], env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 1 and "SyntaxError" in forked.stderr and "trainfork" not in forked.stderr


def test_an_exception_at_exit_is_printed_and_the_exit_goes_on(tmp_path):
    """As in Python's own exit: the atexit handlers still run, the exit code stays the script's."""
    script = tmp_path / "exits.py"
    script.write_text(
        "import atexit, threading\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "def boom():\n"
        "    raise KeyboardInterrupt\n"
        "threading._shutdown = boom\n"
    )
    env = polyaxon_env(tmp_path / "offline")
    forked, fresh = forked_and_fresh([str(script)], env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 0 and forked.stdout == "atexit ran\n" and "KeyboardInterrupt" in forked.stderr


def test_a_run_whose_import_time_environment_differs_is_not_served(tmp_path):
    """torch reads OMP_NUM_THREADS when it loads: a run asking for another value gets a fresh process."""
    server = fork_server()
    assert server.serves(polyaxon_env(tmp_path))
    assert not server.serves(polyaxon_env(tmp_path, OMP_NUM_THREADS="2"))
    assert not server.serves(polyaxon_env(tmp_path, PYTHONHASHSEED="1"))
    assert not server.serves(polyaxon_env(tmp_path, OPENBLAS_NUM_THREADS="1"))  # no list of its own names it
    assert server.serves(polyaxon_env(tmp_path, RANK="1", STEPLENS_TEST_SLOW_SAMPLE_MS="5"))


def test_a_run_past_its_timeout_is_killed_with_its_children(tmp_path):
    server = fork_server()
    script = tmp_path / "sleeper.py"
    pidfile = tmp_path / "child.pid"
    script.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open({str(pidfile)!r}, "w").write(str(child.pid))
            print("started", flush=True)
            time.sleep(120)
            """
        )
    )
    env = polyaxon_env(tmp_path / "offline")
    with pytest.raises(subprocess.TimeoutExpired) as e:
        server.run([str(script)], env, ROOT, timeout=15)  # time enough to start on a busy machine
    assert b"started" in e.value.stdout
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the run's own child outlived its timeout"


def test_a_signal_reaches_the_run_and_its_status_comes_back(tmp_path):
    """As Popen: the pid is the run's, a signal it handles gives its exit code, one it does not gives -signum."""
    script = tmp_path / "waits.py"
    script.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
        "print('waiting', file=sys.stderr, flush=True)\n"
        "time.sleep(120)\n"
    )
    for signum, code in ((signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)):
        proc = popen_train([str(script)], tmp_path / "offline")
        try:
            assert proc.stderr.readline() == "waiting\n"
            assert proc.poll() is None
            proc.send_signal(signum)
            assert proc.wait(timeout=60) == code
            assert proc.returncode == code and proc.poll() == code
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_client_that_goes_away_takes_its_run_with_it(tmp_path):
    """A test process stopped mid-run (Ctrl-C, a killed worker) leaves no run behind."""
    script = tmp_path / "waits.py"
    script.write_text("import sys, time\nprint('waiting', file=sys.stderr, flush=True)\ntime.sleep(120)\n")
    proc = popen_train([str(script)], tmp_path / "offline")
    assert proc.stderr.readline() == "waiting\n"
    proc.close()
    deadline = time.monotonic() + 10
    while alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(proc.pid), "the run outlived its client"


def test_ctrl_c_on_the_suite_reaches_the_run(tmp_path):
    """A SIGINT to the waiter (it shares the test process's group, as a fresh run did) is passed to the run: its
    KeyboardInterrupt ends it as Python ends on one, by the signal."""
    script = tmp_path / "waits.py"
    script.write_text("import sys, time\nprint('waiting', file=sys.stderr, flush=True)\ntime.sleep(120)\n")
    proc = popen_train([str(script)], tmp_path / "offline")
    try:
        assert proc.stderr.readline() == "waiting\n"
        with open(f"/proc/{proc.pid}/stat") as f:
            waiter = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(waiter, signal.SIGINT)
        assert proc.wait(timeout=60) == -signal.SIGINT
        assert "KeyboardInterrupt" in proc.stderr.read()
    finally:
        proc.kill()
