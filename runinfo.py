"""Run facts: the CPU budget, the environment, the package inventory, atomic writes, Polyaxon tracking and run identity."""

import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import uuid

import overview

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OFFLINE_ROOT = os.path.join(HERE, ".polyaxon-offline")
PROJECT = "pytorch-training-profiler"


class UserError(Exception):
    """A problem the user can fix; reported as one line, without a traceback."""


# --------------------------------------------------------------------------- machine facts

def own_cgroups(proc_cgroup="/proc/self/cgroup"):
    """This process's cgroup paths from /proc/self/cgroup: the v2 path (line "0::PATH") and the v1 path
    of the controller that holds the cpu quota (a line whose controllers include "cpu"); None when absent."""
    v2 = v1 = None
    try:
        with open(proc_cgroup) as f:
            for line in f:
                parts = line.strip().split(":", 2)
                if len(parts) != 3:
                    continue
                hierarchy, controllers, path = parts
                if hierarchy == "0" and controllers == "":
                    v2 = path
                elif "cpu" in controllers.split(","):
                    v1 = path
    except OSError:
        pass
    return v2, v1


def walk_up(mount, path):
    """mount/path, then each of its parents, ending at mount itself."""
    parts = [p for p in (path or "").split("/") if p]
    return [os.path.join(mount, *parts[:i]) for i in range(len(parts), -1, -1)]


def read_quota_v2(directory):
    """CPUs allowed by DIR/cpu.max ("max 100000" is no limit), or None."""
    try:
        with open(os.path.join(directory, "cpu.max")) as f:
            limit, period = f.read().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        return None


def read_quota_v1(directory):
    """CPUs allowed by DIR/cpu.cfs_quota_us over cpu.cfs_period_us (-1 is no limit), or None."""
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            limit = int(f.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return limit / period if limit > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cgroup_quotas(cgroup_root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup"):
    """Every CPU quota between this process's cgroup and the root, as [(cpus, path)].

    A quota set on a parent (the pod) binds every child (the container), so the walk goes from the
    process's own cgroup up to the root. Inside a container the own path may not exist under the
    mount (no cgroup namespace): the directories that exist are read, whatever the depth.
    """
    v2, v1 = own_cgroups(proc_cgroup)
    found = []
    for d in walk_up(cgroup_root, v2):
        quota = read_quota_v2(d)
        if quota is not None:
            found.append((quota, f"cgroup v2 {os.path.join(d, 'cpu.max')}"))
    # v1: the cpu controller's mount, named one way or another (often a link to the other name: read one).
    mounts = [os.path.join(cgroup_root, n) for n in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
    mount = next((m for m in mounts if os.path.isdir(m)), None)
    if mount is None and os.path.isfile(os.path.join(cgroup_root, "cpu.cfs_period_us")):
        mount = cgroup_root  # the controller mounted at the root itself, as some images do
    for d in walk_up(mount, v1) if mount else []:
        quota = read_quota_v1(d)
        if quota is not None:
            found.append((quota, f"cgroup v1 {os.path.join(d, 'cpu.cfs_quota_us')}"))
    return found


def cpu_budget(cgroup_root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup"):
    """The CPUs this process may really use: the smallest cgroup CPU quota on its path, else affinity.

    A pod's quota is invisible to os.cpu_count() and sched_getaffinity(): a 4-CPU pod on a
    64-core node must read 4, or torch starts 64 threads that fight over 4 CPUs.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        affinity = os.cpu_count() or 1
    quotas = cgroup_quotas(cgroup_root, proc_cgroup)
    quota, source = min(quotas) if quotas else (None, "affinity")
    cpus = min(quota, affinity) if quota is not None else affinity
    if quota is not None and affinity < quota:
        source = "affinity (below the cgroup quota)"
    return {"cpus": cpus, "source": source, "cgroup_quota_cpus": quota, "affinity_cpus": affinity,
            "cgroup_quotas": [{"cpus": q, "source": s} for q, s in quotas]}


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


VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


def driver_version(proc_path="/proc/driver/nvidia/version", nvidia_smi="nvidia-smi", timeout=10):
    """The NVIDIA driver's version: from the kernel module's /proc file where present, else nvidia-smi;
    None when neither answers (no NVIDIA driver here). torch has no API for it."""
    try:
        with open(proc_path) as f:
            # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..." (or "Open Kernel
            # Module for x86_64  570.86.15  Release Build ..."): the first version after "Kernel Module".
            m = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)\s", f.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        proc = subprocess.run([nvidia_smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    first = proc.stdout.strip().splitlines()[0].strip() if proc.returncode == 0 and proc.stdout.strip() else ""
    return first if VERSION.fullmatch(first) else None


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def _first_line(paths):
    """The first non-empty first line of the files that exist, else None."""
    for path in paths:
        try:
            with open(path) as f:
                line = f.readline().strip()
        except OSError:
            continue
        if line and line != "uninitialized":  # systemd's placeholder before the first boot completes
            return line
    return None


def host_ids(machine_id_files=MACHINE_ID_FILES, boot_id_file=BOOT_ID_FILE):
    """The host's machine id and boot id: hostnames repeat ("vm", "localhost"), these do not.
    The machine id can be copied with a cloned disk image; the boot id is new at every boot."""
    return {"machine_id": _first_line(machine_id_files), "boot_id": _first_line([boot_id_file])}


def gpu_uuid(torch, device, nvidia_smi="nvidia-smi", timeout=10):
    """The GPU's UUID as nvidia-smi writes it ("GPU-" and 8-4-4-4-12 hex digits); None on the CPU or where
    neither torch (its device properties' uuid: torch 2.11 and 2.14 have it) nor nvidia-smi answers."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if found is not None:
        text = str(found)  # torch writes the bare hex digits; nvidia-smi and CUDA_VISIBLE_DEVICES prefix "GPU-"
        return text if text.startswith("GPU-") else f"GPU-{text}"
    # nvidia-smi counts every GPU: map torch's index through CUDA_VISIBLE_DEVICES when it lists indices.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = [v.strip() for v in visible.split(",")]
        if index >= len(listed) or not listed[index].isdigit():
            return None
        index = int(listed[index])
    try:
        proc = subprocess.run([nvidia_smi, "--query-gpu=uuid", "--format=csv,noheader", "-i", str(index)],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    first = proc.stdout.strip().splitlines()[0].strip() if proc.returncode == 0 and proc.stdout.strip() else ""
    return first if first.startswith("GPU-") else None


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
        "driver": driver_version() if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "polyaxon": polyaxon_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        **host_ids(),
        "gpu_uuid": gpu_uuid(torch, device),
        "source_sha256": source_sha256(),
    }


def comparable_facts(environment, budget):
    """The facts that decide whether two runs may be compared, as Polyaxon outputs (None left out)."""
    facts = {"env_host": environment.get("hostname"), "env_gpu": environment.get("gpu"),
             "env_driver": environment.get("driver"), "env_torch": environment.get("torch"),
             "env_cuda": environment.get("cuda"), "env_cpu_budget": budget.get("cpus"),
             "env_machine_id": environment.get("machine_id"), "env_boot_id": environment.get("boot_id"),
             "env_gpu_uuid": environment.get("gpu_uuid")}
    return {k: v for k, v in facts.items() if v is not None}


# --------------------------------------------------------------------------- files

def recorded_file(path, base):
    """A file an offline run recorded, found under the run's own folder base when the run was recorded on
    another machine (its path ends in /outputs/...); relative when under the current folder; None if absent."""
    if base and not os.path.exists(path) and "/outputs/" in path:
        path = os.path.join(base, "outputs", path.split("/outputs/", 1)[1])
    if not os.path.exists(path):
        return None
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def write_atomic(path, data, replace=True):
    """Write bytes or text to path through a temp file and a rename: never a half-written file.
    replace=False: a file already at path is kept (a hard link, which fails where one exists)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{os.path.basename(path)}")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError:  # a filesystem without hard links: a rename, unless another writer came first
                if not os.path.exists(path):
                    os.replace(tmp, path)
            if os.path.exists(tmp):
                os.remove(tmp)
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
                try:
                    os.makedirs(path, exist_ok=True)
                finally:  # the levels made before a failure deeper down are removed too
                    made += [m for m in reversed(missing) if os.path.isdir(m)]
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


# --------------------------------------------------------------------------- checks before heavy work

def check_places(args):
    """Every place the run writes to, made (or found) writable before any heavy work; one line otherwise."""
    places = [(args.output_dir, "--output-dir")] if args.output_dir else []
    if args.data == "cifar10":
        # Checked, not made: the download makes the folder, and removes it again if it fails.
        places.append((existing_part(args.data_dir), "--data-dir"))
    if not is_managed():
        places.append((os.environ.get("POLYAXON_OFFLINE_ROOT") or DEFAULT_OFFLINE_ROOT, "POLYAXON_OFFLINE_ROOT"))
    writable_dirs(places)


def existing_part(path):
    """path itself when it exists, else its nearest parent that does (where path would be made)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def check_workers(args, budget):
    """More workers than CPUs is allowed (and said); far more is refused unless forced."""
    bound = max(4, math.ceil(4 * budget["cpus"]))
    if args.workers > bound and not args.force_workers:
        raise UserError(f"--workers {args.workers} is more than 4x the CPU budget ({budget['cpus']:g} CPUs, "
                        f"{budget['source']}): each worker is a process holding batches; use at most {bound}, "
                        "or add --force-workers")
    if args.workers > budget["cpus"]:
        note = (f"--workers {args.workers} is above the CPU budget ({budget['cpus']:g} CPUs, {budget['source']}): "
                "the workers and the training thread will share CPUs")
        print(f"train.py: warning: {note}", file=sys.stderr)
        return note
    return None


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
        # <root>/runs/<uuid>: the project's record goes beside runs/, under <root>/projects/.
        root = os.path.dirname(os.path.dirname(os.path.abspath(tracking.get_artifacts_path())))
        write_project_record(root, tracking.TRACKING_RUN.owner, PROJECT)
    return tracking


def write_project_record(root, owner, project):
    """ROOT/projects/PROJECT/project.plx.json, the record Polyaxon's viewer (`haupt viewer --path ROOT`) lists
    the project from: offline tracking writes only the runs. Written once, by the first run; never replaced."""
    path = os.path.join(root, "projects", project, "project.plx.json")
    if not os.path.exists(path):
        from datetime import datetime, timezone
        now = datetime.now(timezone.utc).isoformat()
        record = {"uuid": uuid.uuid5(uuid.NAMESPACE_URL, f"polyaxon-offline/{owner}/{project}").hex,
                  "name": project, "owner": owner, "created_at": now, "updated_at": now,
                  "description": "train.py's runs on this machine, tracked offline: profile and bench"}
        write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n", replace=False)
    return path


class RunRecord:
    """run.json and the Polyaxon run of one job: files are written, then logged; the end state is set once.

    tracking: polyaxon.tracking, or a stand-in that logs nothing (RankRecord); name: the record's file
    under out_dir; polyaxon: what the record says of its Polyaxon run (default: tracking's own run).
    """

    def __init__(self, tracking, settings, mode, output_dir=None, name="run.json", polyaxon=None):
        self.tracking = tracking
        self.out_dir = os.path.abspath(output_dir or tracking.get_outputs_path())
        os.makedirs(self.out_dir, exist_ok=True)
        self.path = os.path.join(self.out_dir, name)
        self.logged = []
        if polyaxon is None:
            polyaxon = {"managed": is_managed(), "run_uuid": tracking.TRACKING_RUN.run_uuid,
                        "offline_root": None if is_managed() else os.environ.get("POLYAXON_OFFLINE_ROOT")}
        self.data = {"status": "running", "mode": mode, "settings": settings, "started_at": self._now(),
                     "polyaxon": polyaxon}

    @staticmethod
    def _now():
        from datetime import datetime, timezone
        return datetime.now(timezone.utc).isoformat()

    def __setitem__(self, key, value):
        self.data[key] = value

    def __getitem__(self, key):
        return self.data[key]

    def update(self, facts):
        self.data.update(facts)

    def log_file(self, path, name):
        self.tracking.log_file_ref(path=path, name=name)
        self.logged.append(path)

    def log_image(self, path, name):
        """A picture the run's dashboard shows (Polyaxon copies it under the run's assets/image/), and a file."""
        self.tracking.log_image(data=path, name=name)
        self.log_file(path, name)

    def log_outputs(self, **outputs):
        """Outputs logged while the run goes on (the comparable facts): a failed run keeps them too."""
        self.tracking.log_outputs(**outputs)

    def log_steps(self, name, values):
        """One figure per step ({step: value}) as a Polyaxon metric, which the run dashboard charts.
        name must differ from every output's name: at end() a metric's last value replaces an output's."""
        for step, value in sorted(values.items()):
            self.tracking.log_metrics(step=step, **{name: value})

    def tell(self, description, readme):
        """The run's one-line description and its readme (the overview panel of its page in Polyaxon's UI),
        set before end(). A server that refuses them (the sandbox answers 405 now and then) is asked again;
        one that still refuses is warned about; the run's files stand either way."""
        for attempt in range(4):
            try:
                self.tracking.set_description(description, async_req=False)
                self.tracking.set_readme(readme, async_req=False)
                return
            except Exception as e:  # the client raises its ApiException, or a connection error
                if attempt == 3:
                    print(f"warning: the Polyaxon server did not take the run's readme ({type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:200]})", file=sys.stderr)
                else:
                    time.sleep(1.0)  # not timed: the run is over

    def end(self):
        self.tracking.end()

    def succeeded(self, outputs):
        self.data.update(status="succeeded", finished_at=self._now(),
                         artifacts=[os.path.relpath(p, self.out_dir) for p in self.logged] + ["run.json"])
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tell(*overview.succeeded(self.data, self.out_dir))
        # Synchronous: the last outputs must reach Polyaxon before end() stops the client. A server that
        # refuses the request is asked again; the run's files are written whatever it answers.
        for attempt in range(3):
            try:
                self.tracking.log_outputs(async_req=False, **outputs)
                break
            except Exception as e:  # the client raises its ApiException, or a connection error
                if attempt == 2:
                    why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                    print(f"warning: the Polyaxon server did not take the outputs ({why}); run.json holds the "
                          f"results: {self.path}", file=sys.stderr)
                    self.data["outputs_not_logged"] = why
                    write_json_atomic(self.path, self.data)
                else:
                    time.sleep(1.0)  # not timed: the run is over
        self.end()

    def stopped(self, stop):
        """A stop signal: run.json and Polyaxon say stopped, with the signal and how far the run got."""
        self.data.update(status="stopped", finished_at=self._now(),
                         stopped={"signal": stop.signal_name, "phase": stop.phase,
                                  "steps_completed_in_phase": stop.steps_done})
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tell(*overview.ended(self.data))
        self.tracking.log_stopped(reason=stop.signal_name, message=str(stop))
        self.end()

    def failed(self, error, trace=None):
        self.data.update(status="failed", error=f"{type(error).__name__}: {error}", finished_at=self._now())
        if trace:
            self.data["traceback"] = trace
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tell(*overview.ended(self.data))
        self.tracking.log_failed(reason=type(error).__name__, message=str(error)[:2000])
        self.end()


class _NoTracking:
    """What a rank other than 0 has instead of a Polyaxon run: rank 0 logs its files."""

    def log_inputs(self, **_):
        pass

    def log_outputs(self, **_):
        pass

    def log_metrics(self, **_):
        pass

    def log_failed(self, **_):
        pass

    def log_stopped(self, **_):
        pass

    def set_description(self, *_, **__):
        pass

    def set_readme(self, *_, **__):
        pass

    def end(self):
        pass


class RankRecord(RunRecord):
    """The record of a rank other than 0: ranks/rank{R}.json beside rank 0's run.json, no Polyaxon run."""

    def __init__(self, settings, mode, out_dir, rank, run_uuid):
        super().__init__(_NoTracking(), settings, mode, out_dir, os.path.join("ranks", f"rank{rank}.json"),
                         {"logged_by": "rank 0", "run_uuid": run_uuid})
        self.files = []

    def log_file(self, path, name):
        self.logged.append(path)
        self.files.append((path, name))

    def log_image(self, path, name):
        self.log_file(path, name)  # rank 0 logs it with the rank's other files

    def succeeded(self, outputs):
        self.data.update(status="succeeded", finished_at=self._now(), outputs=outputs,
                         artifacts=[os.path.relpath(p, self.out_dir) for p in self.logged])
        self.log_file(write_json_atomic(self.path, self.data), "run-json")


def start_record(world, settings, mode, output_dir, name, tags):
    """One Polyaxon run per job, rank 0's: it starts the run and broadcasts its outputs folder; the other
    ranks write there without a run of their own. world: a distributed.World (a world of one without --ddp)."""
    record = None
    if world.is_leader:
        record = RunRecord(start_tracking(name=name, tags=tags + world.tags()), settings, mode, output_dir)
    shared = world.broadcast({"out_dir": record.out_dir, "run_uuid": record["polyaxon"]["run_uuid"]}
                             if world.is_leader else None)
    if not world.is_leader:
        record = RankRecord(settings, mode, shared["out_dir"], world.rank, shared["run_uuid"])
    record["distributed"] = world.facts()
    return record


def finish_record(world, record, outputs):
    """The run succeeded: the other ranks write their records first; rank 0 then logs every rank's files
    and ends the run."""
    if not world.active:
        return record.succeeded(outputs)
    if not world.is_leader:
        record.succeeded(outputs)
    files = world.all_gather([(os.path.relpath(p, record.out_dir), n) for p, n in record.files]
                             if not world.is_leader else [])
    if world.is_leader:
        for rank, theirs in enumerate(files):
            for rel, name in theirs:
                record.log_file(os.path.join(record.out_dir, rel), f"rank{rank}-{name}")
        record.succeeded(outputs)


def describe_run(record, torch, world, device, budget, workers_note):
    """What the numbers depend on, in run.json and as Polyaxon inputs and outputs, before any step runs."""
    record["cpu_budget"] = budget
    record["workers_note"] = workers_note
    record["torch_threads"] = set_threads(torch, budget)
    record["environment"] = environment(torch, device)
    record["device"] = str(device)
    record.log_outputs(**comparable_facts(record["environment"], budget))
    if world.is_leader:  # one inventory per job: every replica runs the same image
        record.log_file(write_atomic(os.path.join(record.out_dir, "packages.txt"), package_inventory()),
                        "packages")
    record.tracking.log_inputs(**{k: v for k, v in record["settings"].items() if v is not None})
