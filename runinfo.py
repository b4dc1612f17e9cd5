"""Run facts: the CPU budget, the environment, the package inventory, atomic writes, Polyaxon tracking and run identity."""

import hashlib
import json
import os
import platform
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OFFLINE_ROOT = os.path.join(HERE, ".polyaxon-offline")
PROJECT = "pytorch-training-profiler"


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


# --------------------------------------------------------------------------- machine facts

def cpu_budget(cgroup_root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup"):
    """The CPUs this process may really use: the cgroup CPU quota where one is set, else affinity.

    A pod's quota is invisible to os.cpu_count() and sched_getaffinity(): a 4-CPU pod on a
    64-core node must read 4, or torch starts 64 threads that fight over 4 CPUs.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        affinity = os.cpu_count() or 1
    quota, source = None, "affinity"
    own = ""
    try:
        with open(proc_cgroup) as f:
            for line in f:
                parts = line.strip().split(":", 2)
                if len(parts) == 3 and parts[0] == "0":
                    own = parts[2].lstrip("/")
    except OSError:
        pass
    v2_candidates = [os.path.join(cgroup_root, own, "cpu.max"), os.path.join(cgroup_root, "cpu.max")]
    for path in dict.fromkeys(v2_candidates):
        try:
            with open(path) as f:
                limit, period = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        if limit != "max":
            quota, source = int(limit) / int(period), f"cgroup v2 {path}"
        break
    else:
        for d in (os.path.join(cgroup_root, "cpu"), os.path.join(cgroup_root, "cpu,cpuacct"), cgroup_root):
            try:
                with open(os.path.join(d, "cpu.cfs_quota_us")) as f:
                    limit = int(f.read())
                with open(os.path.join(d, "cpu.cfs_period_us")) as f:
                    period = int(f.read())
            except (OSError, ValueError):
                continue
            if limit > 0:
                quota, source = limit / period, f"cgroup v1 {d}"
            break
    cpus = min(quota, affinity) if quota is not None else affinity
    if quota is not None and affinity < quota:
        source = "affinity (below the cgroup quota)"
    return {"cpus": cpus, "source": source, "cgroup_quota_cpus": quota, "affinity_cpus": affinity}


def set_threads(torch, budget):
    """Keep torch's intra-op threads within the CPU budget (its default follows the node's cores)."""
    before = torch.get_num_threads()
    allowed = max(1, int(budget["cpus"]))
    if before > allowed:
        torch.set_num_threads(allowed)
    return {"default": before, "used": torch.get_num_threads()}


def package_inventory():
    from importlib import metadata
    names = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            names[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(names[k] for k in sorted(names)) + "\n"


def source_sha256():
    """One hash over the project's Python sources (train.py and the modules it runs), sorted by path."""
    h = hashlib.sha256()
    paths = [os.path.join(HERE, n) for n in os.listdir(HERE) if n.endswith(".py")]
    speedups = os.path.join(HERE, "speedups")
    if os.path.isdir(speedups):
        paths += [os.path.join(speedups, n) for n in os.listdir(speedups) if n.endswith(".py")]
    for path in sorted(paths):
        with open(path, "rb") as f:
            h.update(os.path.relpath(path, HERE).encode() + b"\0" + f.read())
    return h.hexdigest()


def environment(torch, device):
    import torchvision
    try:
        from importlib import metadata
        polyaxon_version = metadata.version("polyaxon")
    except Exception:  # not installed: recorded as such, never fatal here
        polyaxon_version = None
    cuda = device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "polyaxon": polyaxon_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "source_sha256": source_sha256(),
    }


# --------------------------------------------------------------------------- files

def write_atomic(path, data):
    """Write bytes or text to path through a temp file and a rename: never a half-written file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{os.path.basename(path)}")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def write_json_atomic(path, obj):
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def writable_dirs(places):
    """Each (path, flag) made (or found) a folder this process can write; else UserError naming it and the
    problem, with the folders made here removed again (nothing is left behind)."""
    made = []
    try:
        for path, flag in places:
            path = os.path.abspath(path)
            if os.path.exists(path) and not os.path.isdir(path):
                raise UserError(f"{flag} {path} is a file, not a folder")
            missing = []
            parent = path
            while not os.path.exists(parent):
                missing.append(parent)
                parent = os.path.dirname(parent)
            try:
                os.makedirs(path, exist_ok=True)
                made += reversed(missing)
                probe = tempfile.NamedTemporaryFile(dir=path, prefix=".partial-probe-")
                probe.close()
            except OSError as e:
                raise UserError(f"{flag} {path} is not a writable folder ({e.strerror or e})") from e
    except UserError:
        for path in reversed(made):
            try:
                os.rmdir(path)
            except OSError:
                pass
        raise


# --------------------------------------------------------------------------- tracking

def is_managed():
    return bool(os.environ.get("POLYAXON_RUN_INSTANCE")) or \
        os.environ.get("POLYAXON_IS_MANAGED", "").lower() in ("1", "true", "yes")


def managed_identity():
    """owner, project and run uuid from POLYAXON_RUN_INSTANCE (owner.project.runs.uuid), passed explicitly
    so that no client cache on the machine can point tracking at another run."""
    parts = os.environ.get("POLYAXON_RUN_INSTANCE", "").split(".")
    if len(parts) == 4 and parts[2] == "runs":
        return {"owner": parts[0], "project": parts[1], "run_uuid": parts[3]}
    return {}


def start_tracking(name, tags):
    """Polyaxon tracking: the managed run inside Polyaxon, an offline run everywhere else."""
    managed = is_managed()
    if not managed:
        # Read by polyaxon at import time: set it first.
        os.environ.setdefault("POLYAXON_OFFLINE_ROOT", DEFAULT_OFFLINE_ROOT)
    try:
        from polyaxon import tracking
    except ImportError as e:
        raise UserError(f"polyaxon is not installed ({e}): pip install -r requirements.txt") from e
    if managed:
        tracking.init(**managed_identity())
    else:
        tracking.init(is_offline=True, project=PROJECT, name=name, tags=tags,
                      track_code=False, track_env=False, collect_resources=False)
    return tracking


class RunRecord:
    """run.json and the Polyaxon run of one job: files are written, then logged; the end state is set once."""

    def __init__(self, tracking, settings, mode, output_dir=None):
        from datetime import datetime, timezone
        self.tracking, self._now = tracking, lambda: datetime.now(timezone.utc).isoformat()
        self.out_dir = os.path.abspath(output_dir or tracking.get_outputs_path())
        os.makedirs(self.out_dir, exist_ok=True)
        self.path = os.path.join(self.out_dir, "run.json")
        self.logged = []
        self.data = {
            "status": "running", "mode": mode, "settings": settings, "started_at": self._now(),
            "polyaxon": {"managed": is_managed(), "run_uuid": tracking.TRACKING_RUN.run_uuid,
                         "offline_root": None if is_managed() else os.environ.get("POLYAXON_OFFLINE_ROOT")},
        }

    def __setitem__(self, key, value):
        self.data[key] = value

    def __getitem__(self, key):
        return self.data[key]

    def update(self, facts):
        self.data.update(facts)

    def log_file(self, path, name):
        self.tracking.log_file_ref(path=path, name=name)
        self.logged.append(path)

    def succeeded(self, outputs):
        self.data.update(status="succeeded", finished_at=self._now(),
                         artifacts=[os.path.relpath(p, self.out_dir) for p in self.logged] + ["run.json"])
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tracking.log_outputs(**outputs)
        self.tracking.end()

    def stopped(self, stop):
        """A stop signal: run.json and Polyaxon say stopped, with the signal and how far the run got."""
        self.data.update(status="stopped", finished_at=self._now(),
                         stopped={"signal": stop.signal_name, "phase": stop.phase,
                                  "steps_completed_in_phase": stop.steps_done})
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tracking.log_stopped(reason=stop.signal_name, message=str(stop))
        self.tracking.end()

    def failed(self, error, trace=None):
        self.data.update(status="failed", error=f"{type(error).__name__}: {error}", finished_at=self._now())
        if trace:
            self.data["traceback"] = trace
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tracking.log_failed(reason=type(error).__name__, message=str(error)[:2000])
        self.tracking.end()
