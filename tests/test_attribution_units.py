"""save_figures on steps and saves written out by hand: the step that holds each save, its length, its share of
that step and the GPU's idle time during it, or null with the reason on a CPU-only trace; and the launch times
Busy keeps for each busy interval."""

from steplens.evidence.attribution import NO_GPU, Busy, save_figures

# Step 3 runs 100-300, step 4 300-700, step 5 is 700-700 (no wall time); nothing runs before 100 or after 700.
STEPS = [(4, 300.0, 700.0), (3, 100.0, 300.0), (5, 700.0, 700.0)]


def kernel(s, e):
    return ("kernel", s, e, 7, 1, 0)


def test_each_save_gets_its_step_its_length_its_share_and_the_gpu_s_idle_in_it():
    # the GPU is busy 120-150, 380-420 and 440-460: the save 350-500 is idle 150 - 40 - 20 = 90 of it
    busy = Busy([kernel(120.0, 150.0), kernel(380.0, 420.0), kernel(440.0, 460.0)], lambda ev: 0.0)
    saves = [[350.0, 500.0], [110.0, 160.0]]  # written out of order: the figures come by start
    assert save_figures(STEPS, saves, busy) == [
        {"step": 3, "save_us": 50.0, "share_of_step": 0.25, "gpu_idle_us": 20.0, "gpu_idle_null_reason": None},
        {"step": 4, "save_us": 150.0, "share_of_step": 0.375, "gpu_idle_us": 90.0, "gpu_idle_null_reason": None},
    ]


def test_a_save_outside_the_steps_or_in_a_step_without_wall_time_has_no_share():
    busy = Busy([kernel(10.0, 30.0)], lambda ev: 0.0)
    out = save_figures(STEPS, [[0.0, 50.0], [700.0, 700.0], [800.0, 810.0]], busy)
    assert out == [
        {"step": None, "save_us": 50.0, "share_of_step": None, "gpu_idle_us": 30.0, "gpu_idle_null_reason": None},
        {"step": None, "save_us": 0.0, "share_of_step": None, "gpu_idle_us": 0.0, "gpu_idle_null_reason": None},
        {"step": None, "save_us": 10.0, "share_of_step": None, "gpu_idle_us": 10.0, "gpu_idle_null_reason": None},
    ]
    # a step of no wall time holds nothing ([700, 700) is empty): the step that starts there holds the save
    out = save_figures([(5, 700.0, 700.0), (6, 700.0, 900.0)], [[700.0, 750.0]], busy)
    assert out[0]["step"] == 6 and out[0]["share_of_step"] == 0.25


def test_a_cpu_only_trace_has_no_idle_and_says_why():
    out = save_figures(STEPS, [[150.0, 250.0]], None)
    assert out == [
        {"step": 3, "save_us": 100.0, "share_of_step": 0.5, "gpu_idle_us": None, "gpu_idle_null_reason": NO_GPU}
    ]
    assert save_figures(STEPS, [], None) == []


def test_busy_keeps_when_each_busy_interval_s_launch_started_and_when_its_call_returned():
    """The launch call of the work at 10 ran 4-6, that of the work at 50 ran 20-25; the work at 25 joins the
    first interval (it starts before that one ends), so its launch is not kept."""
    starts, ends = {1: 4.0, 2: 20.0, 3: 8.0}, {1: 6.0, 2: 25.0, 3: 9.0}

    def launch_time(ev):
        return starts[ev[4]]

    launch_time.end = lambda ev: ends[ev[4]]
    gpu = [("kernel", 50.0, 60.0, 7, 2, 0), ("kernel", 10.0, 30.0, 7, 1, 0), ("kernel", 25.0, 40.0, 7, 3, 0)]
    busy = Busy(gpu, launch_time)
    assert busy.merged == [[10.0, 40.0], [50.0, 60.0]]
    assert list(busy.opened_by) == [4.0, 20.0] and list(busy.opened_end) == [6.0, 25.0]
    plain = Busy(gpu, lambda ev: starts[ev[4]])
    assert list(plain.opened_end) == [4.0, 20.0], "without an end, the call's start"


def test_the_idle_sums_of_one_pass_are_the_sums_of_the_separate_passes():
    """_idle_sums adds the same numbers in the same order as total(idle), total(host_waits(idle)) and
    total(iintersect(host_waits(idle), each list)): equal floats, and the int 0 where nothing adds (as sum()),
    on random kernels, launches and lists that touch, nest, cross and run out early."""
    import random

    from steplens.evidence.attribution import _idle_sums
    from steplens.trace.intervals import gaps, iintersect, total, union

    rng = random.Random(5)
    for case in range(302):
        gpu, launches = [], {}
        for i in range(rng.randrange(0, 12)):
            s = rng.choice([rng.uniform(0, 1000), float(rng.randrange(0, 1000, 50))])
            gpu.append(("kernel", s, s + rng.uniform(0, 80), 7, i, 0))
            launches[i] = s - rng.choice([5.0, 200.0])  # launched just before, or long before (queued)
        if case == 300:  # busy all along: nothing idle
            gpu, launches = [("kernel", 0.0, 1100.0, 7, 0, 0)], {0: 0.0}
        if case == 301:  # idle only while work is queued: no wait for the host
            gpu, launches = [("kernel", 0.0, 100.0, 7, 0, 0), ("kernel", 200.0, 1100.0, 7, 1, 0)], {0: 0.0, 1: 50.0}
        busy = Busy(gpu, lambda ev: launches[ev[4]])
        span = [0.0, rng.choice([1000.0, 1100.0])]
        idle = gaps(busy.clip(*span), *span)

        def lists():
            n = rng.randrange(0, 8)
            return union([[a, a + rng.uniform(0, 150)] for a in (rng.uniform(0, 1000) for _ in range(n))])

        others = [lists() for _ in range(rng.randrange(0, 4))]
        got = _idle_sums(busy, iter(idle), others)
        want = (
            total(idle),
            total(busy.host_waits(idle)),
            [total(iintersect(busy.host_waits(idle), o)) for o in others],
        )
        assert repr(got) == repr(want), case
        if case >= 300:
            assert got[1] == 0 and type(got[1]) is int and [type(x) for x in got[2]] == [int] * len(others), got


def test_total_one_at_a_time_is_sum_of_the_same_floats():
    """intervals.Total gives what sum() gives on the running Python (a compensated sum from 3.12): on floats of
    every size, cancelling ones where the compensation shows, -0.0, infinities and none at all (the int 0)."""
    import math
    import random

    from steplens.trace.intervals import Total

    rng = random.Random(11)
    special = [0.0, -0.0, 1e16, -1e16, 1.0, 0.1, math.inf, -math.inf, 1e308, -1e308, 5e-324]
    cases = [[], [-0.0], [1e16, 1.0, -1e16], [0.1] * 10, [1e308, 1e308, -1e308], [math.inf, -1.0]]
    for _ in range(2000):
        pick = (rng.uniform(-1e3, 1e3), rng.choice(special), rng.random() * 10 ** rng.randrange(-20, 20))
        cases.append([rng.choice(pick) for _ in range(rng.randrange(1, 12))])
    for floats in cases:
        t = Total()
        for x in floats:
            t.add(x)
        assert repr(t.value()) == repr(sum(floats)), floats
