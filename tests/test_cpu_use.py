"""CPU use over a window (steplens/job/cpu_use.py): CPU seconds per part, CPUs used against the budget, throttling."""

import os
import subprocess
import sys
import time

from steplens.job import cpu_use

TICK = os.sysconf("SC_CLK_TCK")


def counters(wall_s, main_ticks, worker_ticks, throttled_usec=None, nr=0, switches=0):
    cgroups = {} if throttled_usec is None else {"/cg/job": {"throttled_usec": throttled_usec, "nr_throttled": nr}}
    return {
        "wall_ns": int(wall_s * 1e9),
        "threads": {"10": ("python", main_ticks), "11": ("pt_thread", 0)},
        "workers": dict(worker_ticks),
        "switches": {10: switches, 20: None},
        "cgroups": cgroups,
    }


def test_cpus_used_add_the_main_process_and_the_workers_over_the_window():
    before = counters(100, 0, {20: 0, 21: 0}, throttled_usec=0)
    after = counters(102, 2 * TICK, {20: TICK, 21: TICK // 2}, throttled_usec=50_000, nr=3, switches=7)
    use = cpu_use.window_use(before, after, 4)
    assert use["window_s"] == 2 and use["main_cpu_s"] == 2
    assert use["workers_cpu_s"] == {"20": 1.0, "21": 0.5}
    assert use["cpus_used"] == 1.75  # 3.5 CPU seconds in 2 s
    assert use["throttled_s"] == 0.05 and use["throttled_share"] == 0.025 and use["nr_throttled"] == 3
    assert use["nonvoluntary_switches"] == {"10": 7}
    assert (
        use["cpu_bound"] is False
        and use["cpu_sentence"] == "1.75 of the budget's 4 CPUs used, throttled 2% of the window"
    )


def test_a_used_up_budget_or_a_throttled_window_is_cpu_bound():
    before = counters(0, 0, {20: 0}, throttled_usec=0)
    full = cpu_use.window_use(before, counters(1, TICK, {20: TICK}, throttled_usec=0), 2)
    assert full["cpu_bound"] is True and full["cpu_sentence"].endswith(": CPU-bound")
    throttled = cpu_use.window_use(before, counters(1, TICK // 2, {20: 0}, throttled_usec=200_000), 4)
    assert throttled["cpu_bound"] is True and "throttled 20%" in throttled["cpu_sentence"]


def test_a_worker_that_ended_inside_the_window_is_said_not_counted():
    use = cpu_use.window_use(counters(0, 0, {20: 0, 21: 0}), counters(1, 0, {20: TICK, 21: None}), 2)
    assert use["workers_cpu_s"] == {"20": 1.0, "21": None}
    assert "workers 21 ended inside the window" in use["note"]
    assert use["throttled_s"] is None and "throttled" not in use["cpu_sentence"]


def test_snapshot_reads_this_process_and_the_cgroups_on_the_way_up(tmp_path):
    root = tmp_path / "cgroup"
    (root / "pod" / "ctr").mkdir(parents=True)
    (root / "pod" / "cpu.stat").write_text("usage_usec 10\nnr_throttled 4\nthrottled_usec 9000\n")
    (root / "pod" / "ctr" / "cpu.stat").write_text("usage_usec 10\n")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/pod/ctr\n")
    first = cpu_use.snapshot([], str(root), str(own))
    sum(i * i for i in range(2_000_000))  # some CPU time for this process
    (root / "pod" / "cpu.stat").write_text("usage_usec 10\nnr_throttled 6\nthrottled_usec 29000\n")
    second = cpu_use.snapshot([], str(root), str(own))
    assert str(os.getpid()) in first["threads"]
    use = cpu_use.window_use(first, second, 2)
    assert use["throttle_source"] == str(root / "pod" / "cpu.stat")
    assert use["throttled_s"] == 0.02 and use["nr_throttled"] == 2
    assert use["main_cpu_s"] >= 0 and use["cpus_used"] is not None


def test_schedstat_nanoseconds_are_read_where_both_ends_have_them():
    """With schedstat's ns in both snapshots the ticks are not used, and the reading is exact to the ns."""
    before = {**counters(0, 0, {20: 0}), "threads_ns": {"10": 0, "11": 0}, "workers_ns": {20: 0}}
    after = {
        **counters(0.05, 0, {20: 0}),  # the ticks saw nothing in 50 ms
        "threads_ns": {"10": 30_000_000, "11": 5_000_000},
        "workers_ns": {20: 40_000_000},
    }
    use = cpu_use.window_use(before, after, 2)
    assert use["cpu_clock"] == "schedstat" and use["resolution_cpus"] == 0
    assert use["main_cpu_s"] == 0.035 and use["workers_cpu_s"] == {"20": 0.04}
    assert use["cpus_used"] == 1.5 and use["cpu_bound"] is False  # 75 ms of CPU in 50 ms, below 90% of 2


def test_a_kernel_without_schedstats_falls_back_to_ticks_and_a_short_window_is_not_judged():
    """schedstat reading 0 (schedstats off): the ticks count; over 50 ms they read 3 counters to +/- 0.6 CPUs, too
    coarse to judge a 2-CPU budget, so neither CPU-bound nor not."""
    zeros = {"threads_ns": {"10": 0, "11": 0}, "workers_ns": {20: 0}}
    before, after = {**counters(0, 0, {20: 0}), **zeros}, {**counters(0.05, TICK // 100 * 5, {20: 0}), **zeros}
    use = cpu_use.window_use(before, after, 2)
    assert use["cpu_clock"] == "ticks"
    assert use["resolution_cpus"] == round(3 / TICK / 0.05, 4)
    assert use["cpu_bound"] is None and "too short for the clock ticks" in use["cpu_sentence"]


def test_the_edge_read_takes_the_process_whole_from_its_cpu_clocks(monkeypatch):
    """Profile mode's edge read (edge_snapshot) walks no thread of the main process (the walk took 2 to 7 ms on an
    NVIDIA H200 machine and stretched the profiled steps around it); the main process's CPU seconds equal its own
    CPU clock's, a worker's equal the sum of its threads' schedstat, and the window has no per-thread split."""
    worker = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"])
    try:
        listed = []
        real_listdir = os.listdir
        monkeypatch.setattr(cpu_use.os, "listdir", lambda path: listed.append(path) or real_listdir(path))
        p0 = time.process_time_ns()
        before = cpu_use.edge_snapshot([worker.pid])
        x = 0
        while time.process_time_ns() - p0 < 200_000_000:  # 0.2 CPU s in this process
            x += 1
        after = cpu_use.edge_snapshot([worker.pid])
        p1 = time.process_time_ns()
        worker_ns = cpu_use._process_ns(worker.pid)
    finally:
        worker.kill()
        worker.wait()
    assert f"/proc/{os.getpid()}/task" not in listed, listed
    use = cpu_use.window_use(before, after, 2)
    assert use["cpu_clock"] == "cpu clocks" and use["threads_cpu_s"] is None
    assert abs(use["resolution_cpus"] - 2 * cpu_use.TICK_LAG_S / use["window_s"]) < 1e-3, "a tick's lag per process"
    assert 0.2 <= use["main_cpu_s"] <= (p1 - p0) / 1e9 + 0.001, use
    assert 0 < after["workers_ns"][worker.pid] <= worker_ns, (after["workers_ns"], worker_ns)
    assert set(use["nonvoluntary_switches"]) == {str(os.getpid()), str(worker.pid)}
    assert abs(use["cpus_used"] - (use["main_cpu_s"] + use["workers_cpu_s"][str(worker.pid)]) / use["window_s"]) < 0.01


def test_a_worker_gone_before_the_edge_read_is_named_not_counted():
    """A worker that ended: its CPU clock cannot be read, so the window says so and counts it nowhere."""
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    before = cpu_use.edge_snapshot([worker.pid])
    worker.wait()
    after = cpu_use.edge_snapshot([worker.pid])
    use = cpu_use.window_use(before, after, 2)
    assert use["workers_cpu_s"] == {str(worker.pid): None} and str(worker.pid) in use["note"]
