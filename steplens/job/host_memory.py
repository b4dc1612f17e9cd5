"""Host memory at a moment: the proportional set size (PSS) of the main process and of the DataLoader workers
together (forked workers share pages, which RSS would count in each), each one's peak resident set, and /dev/shm."""

from __future__ import annotations

import os
from typing import Any

MB = 2**20


def _status_kb(path: str, key: str) -> int | None:
    """A "Key:  N kB" line of a /proc status-like file, in kB; None where the file or the line is missing."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process(pid: int, proc: str = "/proc") -> dict[str, float | None]:
    """One process's PSS now (smaps_rollup) and its peak RSS since it started (status VmHWM), in MB."""
    pss = _status_kb(os.path.join(proc, str(pid), "smaps_rollup"), "Pss")
    peak = _status_kb(os.path.join(proc, str(pid), "status"), "VmHWM")
    return {
        "pss_mb": None if pss is None else round(pss / 1024, 1),
        "peak_rss_mb": None if peak is None else round(peak / 1024, 1),
    }


def shared_memory(path: str = "/dev/shm") -> dict[str, float | None]:
    """/dev/shm's size and use now, in MB (None where it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return {"shm_size_mb": None, "shm_used_mb": None}
    return {
        "shm_size_mb": round(st.f_blocks * st.f_frsize / MB, 1),
        "shm_used_mb": round((st.f_blocks - st.f_bfree) * st.f_frsize / MB, 1),
    }


def read(worker_pids: list[int], proc: str = "/proc", shm: str = "/dev/shm") -> dict[str, Any]:
    """The main process's and the workers' memory now, and /dev/shm's; the workers' PSS summed (None if one is
    unreadable, e.g. it ended)."""
    main = process(os.getpid(), proc)
    workers = {str(pid): process(pid, proc) for pid in worker_pids}
    pss = [w["pss_mb"] for w in workers.values()]
    return {
        "main_pss_mb": main["pss_mb"],
        "main_peak_rss_mb": main["peak_rss_mb"],
        "workers_pss_mb": None if None in pss else round(sum(pss), 1),
        "workers": workers,
        **shared_memory(shm),
        "note": "PSS and /dev/shm use when read (just after the window); peak RSS since each process started",
    }


def _largest(values: list[float | None]) -> float | None:
    return None if not values or None in values else max(values)


def peak(reads: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest of several reads (read() at a window's edges): PSS of the main process, of the workers, and of
    both together, and /dev/shm's use; each peak resident set from the last read (VmHWM only grows). A figure is
    None where a read lacks it. Reads at the edges only: a lower bound of the peak inside the window."""
    parts = [(r["main_pss_mb"], r["workers_pss_mb"]) for r in reads]
    total = _largest([None if m is None or w is None else m + w for m, w in parts])
    last = reads[-1] if reads else {}
    return {
        "pss_peak_mb": None if total is None else round(total, 1),
        "main_pss_peak_mb": _largest([m for m, _ in parts]),
        "workers_pss_peak_mb": _largest([r["workers_pss_mb"] for r in reads]),
        "shm_peak_mb": _largest([r["shm_used_mb"] for r in reads]),
        "shm_size_mb": last.get("shm_size_mb"),
        "main_peak_rss_mb": last.get("main_peak_rss_mb"),
        "workers_peak_rss_mb": {pid: w["peak_rss_mb"] for pid, w in (last.get("workers") or {}).items()},
        "reads": len(reads),
        "note": "the largest of the reads at the window's edges: a lower bound of the peak inside it; peak RSS "
        "(VmHWM) since each process started",
    }
