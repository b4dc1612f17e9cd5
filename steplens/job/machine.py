"""Machine facts: the CPU budget (cgroup quotas), thread counts, packages, driver, GPU and host ids, the source hash."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from steplens.job.paths import ROOT, source_files

if TYPE_CHECKING:
    import torch


def own_cgroups(proc_cgroup: str = "/proc/self/cgroup") -> tuple[str | None, str | None]:
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


def walk_up(mount: str, path: str | None) -> list[str]:
    """mount/path, then each of its parents, ending at mount itself."""
    parts = [p for p in (path or "").split("/") if p]
    return [os.path.join(mount, *parts[:i]) for i in range(len(parts), -1, -1)]


def read_quota_v2(directory: str) -> float | None:
    """CPUs allowed by DIR/cpu.max ("max 100000" is no limit), or None."""
    try:
        with open(os.path.join(directory, "cpu.max")) as f:
            limit, period = f.read().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        return None


def read_quota_v1(directory: str) -> float | None:
    """CPUs allowed by DIR/cpu.cfs_quota_us over cpu.cfs_period_us (-1 is no limit), or None."""
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            limit = int(f.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return limit / period if limit > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cgroup_quotas(
    cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> list[tuple[float, str]]:
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


def cpu_budget(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> dict[str, Any]:
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
    return {
        "cpus": cpus,
        "source": source,
        "cgroup_quota_cpus": quota,
        "affinity_cpus": affinity,
        "cgroup_quotas": [{"cpus": q, "source": s} for q, s in quotas],
    }


def set_threads(budget: dict[str, Any]) -> dict[str, int]:
    """Keep torch's intra-op threads within the CPU budget (its default follows the node's cores)."""
    import torch

    before = torch.get_num_threads()
    allowed = max(1, int(budget["cpus"]))
    if before > allowed:
        torch.set_num_threads(allowed)
    return {"default": before, "used": torch.get_num_threads()}


def package_inventory() -> str:
    from importlib import metadata

    names = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            names[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(names[k] for k in sorted(names)) + "\n"


def source_sha256() -> str:
    """One hash over the project's Python sources (train.py and the package it runs), sorted by path."""
    h = hashlib.sha256()
    for path in source_files():
        with open(path, "rb") as f:
            h.update(os.path.relpath(path, ROOT).encode() + b"\0" + f.read())
    return h.hexdigest()


VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


def driver_version(
    proc_path: str = "/proc/driver/nvidia/version", nvidia_smi: str = "nvidia-smi", timeout: float = 10
) -> str | None:
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
        proc = subprocess.run(
            [nvidia_smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
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


def host_ids(
    machine_id_files: Sequence[str] = MACHINE_ID_FILES, boot_id_file: str = BOOT_ID_FILE
) -> dict[str, str | None]:
    """The host's machine id and boot id: hostnames repeat ("vm", "localhost"), these do not.
    The machine id can be copied with a cloned disk image; the boot id is new at every boot."""
    return {"machine_id": _first_line(machine_id_files), "boot_id": _first_line([boot_id_file])}


def gpu_uuid(device: torch.device, nvidia_smi: str = "nvidia-smi", timeout: float = 10) -> str | None:
    """The GPU's UUID as nvidia-smi writes it ("GPU-" and 8-4-4-4-12 hex digits); None on the CPU or where
    neither torch (its device properties' uuid: torch 2.11 and 2.14 have it) nor nvidia-smi answers."""
    import torch

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
        proc = subprocess.run(
            [nvidia_smi, "--query-gpu=uuid", "--format=csv,noheader", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    first = proc.stdout.strip().splitlines()[0].strip() if proc.returncode == 0 and proc.stdout.strip() else ""
    return first if first.startswith("GPU-") else None


def environment(device: torch.device) -> dict[str, Any]:
    import torch
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
        "gpu_uuid": gpu_uuid(device),
        "source_sha256": source_sha256(),
    }


def comparable_facts(environment: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    """The facts that decide whether two runs may be compared, as Polyaxon outputs (None left out)."""
    facts = {
        "env_host": environment.get("hostname"),
        "env_gpu": environment.get("gpu"),
        "env_driver": environment.get("driver"),
        "env_torch": environment.get("torch"),
        "env_cuda": environment.get("cuda"),
        "env_cpu_budget": budget.get("cpus"),
        "env_machine_id": environment.get("machine_id"),
        "env_boot_id": environment.get("boot_id"),
        "env_gpu_uuid": environment.get("gpu_uuid"),
    }
    return {k: v for k, v in facts.items() if v is not None}
