"""Host memory (steplens/job/host_memory.py): PSS now, peak RSS, /dev/shm."""

import os

from steplens.job import host_memory


def test_this_process_reads_a_pss_no_larger_than_its_peak_resident_set():
    now = host_memory.read([])
    assert now["main_pss_mb"] > 0 and now["main_pss_mb"] <= now["main_peak_rss_mb"]
    assert now["workers"] == {} and now["workers_pss_mb"] == 0
    if now["shm_size_mb"] is not None:
        assert 0 <= now["shm_used_mb"] <= now["shm_size_mb"]


def test_the_workers_pss_adds_up_and_an_ended_worker_leaves_it_unknown(tmp_path):
    for pid, pss, peak in ((11, 2048, 4096), (12, 1024, 3072)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "smaps_rollup").write_text(f"Rss:  9999 kB\nPss:  {pss} kB\n")
        (tmp_path / str(pid) / "status").write_text(f"Name: python\nVmHWM:  {peak} kB\n")
    me = tmp_path / str(os.getpid())
    me.mkdir()
    (me / "smaps_rollup").write_text("Pss: 5120 kB\n")
    (me / "status").write_text("VmHWM: 10240 kB\n")
    got = host_memory.read([11, 12], proc=str(tmp_path), shm=str(tmp_path / "no-shm"))
    assert got["main_pss_mb"] == 5.0 and got["main_peak_rss_mb"] == 10.0
    assert got["workers"] == {"11": {"pss_mb": 2.0, "peak_rss_mb": 4.0}, "12": {"pss_mb": 1.0, "peak_rss_mb": 3.0}}
    assert got["workers_pss_mb"] == 3.0
    assert got["shm_size_mb"] is None and got["shm_used_mb"] is None
    ended = host_memory.read([11, 13], proc=str(tmp_path))
    assert ended["workers"]["13"] == {"pss_mb": None, "peak_rss_mb": None} and ended["workers_pss_mb"] is None


def read_of(main, workers, shm):
    return {"main_pss_mb": main, "workers_pss_mb": workers, "shm_used_mb": shm, "shm_size_mb": 64.0, "workers": {}}


def test_the_peak_of_two_reads_is_their_larger_and_together_no_more_than_the_parts_peaks():
    """Main and workers peak at different reads: together is the larger sum, at most the sum of the parts' peaks."""
    got = host_memory.peak([read_of(500.0, 300.0, 2.0), read_of(450.0, 400.0, 1.0)])
    assert got["main_pss_peak_mb"] == 500.0 and got["workers_pss_peak_mb"] == 400.0
    assert got["pss_peak_mb"] == 850.0 <= got["main_pss_peak_mb"] + got["workers_pss_peak_mb"]
    assert got["shm_peak_mb"] == 2.0 and got["reads"] == 2


def test_a_read_without_a_figure_leaves_its_peak_unknown():
    """A worker that ended (workers PSS None) leaves the workers' and the combined peak None, not 0."""
    got = host_memory.peak([read_of(500.0, None, 2.0), read_of(450.0, 400.0, None)])
    assert got["workers_pss_peak_mb"] is None and got["pss_peak_mb"] is None and got["shm_peak_mb"] is None
    assert got["main_pss_peak_mb"] == 500.0
