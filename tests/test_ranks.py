"""steplens ranks on hand-built per-rank traces with known answers: exposed communication, alignment, the slow rank."""

import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from steplens import stats
from steplens.project import ranks

MAIN = {"pid": 1, "tid": 1}
SIX = (2, 3, 4, 7, 8, 9)  # the aligned steps of the default profile: two cycles of three


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    ev = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def write(path, events, rank=None, world=2):
    doc = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": events,
        }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w") as f:
        json.dump(doc, f)
    return path


def gpu_rank(t0, next_batch, nccl, compute, steps=(1, 2), period=1000):
    """Steps of `period` us from clock t0; each step: next_batch CPU time, a compute kernel, an NCCL kernel."""
    events = []
    for i, n in enumerate(steps):
        a = t0 + i * period
        events += [
            x(f"ProfilerStep#{n}", "user_annotation", a, period),
            x("input/next_batch", "user_annotation", a, next_batch),
            x("train/forward_backward", "user_annotation", a + next_batch, 50),
            x("void conv()", "kernel", a + compute[0], compute[1], pid=0, tid=7, stream=7),
            x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", a + nccl[0], nccl[1], pid=0, tid=20, stream=20),
        ]
    return events


def test_exposed_nccl_time_is_what_compute_kernels_do_not_cover():
    """NCCL [500, 900) with compute [400, 600) on another stream: comm 400, exposed 300, work = wall - 300."""
    t = ranks.timelines(gpu_rank(0, 100, nccl=(500, 400), compute=(400, 200), steps=(1,)))
    assert t["source"] == "nccl kernels"
    fig = ranks.step_figures(t, 1, 0, 1000, {})
    assert (fig["comm_us"], fig["exposed_comm_us"], fig["work_us"]) == (400, 300, 700)
    assert fig["scopes_less_wait_us"] == fig["scopes_cpu_us"], "a GPU wait is no CPU scope time"


def test_cpu_collective_launched_inside_an_operator_is_not_compute():
    """gloo, as the CPU traces show it: autograd's evaluate_function encloses DDP's c10d::allreduce_
    launch, gloo's thread runs gloo:all_reduce, and the main thread then blocks with no operator
    (the reducer's wait at the end of backward). Comm 210..850; compute is mm 10..200 and the
    enclosing operator less the launch (200..210, 250..260): exposed 640 - 10 = 630, all of it
    inside train/forward_backward."""
    events = [
        x("ProfilerStep#3", "user_annotation", 0, 1000),
        x("train/forward_backward", "user_annotation", 0, 900),
        x("aten::mm", "cpu_op", 10, 190),
        x("autograd::engine::evaluate_function: AccumulateGrad", "cpu_op", 200, 60),
        x("c10d::allreduce_", "cpu_op", 210, 40),
        x("gloo:all_reduce", "user_annotation", 250, 600, tid=99),
        x("train/optimizer", "user_annotation", 900, 80),
        x("aten::add_", "cpu_op", 910, 60),
    ]
    t = ranks.timelines(events)
    assert t["source"].startswith("cpu")
    fig = ranks.step_figures(t, 3, 0, 1000, {})
    assert fig["comm_us"] == 640 and fig["exposed_comm_us"] == 630 and fig["work_us"] == 370
    assert fig["scopes_less_wait_us"]["train/forward_backward"] == 900 - 630
    assert fig["scopes_less_wait_us"]["train/optimizer"] == 80


def test_each_threads_operators_less_its_own_collectives_are_compute_whatever_order_the_threads_come_in():
    """Operators of three threads, interleaved: (pid 1, tid 1) runs aten::mm 0..100 around a collective 30..70;
    (pid 2, tid 1), another process's thread of the same tid, runs 32..38; (pid 1, tid 2) runs 40..60. Only
    thread (1, 1)'s own collective is taken from its operators: compute is 0..30, 32..38, 40..60, 70..100."""
    events = [
        x("ProfilerStep#3", "user_annotation", 0, 100),
        x("aten::mm", "cpu_op", 0, 100),
        x("aten::add", "cpu_op", 32, 6, pid=2, tid=1),
        x("aten::mul", "cpu_op", 40, 20, tid=2),
        x("c10d::allreduce_", "cpu_op", 30, 40),
        x("aten::sub", "cpu_op", 0, 10, tid=2),
    ]
    t = ranks.timelines(events)
    assert t["source"].startswith("cpu") and t["comm"] == [[30, 70]]
    assert t["compute"] == [[0, 30], [32, 38], [40, 60], [70, 100]], t["compute"]


def test_no_communication_gives_null_with_a_reason():
    events = [x("ProfilerStep#1", "user_annotation", 0, 100), x("aten::mm", "cpu_op", 0, 50)]
    t = ranks.timelines(events)
    fig = ranks.step_figures(t, 1, 0, 100, {})
    assert t["source"] is None and fig["exposed_comm_us"] is None and fig["work_us"] is None


def test_ranks_align_on_step_numbers_not_clocks_and_name_the_slow_rank(tmp_path):
    """Rank 1's clock is a billion us ahead and it spends 600 us in next_batch; rank 0 waits in NCCL.
    Aligned by step number over the two cycles' six steps: rank 1 is the slowest and input/next_batch its stage."""
    fast = write(
        str(tmp_path / "traces" / "rank0" / "a.pt.trace.json"),
        gpu_rank(0, 50, nccl=(100, 800), compute=(60, 40), steps=SIX),
        rank=0,
    )
    slow = write(
        str(tmp_path / "traces" / "rank1" / "b.pt.trace.json.gz"),
        gpu_rank(1e9, 650, nccl=(850, 50), compute=(660, 180), steps=SIX),
        rank=1,
    )
    found = ranks.find_traces([str(tmp_path / "traces")])
    assert found == {0: [fast], 1: [slow]}
    result = ranks.across([ranks.rank_figures(p, r) for r, p in sorted(found.items())])
    assert result["steps_aligned"] == list(SIX)
    assert result["slowest_rank"] == 1 and result["slow_stage"] == "input/next_batch"
    assert result["stage_excess_us"]["input/next_batch"] == 600
    r0, r1 = result["per_rank"]["0"], result["per_rank"]["1"]
    assert (r0["exposed_comm_us"], r1["exposed_comm_us"]) == (800, 50)
    assert (r0["work_us"], r1["work_us"]) == (200, 950)
    assert all(s["spread"]["work_us"] == 750 and s["slowest_rank"] == 1 for s in result["per_step"])
    assert "slowest rank 1" in result["verdict"] and "input/next_batch" in result["verdict"]


def test_steps_present_on_one_rank_only_are_left_out_and_named(tmp_path):
    a = write(str(tmp_path / "a.json"), gpu_rank(0, 50, (100, 800), (60, 40), steps=(1, 2, 3)), rank=0)
    b = write(str(tmp_path / "b.json"), gpu_rank(0, 650, (850, 50), (660, 180), steps=(2, 3)), rank=1)
    result = ranks.across([ranks.rank_figures([a]), ranks.rank_figures([b])])
    assert result["steps_aligned"] == [2, 3] and result["steps_missing"] == {"1": [1]}


def test_one_rank_or_disjoint_steps_are_errors(tmp_path):
    a = write(str(tmp_path / "a.json"), gpu_rank(0, 50, (100, 800), (60, 40), steps=(1,)), rank=0)
    b = write(str(tmp_path / "b.json"), gpu_rank(0, 50, (100, 800), (60, 40), steps=(5,)), rank=1)
    with pytest.raises(ranks.RanksError, match="two or more"):
        ranks.across([ranks.rank_figures([a])])
    with pytest.raises(ranks.RanksError, match="share no ProfilerStep"):
        ranks.across([ranks.rank_figures([a]), ranks.rank_figures([b])])


def test_rank_comes_from_the_trace_and_a_contradicting_folder_is_an_error(tmp_path):
    events = gpu_rank(0, 50, (100, 800), (60, 40), steps=(1,))
    assert ranks.trace_rank(write(str(tmp_path / "rank3" / "t.json"), events)) == 3
    assert ranks.trace_rank(write(str(tmp_path / "anywhere" / "t.json"), events, rank=2)) == 2
    with pytest.raises(ranks.RanksError, match="says rank 2"):
        ranks.trace_rank(write(str(tmp_path / "rank5" / "t.json"), events, rank=2))
    with pytest.raises(ranks.RanksError, match="which rank"):
        ranks.trace_rank(write(str(tmp_path / "plain" / "t.json"), events))


def test_cli_prints_the_verdict_and_fails_in_one_line_on_one_rank(tmp_path):
    write(str(tmp_path / "rank0" / "a.pt.trace.json"), gpu_rank(0, 50, (100, 800), (60, 40), steps=SIX), rank=0)
    write(str(tmp_path / "rank1" / "b.pt.trace.json"), gpu_rank(0, 650, (850, 50), (660, 180), steps=SIX), rank=1)
    proc = subprocess.run(
        [sys.executable, "-m", "steplens", "ranks", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "slowest rank 1" in proc.stdout and "input/next_batch takes 0.6 ms more" in proc.stdout
    one = subprocess.run(
        [sys.executable, "-m", "steplens", "ranks", str(tmp_path / "rank0")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one.returncode == 1 and one.stderr.count("\n") == 1 and "two or more" in one.stderr


def running_ahead_rank(t0, steps=(1, 2, 3, 4), period=100, gpu_period=300):
    """Steps of `period` us on the CPU, each launching a compute and an NCCL kernel (by correlation id) that
    the GPU runs `gpu_period` us apart, from 400 us on: the GPU lags the CPU by several steps."""
    events = []
    for i, n in enumerate(steps):
        a, g = t0 + i * period, t0 + 400 + i * gpu_period
        events += [
            x(f"ProfilerStep#{n}", "user_annotation", a, period),
            x("input/next_batch", "user_annotation", a, 10),
            x("train/forward_backward", "user_annotation", a + 10, 80),
            x("cudaLaunchKernel", "cuda_runtime", a + 20, 2, correlation=2 * n),
            x("cudaLaunchKernel", "cuda_runtime", a + 30, 2, correlation=2 * n + 1),
            x("void conv()", "kernel", g, 200, pid=0, tid=7, stream=7, correlation=2 * n),
            x(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "kernel",
                g + 200,
                100,
                pid=0,
                tid=20,
                stream=20,
                correlation=2 * n + 1,
            ),
        ]
    return events


def test_a_rank_whose_cpu_runs_ahead_has_no_gpu_comm_figures_and_the_result_says_so(tmp_path):
    """Rank 0's kernels run 300-1300 us after the CPU steps that launched them: its NCCL kernels, clipped to
    the CPU's steps, would be other steps' communication. Its comm, exposed comm and work are null with the
    reason, its CPU figures stay, and the ranks are compared by wall time, saying what was unavailable."""
    ahead = write(str(tmp_path / "rank0" / "a.pt.trace.json"), running_ahead_rank(0), rank=0)
    keeps_up = write(
        str(tmp_path / "rank1" / "b.pt.trace.json"),
        gpu_rank(1e9, 30, nccl=(60, 20), compute=(40, 10), steps=(1, 2, 3, 4), period=100),
        rank=1,
    )
    r0 = ranks.rank_figures([ahead])
    assert r0["comm_source"] == "nccl kernels" and r0["comm_null_reason"].startswith(ranks.RUNS_AHEAD)
    for s in r0["steps"]:
        assert s["comm_us"] is None and s["exposed_comm_us"] is None and s["work_us"] is None, s
        assert s["comm_null_reason"] == ranks.RUNS_AHEAD
        assert s["wall_us"] == 100 and s["next_batch_cpu_us"] == 10
        assert s["scopes_cpu_us"]["train/forward_backward"] == 80 and s["scopes_less_wait_us"] == s["scopes_cpu_us"]
    r1 = ranks.rank_figures([keeps_up])
    assert r1["comm_null_reason"] is None and all(s["exposed_comm_us"] == 20 for s in r1["steps"])
    result = ranks.across([r0, r1])
    assert result["slowest_by"] == "wall_us"
    assert result["figures_unavailable"] == {"0": f"comm, exposed_comm and work: {ranks.RUNS_AHEAD}"}
    assert result["per_rank"]["0"]["work_us"] is None and result["per_rank"]["1"]["work_us"] == 80
    assert result["per_rank"]["0"]["scopes_us"]["input/next_batch"] == 10
    assert result["spread_median_us"]["work_us"] is None
    assert "work unavailable on rank 0" in result["verdict"] and ranks.RUNS_AHEAD in result["verdict"]
    assert ranks.headline(result)["max_exposed_comm_share"] is None
    assert "rank 0: n/a: comm, exposed_comm and work" in ranks.format_text(result)


def made(rank, next_batch_ms, forward_ms=None, steps=SIX):
    """A rank's per-step figures as rank_figures gives them (gloo): per step, next_batch and forward_backward
    (less wait) in ms; wall 100 ms, the rest exposed communication (the wait for the others)."""
    forward_ms = forward_ms or [20.0] * len(steps)
    out = []
    for n, nb, fb in zip(steps, next_batch_ms, forward_ms):
        scopes = {name: 0.0 for name in ranks.SCOPES}
        scopes.update({"input/next_batch": nb * 1e3, "train/forward_backward": fb * 1e3})
        work = sum(scopes.values())
        out.append(
            {
                "step": n,
                "wall_us": 100e3,
                "gpu_idle_us": None,
                "input_gap_us": None,
                "scopes_cpu_us": dict(scopes),
                "next_batch_cpu_us": scopes["input/next_batch"],
                "comm_null_reason": None,
                "comm_us": 100e3 - work,
                "exposed_comm_us": 100e3 - work,
                "work_us": work,
                "scopes_less_wait_us": scopes,
            }
        )
    return {
        "rank": rank,
        "traces": [f"rank{rank}.json"],
        "comm_source": "cpu (gloo/c10d operators)",
        "comm_null_reason": None,
        "steps": out,
        "drawn": [],
    }


def test_a_rank_slowest_in_every_aligned_step_is_named_with_its_consistent_stage():
    """Rank 1's next_batch is 5 ms longer in each of the six steps; its forward_backward is 30 ms longer in one
    step only (a larger mean excess, but no consistent one). Rank 1 is named (p = 2/64) and its stage is
    input/next_batch."""
    result = ranks.across(
        [made(0, [1, 2, 1, 2, 1, 2]), made(1, [6, 7, 6, 7, 6, 7], forward_ms=[20, 20, 20, 20, 20, 80])]
    )
    test = result["straggler_test"]
    assert (test["slowest_in"], test["steps"], test["steps_needed"]) == (6, 6, 6)
    assert test["p"] == pytest.approx(2 / 64)
    assert result["slowest_rank"] == 1 and result["slow_stage"] == "input/next_batch", result["verdict"]
    assert result["stage_excess_us"]["train/forward_backward"] > result["stage_excess_us"]["input/next_batch"]
    assert result["stage_test"]["train/forward_backward"]["more_in"] == 1
    assert result["verdict"].startswith("slowest rank 1: the slowest in 6 of 6 aligned steps")
    assert ranks.headline(result)["slowest_rank"] == 1


def test_ranks_slowest_by_turns_name_no_straggler_and_keep_the_table():
    """Rank 0 is 5 ms slower in steps 2-4, rank 1 in steps 7-9 (a symmetric run's noise): no straggler, no stage,
    the verdict says why, and the per-step table still shows each step's slowest rank."""
    result = ranks.across([made(0, [6, 6, 6, 1, 1, 1]), made(1, [1, 1, 1, 6, 6, 6])])
    assert result["slowest_rank"] is None and result["slow_stage"] is None
    assert [s["slowest_rank"] for s in result["per_step"]] == [0, 0, 0, 1, 1, 1]
    assert result["straggler_test"]["p"] == 1.0
    assert result["verdict"].startswith("no consistent straggler by work"), result["verdict"]
    assert "slowest in 3 of 6 aligned steps only" in result["verdict"]
    text = ranks.format_text(result)
    assert "#7" in text and "straggler test: rank" in text
    top = ranks.headline(result)
    assert top["slowest_rank"] is None and top["slow_stage"] is None and top["straggler_p"] == 1.0


def test_ranks_that_tie_in_every_step_name_no_straggler_and_ties_are_left_out_of_the_test():
    """Two identical ranks tie in every step: no rank is the slowest anywhere (not rank 0, the first of a tie),
    the verdict says they tie. Where rank 1 is slower in six steps and ties in six more, the test counts the six
    (p = 2/64) and the verdict says six more tied."""
    same = ranks.across([made(0, [3] * 6), made(1, [3] * 6)])
    assert same["slowest_rank"] is None and same["slow_stage"] is None, same["verdict"]
    assert [s["slowest_rank"] for s in same["per_step"]] == [None] * 6
    assert (same["straggler_test"]["steps"], same["straggler_test"]["tied_steps"]) == (0, 6)
    assert "tie for the slowest in every aligned step (6)" in same["verdict"]
    text = ranks.format_text(same)
    assert re.search(r"^#2 +tie ", text, re.M) and "0 of 0 aligned steps (6 tied, left out)" in text, text
    twelve = SIX + tuple(n + 100 for n in SIX)
    mixed = ranks.across([made(0, [1] * 6 + [3] * 6, steps=twelve), made(1, [6] * 6 + [3] * 6, steps=twelve)])
    test = mixed["straggler_test"]
    assert (test["slowest_in"], test["steps"], test["tied_steps"]) == (6, 6, 6)
    assert test["p"] == pytest.approx(2 / 64) and mixed["slowest_rank"] == 1
    assert mixed["verdict"].startswith("slowest rank 1: the slowest in 6 of 6 aligned steps (6 more tied)")


def test_too_few_aligned_steps_name_no_straggler_and_say_how_many_are_needed():
    """Five steps, rank 1 the slowest in all five: p = 2/32 cannot fall below 0.05; six steps are needed."""
    five = SIX[:5]
    result = ranks.across([made(0, [1] * 5, steps=five), made(1, [6] * 5, steps=five)])
    assert result["slowest_rank"] is None
    assert "too few aligned steps for a verdict (n=5, need 6 with 2 ranks)" in result["verdict"], result["verdict"]


def test_the_exact_sign_test_and_its_floor():
    """P(X >= k) for X ~ Binomial(n, chance), times the candidates: the floors 6, 4 and 3 steps for 2, 4, 8 ranks."""
    assert stats.sign_test_p(6, 6) == pytest.approx(1 / 64)
    assert stats.sign_test_p(6, 5, candidates=2) == pytest.approx(2 * 7 / 64)
    assert stats.sign_test_p(3, 3, chance=1 / 3, candidates=3) == pytest.approx(1 / 9)
    assert stats.sign_test_p(4, 0) == 1.0 and stats.sign_test_p(0, 0, candidates=2) == 1.0
    assert [stats.steps_needed(r, 1 / r) for r in (2, 4, 8)] == [6, 4, 3]
    three = ranks.across([made(0, [1] * 6), made(1, [2] * 6), made(2, [9] * 6)])
    assert three["slowest_rank"] == 2 and three["straggler_test"]["p"] == pytest.approx(3 / 3**6)


# --------------------------------------------------------------------------- ranks left out, and memory per rank


def three_ranks(tmp_path, world=3):
    """Ranks 0, 1 and 2 of a world of `world`, six aligned steps each, rank 1 slow in input/next_batch; each in its
    rank{R} folder. Returns {rank: path}."""
    shapes = {0: (50, (100, 800), (60, 40)), 1: (650, (850, 50), (660, 180)), 2: (60, (110, 790), (70, 40))}
    return {
        r: write(
            str(tmp_path / f"rank{r}" / "t.pt.trace.json.gz"), gpu_rank(0, *shapes[r], steps=SIX), rank=r, world=world
        )
        for r in range(3)
    }


def damage(path, how):
    """The trace at path damaged as users' traces are: cut short, emptied, or never JSON."""
    raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    if how == "cut gzip":
        data = gzip.compress(raw)
        data = data[: len(data) // 2]
    elif how == "cut json":
        data = gzip.compress(raw[: len(raw) // 2])
    elif how == "empty":
        data = b""
    elif how == "not json":
        data = gzip.compress(b"<html>502 Bad Gateway</html>")
    else:  # no ProfilerStep slices: the steps' events renamed
        data = gzip.compress(raw.replace(b"ProfilerStep#", b"Step#"))
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["cut gzip", "cut json", "empty", "not json", "no steps"])
def test_a_rank_whose_trace_is_unreadable_is_named_and_left_out_of_the_verdict(tmp_path, how, capsys):
    """Rank 2's trace damaged: steplens ranks names rank 2 and why, compares ranks 0 and 1 (rank 1 the straggler),
    and says in the verdict that one rank was left out; no traceback."""
    paths = three_ranks(tmp_path)
    damage(paths[2], how)
    assert ranks.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err.startswith("steplens ranks: rank 2 left out of the verdict: unreadable: ")
    assert err.count("\n") == 1, err
    assert "evidence across 2 ranks" in out and "left out: rank 2: unreadable" in out
    result = ranks.across([ranks.rank_figures([p], r) for r, p in paths.items()])
    assert result["ranks"] == [0, 1] and list(result["ranks_left_out"]) == ["rank 2"]
    assert result["slowest_rank"] == 1, result["verdict"]
    assert result["verdict"].endswith("(1 left out of the verdict: rank 2)"), result["verdict"]
    assert ranks.headline(result)["ranks_left_out"] == 1


def rewrite(path, change):
    """The rank trace at path with its events changed by change(events) (a list, edited in place)."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    change(doc["traceEvents"])
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def test_a_rank_whose_events_are_damaged_is_left_out_as_damaged_and_a_duplicate_changes_nothing(tmp_path):
    """Rank 2's step with a string-for-NaN start: the reader's damage pass withholds its figures, so rank 2 is left
    out as damaged (not as unreadable). An exact duplicate of a step slice in rank 0 leaves its figures as they were."""
    paths = three_ranks(tmp_path)
    clean = ranks.rank_figures([paths[0]], 0)
    rewrite(paths[0], lambda evs: evs.append(dict(evs[0])))
    assert ranks.rank_figures([paths[0]], 0) == clean
    rewrite(paths[2], lambda evs: evs[0].update(ts="NaN"))
    damaged = ranks.rank_figures([paths[2]], 2)
    assert damaged["left_out"].startswith("damaged: ") and paths[2] in damaged["left_out"], damaged["left_out"]
    result = ranks.across([ranks.rank_figures([p], r) for r, p in paths.items()])
    assert result["ranks"] == [0, 1] and result["ranks_left_out"]["rank 2"].startswith("damaged: ")


def test_a_bug_in_the_figures_is_not_passed_off_as_a_damaged_trace(tmp_path, monkeypatch):
    """An exception of this code's own arithmetic (here a KeyError) propagates: a reader sees the bug, not a rank
    "left out as unreadable"."""
    paths = three_ranks(tmp_path)

    def broken(*args, **kwargs):
        raise KeyError("wall_us")

    monkeypatch.setattr(ranks, "step_figures", broken)
    with pytest.raises(KeyError):
        ranks.rank_figures([paths[0]], 0)


def test_a_rank_without_a_trace_is_named_from_the_world_size(tmp_path):
    """The traces say world size 4 and ranks 0-2 wrote one: rank 3 is named as missing, the others compared."""
    three_ranks(tmp_path, world=4)
    found = ranks.locate([str(tmp_path)])
    assert sorted(found["by_rank"]) == [0, 1, 2]
    assert found["left_out"] == {"rank 3": "no trace found (the traces say world size 4)"}
    result = ranks.across([ranks.rank_figures(p, r) for r, p in sorted(found["by_rank"].items())], found["left_out"])
    assert result["ranks"] == [0, 1, 2] and "rank 3" in result["ranks_left_out"]
    assert "(1 left out of the verdict: rank 3)" in result["verdict"]


def test_an_unreadable_trace_of_no_known_rank_is_named_by_its_path(tmp_path):
    """A cut trace outside any rank{R} folder: its rank cannot be read, so the file is named and left out."""
    paths = three_ranks(tmp_path)
    stray = str(tmp_path / "stray.pt.trace.json.gz")
    with open(stray, "wb") as f:
        f.write(gzip.compress(b'{"schemaVersion": 1, "traceEvents": [' * 50)[:40])
    found = ranks.locate([str(tmp_path)])
    assert sorted(found["by_rank"]) == [0, 1, 2] and list(found["left_out"]) == [stray]
    assert "not a readable trace" in found["left_out"][stray]
    with pytest.raises(ranks.RanksError, match="not a readable trace"):
        ranks.trace_rank(stray)
    assert paths


def test_when_fewer_than_two_ranks_are_left_the_error_names_the_ones_left_out(tmp_path, capsys):
    paths = three_ranks(tmp_path)
    damage(paths[1], "empty")
    damage(paths[2], "not json")
    assert ranks.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 rank(s) only besides 2 left out (rank 1: unreadable" in err, err


def many_event_rank(path, rank, kernels=300, ops=300):
    """Six steps of a GPU rank, each with `kernels` compute kernels, `ops` CPU operators and one NCCL kernel: a trace
    whose events outnumber its steps' figures by hundreds."""
    events = []
    for i, n in enumerate(SIX):
        a = i * 10_000
        events += [
            x(f"ProfilerStep#{n}", "user_annotation", a, 10_000),
            x("input/next_batch", "user_annotation", a, 100),
            x("train/forward_backward", "user_annotation", a + 100, 9_000),
            x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", a + 8_000, 500, pid=0, tid=20, stream=20),
        ]
        events += [x("void conv()", "kernel", a + 100 + 3 * k, 2, pid=0, tid=7, stream=7) for k in range(kernels)]
        events += [x("aten::conv2d", "cpu_op", a + 100 + 2 * k, 1.0) for k in range(ops)]
    return write(path, events, rank=rank, world=4)


def test_memory_grows_by_what_each_rank_keeps_not_by_its_trace(tmp_path):
    """Four ranks read one after another (the same trace, relabelled). What a rank keeps (its figures: the memory
    freed when they are dropped) is under a twentieth of what reading its trace takes, and what stays between one
    rank's reading and the next grows by no more than twice what each rank keeps (plus 16 KiB of the allocator's
    noise). A rank that kept its trace's intervals fails the first; memory held anywhere else, the second."""
    import gc
    import tracemalloc

    path = many_event_rank(str(tmp_path / "rank0" / "t.pt.trace.json.gz"), 0)
    ranks.rank_figures([path], 0, lanes=False)  # imports and caches, before the count starts
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept, held = [], []
        for r in range(4):
            kept.append(ranks.rank_figures([path], r, lanes=False))
            if r == 0:
                peak_one = tracemalloc.get_traced_memory()[1] - base
            gc.collect()  # the reading's own garbage (cycles): what stays is what is kept
            held.append(tracemalloc.get_traced_memory()[0] - base)
        assert all(not f.get("left_out") and len(f["steps"]) == 6 for f in kept)
        del kept[1:]
        gc.collect()
        per_rank = (held[-1] - (tracemalloc.get_traced_memory()[0] - base)) / 3
    finally:
        tracemalloc.stop()
    assert 0 < per_rank < peak_one / 20, f"a rank keeps {per_rank:.0f} bytes of a {peak_one}-byte reading"
    assert held[-1] - held[0] <= 2 * 3 * per_rank + 16384, (held, per_rank)


def test_a_step_whose_length_was_written_in_ns_is_left_out_of_the_ranks_spread(tmp_path):
    """Rank 1's step 3 is 1000 times as long as its siblings with its events still in us: summarize leaves it out
    (step_in_ns), and so do the ranks' aligned steps, rather than count a 1000-fold step as the slowest."""
    events = gpu_rank(0, 650, (850, 50), (660, 180), steps=(1, 2, 3, 4))
    for ev in events:
        if ev["name"] == "ProfilerStep#3":
            ev["dur"] *= 1000
    a = write(str(tmp_path / "a.json"), gpu_rank(0, 50, (100, 800), (60, 40), steps=(1, 2, 3, 4)), rank=0)
    b = write(str(tmp_path / "b.json"), events, rank=1)
    result = ranks.across([ranks.rank_figures([a]), ranks.rank_figures([b])])
    assert 3 not in result["steps_aligned"] and result["steps_missing"] == {"1": [3]}, result["steps_missing"]


def test_intervals_kept_joined_as_they_come_have_the_union_of_all_given():
    """Intervals kept by ranks._add (joined to the last one where they start inside it) have the union of every
    interval given, float for float: nested operators in order, sequential kernels, touching ones, empty ones,
    and intervals out of order, on 500 random lists; nested ones in order keep one entry."""
    import random
    from array import array

    from steplens.trace import intervals

    for seed in range(500):
        rng = random.Random(seed)
        given, kept, s = [], array("d"), 0.0
        for _ in range(rng.randrange(0, 60)):
            s = s + rng.choice((0.0, 0.5, 1.0, 3.0)) if rng.random() < 0.8 else rng.uniform(0, 50)
            e = s + rng.choice((0.0, 0.5, 2.0, 7.25))
            given.append([s, e])
            ranks._add(kept, s, e)
        assert intervals.union(ranks._pairs(kept)) == intervals.union(given), seed
    nested = array("d")
    for s, e in ((0.0, 10.0), (1.0, 4.0), (2.0, 3.0), (5.0, 10.0), (10.0, 12.0)):
        ranks._add(nested, s, e)
    assert list(nested) == [0.0, 12.0]
