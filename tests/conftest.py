import json
import os
import shutil
import subprocess
import sys

import pytest
from filelock import FileLock  # installed with torch (one of its requirements)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Tiny CPU settings: every test run is a real train.py process on synthetic data.
TINY = ["--device", "cpu", "--data", "synthetic", "--batch-size", "4", "--warmup-steps", "1"]


def polyaxon_env(offline_root, **extra):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("POLYAXON_"):
            del env[k]
    env.update(
        POLYAXON_OFFLINE_ROOT=str(offline_root),
        # One intra-op thread: the tests' runs are tiny, and two test processes share the CI machine's 2 CPUs
        # (2 threads each spin against each other: a profile run took 25 s of CPU with 2 threads, 18 s with 1)
        OMP_NUM_THREADS="1",
        POLYAXON_TRACKING_FLUSH_DELAY="0",
        POLYAXON_DISABLE_ERRORS_REPORTING="true",
        COLUMNS="500",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


_FORKS = []


def fork_server():
    """This test process's fork server for train.py runs (tests/trainfork.py), started on first use; None where
    STEPLENS_TEST_FRESH=1 asks for a fresh process per run."""
    if os.environ.get("STEPLENS_TEST_FRESH") == "1":
        return None
    if not _FORKS:
        import atexit

        from trainfork import Client

        env = polyaxon_env("")
        del env["POLYAXON_OFFLINE_ROOT"]
        _FORKS.append(Client(env))
        atexit.register(_FORKS[0].stop)
    return _FORKS[0]


def run_train(args, offline_root, timeout=600, **env):
    """train.py ARGS to its end, as `python train.py ARGS` with captured text output: forked from a process that
    has already imported torch and torchvision (6-7 s of CPU a run), unless its environment differs there."""
    return run_script([os.path.join(ROOT, "train.py"), *args], offline_root, timeout, **env)


def run_script(argv, offline_root, timeout=600, **env):
    """As run_train, for any script: argv[0] is its path."""
    env = polyaxon_env(offline_root, **env)
    server = fork_server()
    if server is not None and server.serves(env):
        return server.run(argv, env, ROOT, timeout)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def popen_train(argv, offline_root, **env):
    """As subprocess.Popen([python, *argv], stdout=PIPE, stderr=PIPE, text=True) in ROOT, argv[0] train.py or a
    script that runs it: forked as run_train's runs are, with pid, send_signal, poll, wait and kill."""
    env = polyaxon_env(offline_root, **env)
    server = fork_server()
    if server is not None and server.serves(env):
        return server.popen(argv, env, ROOT, text=True)
    pipe = subprocess.PIPE
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True)


def run_torchrun(args, offline_root, nproc=2, timeout=600, **env):
    """train.py under torchrun (python -m torch.distributed.run), one machine, a free rendezvous port."""
    from polyaxon_support import free_port

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        os.path.join(ROOT, "train.py"),
        *args,
    ]
    return subprocess.run(
        cmd,
        cwd=ROOT,
        env=polyaxon_env(offline_root, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(pid):
    """Whether pid runs (a zombie does not), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def offline_runs(offline_root):
    runs = os.path.join(str(offline_root), "runs")
    return sorted(os.listdir(runs)) if os.path.isdir(runs) else []


def load_offline_run(offline_root, uuid):
    with open(os.path.join(str(offline_root), "runs", uuid, "run.plx.json")) as f:
        return json.load(f)


def single_run(offline_root):
    runs = offline_runs(offline_root)
    assert len(runs) == 1, f"expected one offline run under {offline_root}, found {runs}"
    return runs[0], os.path.join(str(offline_root), "runs", runs[0], "outputs")


def shared_run(tmp_path_factory, name, start):
    """The run start(root) makes, made once per test run: under pytest-xdist every worker has its own session, so
    the first worker to ask makes it in the workers' common temp folder and the others read what it recorded."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the folder the workers' own temp folders share
    root, record = base / name, base / f"{name}.json"
    with FileLock(str(base / f"{name}.lock")):
        if not record.exists():
            root.mkdir()
            proc = start(root)
            keep = {"args": [str(a) for a in proc.args], "returncode": proc.returncode}
            record.write_text(json.dumps({**keep, "stdout": proc.stdout, "stderr": proc.stderr}))
        done = json.loads(record.read_text())
    proc = subprocess.CompletedProcess(done["args"], done["returncode"], done["stdout"], done["stderr"])
    return root, proc


def shared_offline_run(tmp_path_factory, name, start):
    root, proc = shared_run(tmp_path_factory, name, start)
    assert proc.returncode == 0, f"{name} run failed:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    uuid, outputs = single_run(root)
    return {"root": root, "uuid": uuid, "outputs": outputs, "proc": proc}


@pytest.fixture(scope="session")
def profile_run(tmp_path_factory):
    """One real CPU profile-mode run, shared by the tests that read its artifacts."""
    return shared_offline_run(
        tmp_path_factory, "offline-profile", lambda root: run_train(["--mode", "profile", *TINY], root)
    )


@pytest.fixture(scope="session")
def bench_run(tmp_path_factory):
    return shared_offline_run(
        tmp_path_factory,
        "offline-bench",
        # repeat 1: test_compare's study pairs it with its own workers=1 runs (repeats 1 and 2)
        lambda root: run_train(["--mode", "bench", "--bench-steps", "3", "--repeat", "1", *TINY], root),
    )


@pytest.fixture(scope="session")
def failed_download_run(tmp_path_factory, profile_run):
    """A CIFAR-10 run whose download cannot reach anything (it fails), into a --data-dir whose folders do not exist
    yet, in a root that already holds the project record the profile run's tracking start wrote."""

    def start(root):
        shutil.copytree(os.path.join(profile_run["root"], "projects"), root / "projects")
        dead = "http://127.0.0.1:9"  # nothing listens there: the download fails at once
        args = ["--mode", "bench", "--device", "cpu", "--data", "cifar10", "--data-dir", str(root / "new" / "d")]
        return run_train(
            [*args, "--batch-size", "4", "--warmup-steps", "1", "--bench-steps", "1"],
            root,
            timeout=300,
            **{k: dead for k in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")},
            no_proxy="",
            NO_PROXY="",
        )

    root, proc = shared_run(tmp_path_factory, "offline-failed", start)
    assert proc.returncode == 1, f"the download should have failed:\n{proc.stderr[-3000:]}"
    uuid, outputs = single_run(root)
    return {"root": root, "uuid": uuid, "outputs": outputs, "proc": proc}


# Rank 1 sleeps this long in every input/next_batch: ten times the largest systematic gap seen between two ranks on a
# busy 2-CPU machine (58 ms a step), which steplens ranks's sign test needs in all six aligned steps before it names
# a straggler. Every step of the run sleeps it, unprofiled ones included: longer costs test time for nothing.
SLOW_MS = 600
SLOW = ["--slow-rank", "1", "--slow-input-ms", str(SLOW_MS)]
# Where a test reads no stacks, shapes or memory events: the CPU profiler's with_stack alone costs a 2-rank run a
# third of its CPU time.
LEAN = ["--profile-detail", "lean"]
# Where a test reads no profiler slow-down: four unprofiled steps on each side of the capture, not ten (a TINY
# profile run spent a third of its steps there; an even count keeps the checkpoint phase's default of a save every 2
# steps). profile_run keeps the ten that test_train.py checks.
FEW = ["--unprofiled-steps", "4"]


@pytest.fixture(scope="session")
def ddp_profile(tmp_path_factory):
    """Two ranks profiled, rank 1 a straggler on purpose (SLOW_MS inside input/next_batch)."""
    return shared_offline_run(
        tmp_path_factory,
        "ddp-profile",
        lambda root: run_torchrun(["--ddp", "--mode", "profile", *TINY, *LEAN, *FEW, *SLOW], root),
    )


@pytest.fixture(scope="session")
def ddp_bench(tmp_path_factory):
    return shared_offline_run(
        tmp_path_factory,
        "ddp-bench",
        lambda root: run_torchrun(["--ddp", "--mode", "bench", "--bench-steps", "3", *TINY, *SLOW], root),
    )


@pytest.fixture(scope="session")
def stored_evidence():
    """summarize_file(path) of a stored trace (results/), read once per session: several test files check their
    own properties on the same 60-odd stored traces. The evidence is shared: read it, never change it."""
    from steplens.evidence import summarize

    cache = {}

    def evidence(path):
        if path not in cache:
            cache[path] = summarize.summarize_file(path)
        return cache[path]

    return evidence


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    """A real Polyaxon server (haupt sandbox) on 127.0.0.1, started and stopped by the tests."""
    from polyaxon_support import Sandbox

    server = Sandbox(tmp_path_factory.mktemp("sandbox")).start()
    try:
        yield server
    finally:
        server.stop()


# Fixtures whose tests run on one xdist worker (--dist loadgroup, make test), beside every module-scoped fixture:
# a Polyaxon server per worker would start twice, and each worker would read the stored traces again.
ONE_WORKER = ("sandbox", "stored_evidence")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist each worker has its own session: a module-scoped fixture (a module's own train.py runs)
    would be made again by every worker that runs one of its tests. The tests that share a module-scoped fixture
    or one of ONE_WORKER, directly or through another test, form one xdist group, run by one worker."""
    parent = {}

    def find(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keyed = []
    for item in items:
        keys = [name for name in ONE_WORKER if name in item.fixturenames]
        info = getattr(item, "_fixtureinfo", None)
        for name, defs in (info.name2fixturedefs if info else {}).items():
            if defs and defs[-1].scope == "module":
                keys.append(f"{defs[-1].baseid}::{name}")
        for key in keys:
            parent[find(key)] = find(keys[0])
        keyed.append((item, keys))
    names = {}
    for key in sorted(parent):  # a group is named after one of ONE_WORKER where it holds one
        root = find(key)
        if root not in names or key in ONE_WORKER:
            names[root] = key.replace("::", "-")
    for item, keys in keyed:
        if keys:
            item.add_marker(pytest.mark.xdist_group(names[find(keys[0])]))
