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
