"""CPU use over a window: CPU seconds of the main process, its threads and the DataLoader workers, the CPUs used
against the job's budget, and the cgroup's throttling (cpu.stat), read from /proc and /sys before and after it.

CPU time is read in nanoseconds from /proc/<pid>/task/<tid>/schedstat where the kernel keeps it, else in clock
ticks from the stat files (10 ms each: too coarse for a profiled cycle of a few steps)."""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from steplens.job.machine import own_cgroups, walk_up

BUSY_AT = 0.9  # CPUs used at this share of the budget or more: the job used up its CPUs
THROTTLED_AT = 0.05  # throttled for this share of the window or more: the cgroup held the job back
COARSE_AT = 0.1  # CPUs used read to worse than this share of the budget: too coarse to judge the budget
# A process's CPU clock adds the time of its threads running on other CPUs only up to their last scheduler tick:
# up to 4 ms late at HZ=250 (1 ms at HZ=1000). edge_snapshot's windows count this lag per process as their unit.
TICK_LAG_S = 0.004


def _stat_ticks(path: str) -> int | None:
    """utime + stime (clock ticks) from a /proc stat file, or None where it is gone (a process that ended)."""
    try:
        with open(path) as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[11]) + int(rest[12])  # fields 14 and 15 of proc(5), after "pid (comm)"


def _run_ns(path: str) -> int | None:
    """The CPU time (ns) a task has run, the first field of a schedstat file; None where it is missing."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _tasks_ns(pid: int) -> dict[str, int]:
    """Each thread's CPU time (ns) from schedstat; empty where it cannot be read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    found = {tid: _run_ns(f"/proc/{pid}/task/{tid}/schedstat") for tid in tids}
    return {tid: ns for tid, ns in found.items() if ns is not None}


def _process_ns(pid: int) -> int | None:
    """A process's CPU time (ns), its live threads added up; None where it is gone or has no schedstat."""
    tasks = _tasks_ns(pid)
    return sum(tasks.values()) if tasks else None


def _cpu_clock_ns(pid: int) -> int | None:
    """A process's CPU time (ns: every thread's, live or ended) from its CPU-time clock in one system call (the
    clock id of clock_getcpuclockid(3): MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)); None where it is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return None


def _switches(pid: int) -> int | None:
    """Involuntary context switches of every thread of pid (the scheduler took the CPU away)."""
    total, found = 0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        total, found = total + int(line.split()[1]), True
        except OSError:
            continue
    return total if found else None


def _threads(pid: int) -> dict[str, tuple[str, int]]:
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        ticks = _stat_ticks(f"/proc/{pid}/task/{tid}/stat")
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            name = "?"
        if ticks is not None:
            out[tid] = (name, ticks)
    return out


def _cgroup_stats(cgroup_root: str, proc_cgroup: str) -> dict[str, dict[str, int]]:
    """cpu.stat of every cgroup v2 directory from this process's own up to the root: {dir: {key: value}}."""
    out = {}
    v2, _ = own_cgroups(proc_cgroup)
    for d in walk_up(cgroup_root, v2):
        try:
            with open(os.path.join(d, "cpu.stat")) as f:
                out[d] = {k: int(v) for k, v in (line.split() for line in f if len(line.split()) == 2)}
        except (OSError, ValueError):
            continue
    return out


def snapshot(
    worker_pids: list[int], cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> dict[str, Any]:
    """The counters at one moment: wall clock, the main process's threads, each worker's CPU ticks (and both in
    ns from schedstat, where the kernel keeps it), context switches, and the cgroups' cpu.stat."""
    me = os.getpid()
    return {
        "wall_ns": time.time_ns(),
        "threads": _threads(me),
        "workers": {pid: _stat_ticks(f"/proc/{pid}/stat") for pid in worker_pids},
        "threads_ns": _tasks_ns(me),
        "workers_ns": {pid: _process_ns(pid) for pid in worker_pids},
        "switches": {pid: _switches(pid) for pid in [me, *worker_pids]},
        "cgroups": _cgroup_stats(cgroup_root, proc_cgroup),
    }


def edge_snapshot(
    worker_pids: list[int], cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> dict[str, Any]:
    """The counters at one moment, read fast enough not to stretch a profiled step around them (a few system calls,
    no walk over the main process's threads): the main process's CPU time from its own CPU clock (every thread's,
    no per-thread split), each worker's from its CPU-time clock, involuntary switches (getrusage for the main
    process), and the cgroups' cpu.stat."""
    return {
        "wall_ns": time.time_ns(),
        "process_ns": time.process_time_ns(),
        "workers_ns": {pid: _cpu_clock_ns(pid) for pid in worker_pids},
        "switches": {os.getpid(): resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw}
        | {pid: _switches(pid) for pid in worker_pids},
        "cgroups": _cgroup_stats(cgroup_root, proc_cgroup),
    }


def _clocked(before: dict[str, Any], after: dict[str, Any]) -> tuple[dict, dict, dict, dict, float, str]:
    """The per-thread and per-worker counters of both snapshots on one clock, its unit in seconds, and its name:
    schedstat's ns where both snapshots have them (a kernel that keeps no schedstats reads 0), else clock ticks."""
    if before.get("threads_ns") and after.get("threads_ns") and sum(after["threads_ns"].values()) > 0:
        return before["threads_ns"], after["threads_ns"], before["workers_ns"], after["workers_ns"], 1e-9, "schedstat"
    ticks = lambda threads: {tid: t for tid, (_, t) in threads.items()}  # noqa: E731
    unit = 1 / os.sysconf("SC_CLK_TCK")
    return ticks(before["threads"]), ticks(after["threads"]), before["workers"], after["workers"], unit, "ticks"


def window_use(before: dict[str, Any], after: dict[str, Any], budget_cpus: float | None) -> dict[str, Any]:
    """What the window used: CPU seconds per part, CPUs used against the budget, throttling, and a sentence."""
    seconds = (after["wall_ns"] - before["wall_ns"]) / 1e9
    if "process_ns" in before and "process_ns" in after:  # edge_snapshot: the process's CPU clock, no thread split
        threads, workers_0, workers_1, unit, clock = None, before["workers_ns"], after["workers_ns"], 1e-9, "cpu clocks"
        main_s = (after["process_ns"] - before["process_ns"]) * unit
        unit_lag = TICK_LAG_S
    else:
        threads_0, threads_1, workers_0, workers_1, unit, clock = _clocked(before, after)
        names = {tid: name for tid, (name, _) in after["threads"].items()}
        threads = {
            tid: (names.get(tid, "?"), (v - threads_0[tid]) * unit) for tid, v in threads_1.items() if tid in threads_0
        }
        main_s = sum(s for _, s in threads.values())
        unit_lag = unit
    workers = {
        str(pid): None if v is None or workers_0.get(pid) is None else (v - workers_0[pid]) * unit
        for pid, v in workers_1.items()
    }
    gone = [pid for pid, s in workers.items() if s is None]
    total = main_s + sum(s for s in workers.values() if s)
    counted = (1 if threads is None else len(threads)) + len(workers) - len(gone)
    out = {
        "window_s": round(seconds, 4),
        "main_cpu_s": round(main_s, 3),
        "threads_cpu_s": None  # edge_snapshot reads the process whole
        if threads is None
        else {f"{name} {tid}": round(s, 3) for tid, (name, s) in sorted(threads.items(), key=lambda t: -t[1][1]) if s},
        "workers_cpu_s": {pid: None if s is None else round(s, 3) for pid, s in workers.items()},
        "cpus_used": round(total / seconds, 3) if seconds > 0 else None,
        "budget_cpus": budget_cpus,
        "cpu_clock": clock,
        # each counted thread or process read to one unit of its clock (a tick's lag for the CPU clocks)
        "resolution_cpus": round(counted * unit_lag / seconds, 4) if seconds > 0 else None,
        "nonvoluntary_switches": {
            str(pid): after["switches"][pid] - before["switches"][pid]
            for pid in after["switches"]
            if after["switches"][pid] is not None and before["switches"].get(pid) is not None
        },
        "note": f"workers {', '.join(gone)} ended inside the window: their CPU time is not counted" if gone else None,
    }
    out.update(throttling(before["cgroups"], after["cgroups"], seconds))
    out["cpu_bound"], out["cpu_sentence"] = cpu_sentence(out)
    return out


def throttling(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], seconds: float) -> dict[str, Any]:
    """The most throttled cgroup on the way up over the window (cpu.stat's throttled_usec and nr_throttled)."""
    deltas = [
        (after[d].get("throttled_usec", 0) - before[d].get("throttled_usec", 0), d)
        for d in after
        if d in before and "throttled_usec" in after[d]
    ]
    if not deltas:
        return {"throttled_s": None, "throttled_share": None, "nr_throttled": None, "throttle_source": None}
    usec, d = max(deltas)
    return {
        "throttled_s": round(usec / 1e6, 4),
        "throttled_share": round(usec / 1e6 / seconds, 4) if seconds > 0 else None,
        "nr_throttled": after[d].get("nr_throttled", 0) - before[d].get("nr_throttled", 0),
        "throttle_source": os.path.join(d, "cpu.stat"),
    }


def cpu_sentence(use: dict[str, Any]) -> tuple[bool | None, str | None]:
    """Whether the job was CPU-bound (its budget used up, or the cgroup throttled it), and the sentence. Where the
    clock reads the window too coarsely (resolution_cpus above COARSE_AT of the budget), the budget is not judged."""
    used, budget, share = use["cpus_used"], use["budget_cpus"], use["throttled_share"]
    if used is None:
        return None, None
    said = f"{used:.2f} of the budget's {budget:g} CPUs used" if budget else f"{used:.2f} CPUs used"
    coarse = bool(budget) and (use.get("resolution_cpus") or 0) > COARSE_AT * budget
    if coarse:
        said += f" (+/- {use['resolution_cpus']:.2f}: the window is too short for the clock ticks to judge the budget)"
    if share is not None:
        said += f", throttled {100 * share:.0f}% of the window"
    full = bool(budget) and not coarse and used >= BUSY_AT * budget
    throttled = share is not None and share >= THROTTLED_AT
    if full or throttled:
        return True, f"{said}: CPU-bound"
    return (None if coarse else False), said
