"""The profile mode's measurements and files: the profiler's cost, the pauses it makes, each cycle's trace and evidence.

What the profiler distorts, and how this module keeps the evidence honest:
- Its own cost. record_shapes, profile_memory and with_stack (--profile-detail full, the tutorial's
  capture) inflate the profiled main process only; DataLoader workers run unprofiled in their own
  processes. So PROFILE_STEPS unprofiled steps are timed in the same process just before the capture,
  and as many just after it (synchronized at both ends, never inside the profiled window, each step by a
  CUDA event or the host clock), and profiler_distortion = profiled step / unprofiled step (the mean of
  both blocks; where the CPU runs ahead of the GPU, a block's first step is left out when it is the
  slowest: it starts on an empty GPU queue) is reported beside every trace's evidence, with its standard
  error and a 95% interval that covers the ratio against either block (the host's pace drifts; blocks
  further apart than their own spread make the distortion uncertain: distortion_interval).
- Its pauses. Writing a cycle's trace takes about a second inside profiler.step(), and starting the
  profiler takes time too; the workers keep loading meanwhile, up to workers x prefetch_factor batches
  ahead, so the steps after a long pause may be served from refilled queues and show no input wait that
  the bench would feel. Every pause of the main loop, and every step, is timed. queue_waits models the
  loader as one batch per unprofiled step (when the loop waits for input, that is the loader's pace); a
  cycle is flagged when the waits measured in it come to less than WAITED_AT of what the model says it
  would have waited without the pauses (see refills). Where the CPU runs ahead of the GPU, a host-side
  wait idles no GPU and nothing is flagged.
- The decision: the tutorial's schedule (wait=1, warmup=1, active=3, repeat=2) stays; with it, cycle 2
  always follows cycle 1's dump by two steps, fewer than the queue depth of 4 workers (8 batches), so
  the headline figures come from the cycles no refill served (cycle 1, unless the profiler's start
  refilled it too: then from the traced steps no refill served, where idle time is read on the CPU's
  steps, whose per-step figures add up; else the headline idle and input-gap figures are null with the
  reason; the per-cycle figures stay in run.json either way). A schedule with warmup >= workers x
  prefetch_factor would drain a dump's refill too, at the price of more profiled steps than the tutorial
  prints.
"""

import math
import os
import statistics
import sys
import time
from contextlib import contextmanager

import nesting
import stepview
import summarize
from runinfo import write_atomic, write_json_atomic
from scopes import NEXT_BATCH, SCHEDULE
from stopping import StopRequested

# --profile-detail: the tutorial's capture, or one that records only the timeline.
DETAIL = {"full": {"record_shapes": True, "profile_memory": True, "with_stack": True},
          "lean": {"record_shapes": False, "profile_memory": False, "with_stack": False}}
# Above this, the workers get at least 10% more time per batch than in an unprofiled run; below its
# inverse, the profiled steps ran faster than the unprofiled ones, which the profiler cannot cause.
DISTORTION_NOTE_AT = 1.1
# A traced step that spent this share of an unprofiled step in input/next_batch waited for its batch.
WAITED_AT = 0.25


class TraceWriter:
    """on_trace_ready for the tutorial's schedule: trace-cycleN-stepsA-B.pt.trace.json[.gz] and operator tables.

    The trace goes to a temp name, is repaired there so that every Perfetto version shows all its slices
    (nesting.repair: what it changed is recorded as the cycle's "perfetto"), and is renamed when complete, so
    a reader never meets half a trace; how long each dump took is recorded (DataLoader workers keep loading
    meanwhile), and how much of it the repair took.
    """

    def __init__(self, out_dir, trace_format, cuda, subdir="", skip=lambda: False):
        # subdir: "rank{R}" in a DDP run, so that every rank's files lie apart under one outputs folder.
        # skip: true once a stop was asked for (the profiler's exit would dump a partial cycle).
        self.out_dir, self.trace_format, self.cuda, self.subdir, self.skip = out_dir, trace_format, cuda, subdir, skip
        self.cycles = []

    def __call__(self, prof):
        if self.skip():  # a stop was asked for: the profiler's exit would dump a partial cycle
            return
        # Called at step_num 5 and 10; the cycle's active steps are the three before.
        n = len(self.cycles) + 1
        first, last = prof.step_num - SCHEDULE["active"], prof.step_num - 1
        t0 = time.perf_counter()
        trace = os.path.join(self.out_dir, "traces", self.subdir,
                             f"trace-cycle{n}-steps{first}-{last}.pt.trace.{self.trace_format}")
        os.makedirs(os.path.dirname(trace), exist_ok=True)
        tmp = os.path.join(os.path.dirname(trace), f".partial-{os.getpid()}-{os.path.basename(trace)}")
        try:
            prof.export_chrome_trace(tmp)  # gzips when the name ends in .gz
            t1 = time.perf_counter()
            try:
                perfetto = nesting.repair_file(tmp)
            except nesting.NestingError as e:  # the profiler's own export stays: a trace with drops beats none
                perfetto = {"error": str(e)}
                print(f"profile: the trace could not be made to nest, kept as exported: {e}", file=sys.stderr)
            perfetto["repair_seconds"] = round(time.perf_counter() - t1, 3)
            os.replace(tmp, trace)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        averages = prof.key_averages()
        operators = os.path.join(self.out_dir, "operators", self.subdir)
        tables = {"self_cpu": write_atomic(os.path.join(operators, f"cycle{n}-by-self-cpu.txt"),
                                           averages.table(sort_by="self_cpu_time_total", row_limit=-1))}
        if self.cuda:
            tables["self_device"] = write_atomic(
                os.path.join(operators, f"cycle{n}-by-self-device.txt"),
                averages.table(sort_by="self_device_time_total", row_limit=-1))
        seconds = time.perf_counter() - t0
        print(f"profile: cycle {n} (ProfilerStep#{first}-{last}) -> {trace} in {seconds:.1f}s", file=sys.stderr)
        self.cycles.append({"cycle": n, "profiler_steps": [first, last], "trace": trace,
                            "trace_bytes": os.path.getsize(trace), "operator_tables": tables, "perfetto": perfetto,
                            "dump_seconds": round(seconds, 3), "dump_before_step": prof.step_num})


class Laps:
    """Each step's time without a synchronization inside: on CUDA an event recorded after each step (the
    device's clock, on the current stream), on the CPU the host clock. lap() after each step, seconds() once
    the caller has synchronized."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda, self.marks = torch, cuda, []

    def lap(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self):
        pairs = zip(self.marks, self.marks[1:])
        laps = [a.elapsed_time(b) / 1000 for a, b in pairs] if self.cuda else [b - a for a, b in pairs]
        return [round(v, 6) for v in laps]


def time_unprofiled(step, steps, synchronize, boundary=lambda: None, laps=None):
    """steps plain steps between two synchronizations, in the same process as the capture.

    boundary() runs after each step: a stop request is honoured there, by raising, or by returning true,
    which ends the block early and keeps the steps it completed (a flag test, no sync). laps: a Laps, for
    each step's time (their spread says how steady the pace was that the distortion is measured against).
    Returns the timing and the moment the last step returned (the main loop stops consuming batches there:
    the closing synchronization and the profiler's start are the first pause).
    """
    synchronize()
    t0 = time.perf_counter()
    if laps:
        laps.lap()
    done = 0
    for _ in range(steps):
        step()
        done += 1
        if laps:
            laps.lap()
        if boundary():
            break
    last_step_end = time.perf_counter()
    synchronize()
    seconds = time.perf_counter() - t0
    out = {"steps": done, "seconds": seconds, "step_ms": seconds / done * 1e3 if done else None}
    if laps:
        out["step_ms_each"] = [round(v * 1e3, 4) for v in laps.seconds()]
    return out, last_step_end


@contextmanager
def bracketed(step, steps, synchronize, stop, laps, settle=0):
    """steps unprofiled steps timed before the with block (the profiled cycles), and as many after it.

    The host's pace drifts (the loader's most): one block of steps can sit well off a long bench window of
    the same configuration, so the ratio is read against a block on each side of the capture. A stop in
    the first block ends the run there, its completed steps counted; a stop in the second ends that block
    and keeps what it completed, so the profiled cycles keep their evidence (stop_keeping ends the run
    after it). settle: untimed steps before the second block, which take up the batches the DataLoader
    workers queued during the profiler's last pause (its trace dump); laps(): a new Laps. Yields
    {"unprofiled": the first block, "since": when its last step returned}; "unprofiled_after" is added.
    """
    with stop.steps("unprofiled timing"):  # a stop here records the unprofiled steps completed
        print(f"profile: timing {steps} unprofiled steps before the capture and {steps} after it (the "
              "profiler's cost is measured against them)", file=sys.stderr)
        before, since = time_unprofiled(step, steps, synchronize, stop.step_done, laps())
    timing = {"unprofiled": before, "since": since}
    yield timing

    def ended():  # a step boundary that ends the block, rather than the run, on a stop
        stop.steps_done += 1
        return stop.requested
    with stop.steps("unprofiled timing after"):
        print(f"profile: timing {steps} unprofiled steps after the capture ({settle} settle steps first)",
              file=sys.stderr)
        cut = False
        for _ in range(settle):
            step()
            if ended():
                cut = True
                break
        timing["unprofiled_after"] = time_unprofiled(step, 0 if cut else steps, synchronize, ended, laps())[0]


def stop_keeping(stop, results):
    """A stop that ended the second unprofiled block early ends the run once its evidence is written: the
    StopRequested carries the results, which run.json keeps beside the stop."""
    if stop.requested:
        e = StopRequested(stop.signum, stop.phase, stop.steps_done)
        e.results = results
        raise e


class Pauses:
    """How long the main loop stopped between profiled steps (profiler.step(), trace dumps, the start), how
    long each step took, and, given input_clock (the seconds the loop has spent waiting for batches, so
    far), how long each step waited for its batch."""

    def __init__(self, since, input_clock=None):
        self.seconds, self.step_seconds, self.input_seconds = [], [], []
        self._last_end, self._start, self._clock, self._input0 = since, since, input_clock, None

    def before_step(self):
        self._start = time.perf_counter()
        self.seconds.append(self._start - self._last_end)
        self._input0 = self._clock() if self._clock else None

    def after_step(self):
        self._last_end = time.perf_counter()
        self.step_seconds.append(self._last_end - self._start)
        self.input_seconds.append(self._clock() - self._input0 if self._clock else None)


def queue_waits(pauses_s, compute_s, depth, pace_s, seen_waits=None):
    """Per loop step, how long it waits for its batch under a model of the loader.

    The loader makes one batch per pace_s while its queue (depth batches) has room, and the queue starts
    empty (the model is for loops that wait for input: the unprofiled pace is then the loader's). Before
    step i the loader fills the pause pauses_s[i]; a step that finds a whole batch takes it, one that does
    not waits (1 - queued) x pace_s for it, which empties the queue; while the step computes (compute_s[i],
    its time less its wait) the loader goes on. seen_waits: {step: seconds} the waits that were measured;
    the model takes them as they were (a real loader delivers in lumps: two workers that finish together
    leave one step served and the next waiting, which a steady pace cannot say).
    """
    seen_waits = seen_waits or {}
    queued, waits = 0.0, []
    for i, (pause, compute) in enumerate(zip(pauses_s, compute_s)):
        queued = min(depth, queued + pause / pace_s)
        if i in seen_waits:
            wait, queued = seen_waits[i], 0.0
        elif queued >= 1:
            wait, queued = 0.0, queued - 1
        else:
            wait, queued = (1 - queued) * pace_s, 0.0
        waits.append(wait)
        queued = min(depth, queued + compute / pace_s)
    return waits


def refills(cycles, pauses_s, queue_depth, pace_s, compute_s=None, seen_waits=None, measured_waits=None):
    """Per cycle, the pauses whose refilled batches hid input waits from its active steps.

    queue_waits runs twice, with the pauses and without them. A cycle is flagged when, without the pauses,
    its steps would have waited WAITED_AT of a batch's time or more in all, the waits measured in it (or
    modelled, where not measured) come to less than WAITED_AT of that, and some step of it waits less than
    WAITED_AT of a batch's time with the pauses and at least that without them (those steps are listed).
    Deciding on the cycle's sum keeps an uneven loader from being read as a refill: two workers that
    finish together leave steps served and steps waiting with or without a pause, which a steady pace
    cannot say, but their waits still add up. (With steps slower than the loader's pace no step waits
    either way: that hides input waits too, but it is the profiler's slowdown, which the distortion ratio
    reports.) compute_s: each loop step's time less its wait for input; an unknown one counts as pace_s.
    seen_waits: the measured waits of WAITED_AT of a batch's time or more, which the model takes as they
    were; measured_waits: every measured wait. Each listed step is put down to the longest pause since the
    last step that waited. pace_s unknown: every traced step after a pause is flagged, but those seen
    waiting.
    """
    n = len(pauses_s)
    dumps = {c.get("dump_before_step"): c["cycle"] for c in cycles}
    out = {c["cycle"]: [] for c in cycles}
    if not queue_depth or not n:
        return out
    seen_waits, measured_waits = seen_waits or {}, measured_waits or {}
    if not pace_s:
        served, waited = (set(range(1, n)) - set(seen_waits) if any(pauses_s) else set()), set(seen_waits)
    else:
        compute = [pace_s if d is None else d for d in (list(compute_s or []) + [None] * n)[:n]]
        with_pauses = queue_waits(pauses_s, compute, queue_depth, pace_s, seen_waits)
        without = queue_waits([0.0] * n, compute, queue_depth, pace_s, seen_waits)
        least = WAITED_AT * pace_s
        waited = {i for i in range(n) if with_pauses[i] >= least}
        served = set()
        for c in cycles:
            steps = range(c["profiler_steps"][0], c["profiler_steps"][1] + 1)
            would = sum(without[i] for i in steps if i < n)
            had = sum(measured_waits.get(i, with_pauses[i]) for i in steps if i < n)
            if would >= least and had < WAITED_AT * would:
                served |= {i for i in steps if i < n and with_pauses[i] < least <= without[i]}
    for c in cycles:
        first, last = c["profiler_steps"]
        by_pause = {}
        for i in sorted(j for j in served if first <= j <= last):
            since = max((k + 1 for k in waited if k < i), default=0)
            j = max(range(since, i + 1), key=lambda k: pauses_s[k])
            by_pause.setdefault(j, []).append(i)
        for j, steps in sorted(by_pause.items()):
            what = f"cycle {dumps[j]}'s trace dump" if j in dumps else (
                "the profiler's start" if j < first else "profiler.step()")
            out[c["cycle"]].append({"before_step": j, "seconds": round(pauses_s[j], 4),
                                    "batches": round(min(queue_depth, pauses_s[j] / pace_s), 2) if pace_s else queue_depth,
                                    "steps": steps, "what": what, "dump": j in dumps})
    return out


def distortion_sentence(ratio, workers, device_input, se=None, detail="full", df=None, refilled=True, spread=None,
                        interval=None, uncertain=None):
    """A plain sentence when the profiler slows the steps enough to hide (or inflate) input waits, when the
    profiled steps ran faster than the unprofiled ones (which the profiler cannot cause), or when the ratio
    is too uncertain to read: 1 lies within its 95% interval (se: its standard error, df: the degrees of
    freedom the interval uses). detail: the capture's --profile-detail (a lean capture still pays for
    recording every operator). refilled: whether a refill served any traced step (with workers, the cause
    of a ratio below 1 is then queued batches, else a change of the host's pace); spread: the unprofiled
    steps' (fastest, slowest) ms, said with a ratio below 1. interval: (low, high), the 95% interval that
    brackets the capture (distortion_interval), which decides "too uncertain" where given; uncertain: why the
    unprofiled blocks disagree, which makes the distortion uncertain whatever its size."""
    if ratio is None:
        return None
    lean = "compare --profile-detail lean" if detail == "full" else "a lean capture still records every operator"
    said = f"profiled steps take {ratio:.2f}x the unprofiled ones"
    give = ("" if se is None else
            f", give or take {se:.2f} (one standard error, from the spread of the profiled and the unprofiled steps)")
    if uncertain:
        within = ("" if interval is None else
                  f"; against either block it lies between {interval[0]:.2f} and {interval[1]:.2f}")
        return said + give + f", but the distortion is uncertain: {uncertain}{within} (mode=bench times the pace)"
    if interval is not None:
        give += f"; 95% interval {interval[0]:.2f} to {interval[1]:.2f} against the steps before and after the capture"
    if (interval[0] < 1 < interval[1]) if interval is not None else (se is not None and abs(ratio - 1) < t975(df) * se):
        return (said + give + ": too uncertain to tell the profiler's cost from none" +
                ("; with DataLoader workers both timings can be paced by the loader, which hides the profiler's "
                 "cost to the main process" if workers else ""))
    if ratio <= 1 / DISTORTION_NOTE_AT:
        ranged = f" (unprofiled steps {spread[0]:.1f} to {spread[1]:.1f} ms)" if spread else ""
        if workers and refilled:
            return (said + give + ", which the profiler cannot cause: the DataLoader workers had batches queued during "
                    "the profiler's pauses (see refilled_by), so the trace understates the input wait; the unprofiled "
                    f"step{ranged} is the closer figure of the loader-bound pace")
        return (said + give + ", which the profiler cannot cause: the host's pace changed between the two timings"
                f"{ranged}, so the ratio says nothing of the profiler's cost here")
    if ratio < DISTORTION_NOTE_AT:
        return None
    if workers:
        return (said + give + f": the profiler slows the main process while the {workers} DataLoader workers run "
                "unprofiled in their own processes, so each profiled step gives them more time to load and input "
                f"waits the bench feels may not show in the trace ({lean})")
    if device_input:
        return said + give + ": the trace's CPU times are inflated; the GPU's figures are not"
    return (said + give + ": loading runs in the profiled main process, so the trace overstates the in-process "
            f"input cost ({lean})")


def unprofiled_pace(unprofiled, cpu_runs_ahead=False):
    """The unprofiled step time the ratio divides by, and the per-step times it comes from.

    With per-step times: their mean; where the CPU runs ahead of the GPU (the cycles read idle on the GPU's
    timeline), the first is left out when it is the slowest: it starts on an empty GPU queue right after
    the synchronization, which the steady state never does. In a loop paced by its CPU or its loader the
    first step is like the others (a wait for input in it is real). Without per-step times: the
    synchronized mean of all of them."""
    if not unprofiled:
        return None, None
    each = unprofiled.get("step_ms_each")
    if each and len(each) >= 3:
        steady = each[1:] if cpu_runs_ahead and each[0] > max(each[1:]) else list(each)
        return statistics.fmean(steady), steady
    return unprofiled.get("step_ms"), None


def ratio_se(ratio, profiled_ms, unprofiled_ms):
    """One standard error of mean(profiled) / mean(unprofiled) from the spread of each (the delta method, the
    steps taken as independent: an alternating pace counts as spread), and its Welch-Satterthwaite degrees
    of freedom. (None, None) with fewer than 2 of either."""
    if ratio is None or len(profiled_ms or []) < 2 or len(unprofiled_ms or []) < 2:
        return None, None
    parts = [(statistics.variance(xs) / len(xs) / statistics.fmean(xs) ** 2, len(xs) - 1)
             for xs in (profiled_ms, unprofiled_ms)]
    total = sum(v for v, _ in parts)
    df = total ** 2 / sum(v * v / d for v, d in parts) if total else None
    return ratio * math.sqrt(total), df


def pooled_pace(capture, cpu_runs_ahead=False):
    """The unprofiled step of the run: the steps before and after the capture pooled (unprofiled_pace on
    each block), their per-step times, and each block as (name, mean ms, per-step ms or None, steps timed).
    A run recorded before the second block was timed, or stopped before it completed a step, has the first
    alone."""
    blocks = []
    for name, key in (("before", "unprofiled"), ("after", "unprofiled_after")):
        mean, steady = unprofiled_pace(capture.get(key), cpu_runs_ahead)
        each = (capture.get(key) or {}).get("step_ms_each")
        if steady is None and each:  # a block a stop cut short keeps its few steps
            mean, steady = statistics.fmean(each), list(each)
        if mean is not None:
            blocks.append((name, mean, steady, capture[key].get("steps")))
    if not blocks:
        return None, None, []
    if all(b[2] for b in blocks):
        steady = [v for b in blocks for v in b[2]]
        return statistics.fmean(steady), steady, blocks
    counts = [b[3] or 1 for b in blocks]
    return sum(b[1] * n for b, n in zip(blocks, counts)) / sum(counts), None, blocks


def distortion_interval(profiled_ms, profiled_each, blocks):
    """Each unprofiled block's figures, their drift, and the distortion's 95% interval, bracketing the capture.

    The rule: the interval covers the ratio against either block, each give or take its own sampling
    error. low = the least of (profiled / block - t975 x se), high = the greatest of (profiled / block + t975
    x se), over the blocks, se from ratio_se (the profiled steps' spread and that block's). It is None
    where a block has no per-step times. The blocks agree unless their means differ by more than t975
    standard errors of the difference (Welch); where they do not, and the drift moves the ratio by more
    than DRIFT_MATTERS of its distance from 1, the host's pace drifted across the capture:
    distortion_uncertain says so, naming both means (None where they agree or cannot be tested). The
    interval is built on the log scale, so it never reaches 0.
    blocks: [(name, mean ms, per-step ms or None, steps timed)] as pooled_pace gives them.
    """
    out = {"unprofiled_drift": None, "distortion_low": None, "distortion_high": None, "distortion_uncertain": None}
    for name in ("before", "after"):
        out.update({f"unprofiled_{name}_ms": None, f"unprofiled_{name}_sd_ms": None, f"unprofiled_{name}_steps": None})
    spans = []
    for name, mean, each, steps in blocks:
        many = each is not None and len(each) >= 2
        out.update({f"unprofiled_{name}_ms": mean, f"unprofiled_{name}_steps": steps,
                    f"unprofiled_{name}_sd_ms": statistics.stdev(each) if many else None})
        ratio = profiled_ms / mean if profiled_ms and mean else None
        se, df = ratio_se(ratio, profiled_each, each)
        # On the log scale (se / ratio is the log ratio's se): a ratio of step times stays above 0.
        spans.append(None if se is None else (ratio * math.exp(-t975(df) * se / ratio),
                                              ratio * math.exp(t975(df) * se / ratio)))
    if spans and None not in spans:
        out["distortion_low"], out["distortion_high"] = min(a for a, _ in spans), max(b for _, b in spans)
    if len(blocks) < 2:
        return out
    (_, b, before, _), (_, a, after, _) = blocks
    out["unprofiled_drift"] = a / b
    if not (before and after and len(before) >= 2 and len(after) >= 2):
        return out
    vb, va = statistics.variance(before) / len(before), statistics.variance(after) / len(after)
    df = (vb + va) ** 2 / (vb * vb / (len(before) - 1) + va * va / (len(after) - 1)) if vb + va else None
    differ = abs(a - b) > t975(df) * math.sqrt(vb + va) if vb + va else a != b
    # A drift matters when it moves the ratio by more than a quarter of the slow-down itself: blocks of
    # near-constant steps (a CUDA-graph replay) differ by 0.01 ms "beyond their spread" and change nothing.
    moved = abs(profiled_ms / b - profiled_ms / a) if profiled_ms else 0.0
    if differ and moved > DRIFT_MATTERS * abs(profiled_ms / ((a + b) / 2) - 1):
        out["distortion_uncertain"] = (
            f"the unprofiled steps before the capture took {b:.2f} ms and those after it {a:.2f} ms, further "
            "apart than their own spread allows: the host's pace drifted across the capture")
    return out


# Two-sided 95% quantiles of Student's t by degrees of freedom (rounded down: the wider interval).
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 30: 2.04, 60: 2.00, 120: 1.98}
DRIFT_MATTERS = 0.25  # the blocks' drift makes the distortion uncertain when it moves the ratio this share of (ratio - 1)


def t975(df):
    """The t quantile for a 95% interval; 1.96 when df is unknown or above 120."""
    if df is None or df > max(T975):
        return 1.96
    return T975[max(k for k in T975 if k <= max(1, math.floor(df)))]


def capture_lines(cycle, capture):
    """The evidence text's account of the capture, in plain words: the profiler's cost, the pauses before this
    cycle, and which steps the run's headline figures come from (run.json keeps the terms of docs/EVIDENCE.md)."""
    se = capture.get("profiler_distortion_se")
    cycles = ", ".join(map(str, capture.get("headline_cycles") or [])) or "?"
    lines = [f"the profiler's cost (--profile-detail {capture['detail']}), for the whole run (cycle(s) {cycles}, "
             "not this cycle alone): a profiled step took "
             f"{_ms(capture['profiled_step_ms'])} ms, an unprofiled one {_ms(capture['unprofiled_step_ms'])} ms "
             f"({_blocks(capture)}{_spread(capture.get('unprofiled_step_ms_each'))}): the profiler slowed the step "
             f"{_ratio(capture['profiler_distortion'])}x{'' if se is None else f' +/- {se:.2f}'} "
             "(profiler_distortion in run.json)"]
    if capture.get("distortion_low") is not None:
        lines.append(f"  95% interval {capture['distortion_low']:.2f} to {capture['distortion_high']:.2f}: it covers "
                     "the ratio against either block, each give or take its own sampling error")
    if capture["distortion_sentence"]:
        lines.append(f"  {capture['distortion_sentence']}")
    for d in capture["dumps"]:
        if d["before_step"] <= cycle["profiler_steps"][0]:
            lines.append(f"pause: this cycle's steps start {cycle['profiler_steps'][0] - d['before_step']} steps "
                         f"after cycle {d['cycle']}'s trace was written ({d['seconds']:.3f} s, before step "
                         f"{d['before_step']})")
    for r in cycle["refilled_by"]:
        lines.append(f"pause: {r['what']} ({r['seconds']:.3f} s, before step {r['before_step']}) gave the "
                     f"DataLoader time for about {r['batches']:g} batches (its queue holds {capture['queue_depth']}, "
                     f"{capture['queue']}): step(s) {', '.join(map(str, r['steps']))} found their batch ready where "
                     "an unpaused run would have waited, so this cycle may understate the input wait")
    if capture["headline_clean"]:
        lines.append(f"the run's headline figures come from cycle(s) "
                     f"{', '.join(map(str, capture['headline_cycles']))}: no pause hid an input wait there")
    elif capture.get("headline_steps"):
        lines.append(f"the run's headline figures come from the steps no pause served "
                     f"({', '.join(map(str, capture['headline_steps']))}): every cycle had steps a pause served")
    else:
        lines.append(f"the run's headline figures come from cycle(s) {', '.join(map(str, capture['headline_cycles']))}, "
                     "but every traced step found its batch ready after a pause: the idle and input gap "
                     "figures are left out")
    return lines


def perfetto_line(cycle):
    """The evidence text's line on how the trace was made to nest for Perfetto (docs/PERFETTO.md)."""
    p = cycle.get("perfetto")
    if not p:
        return []
    if "error" in p:
        return [f"Perfetto: the trace is kept as the profiler exported it, and Perfetto before v57.1 may drop "
                f"slices from it ({p['error']})"]
    return [f"Perfetto: {p['clipped']} Python slices clipped by at most {p['clipped_max_us']:.1f} µs, "
            f"{p['moved']} GPU events moved to a sibling track; every slice nests "
            f"({p['violations_before']} would have been dropped by Perfetto before v57.1)"]


def _blocks(capture):
    """The unprofiled blocks in words: the steps before the capture, and those after it where timed."""
    after = capture.get("unprofiled_after_ms")
    if after is None:
        return f"{capture['unprofiled_steps']} steps in the same process just before the capture"
    before, drift = capture["unprofiled_before_ms"], capture["unprofiled_drift"]
    sd = lambda k: "" if capture.get(k) is None else f", sd {capture[k]:.2f}"  # noqa: E731
    return (f"{capture['unprofiled_before_steps']} steps in the same process just before the capture, "
            f"{before:.2f} ms{sd('unprofiled_before_sd_ms')}, and {capture['unprofiled_after_steps']} just after "
            f"it, {after:.2f} ms{sd('unprofiled_after_sd_ms')}: after/before {drift:.2f}")


def _spread(each):
    return f"; the {len(each)} averaged, {min(each):.2f} to {max(each):.2f} ms" if each else ""


def _ms(v):
    return "n/a" if v is None else f"{v:.2f}"


def _ratio(v):
    return "n/a" if v is None else f"{v:.2f}"


def refilled_steps(refilled_by):
    """The profiler steps a cycle's refilling pauses served."""
    return {i for r in refilled_by for i in r["steps"]}


def clean_steps(cycles, evidences):
    """When every cycle has steps a refill served: the traced steps none served, with their per-step figures,
    if the cycles read idle time on the CPU's steps (per-step figures then add up to the window's; on the
    GPU's own timeline they do not, and no step is returned)."""
    if any(evidences[c["cycle"]].get("idle_basis") != "cpu_steps" for c in cycles):
        return []
    out = []
    for c in cycles:
        served = refilled_steps(c["refilled_by"])
        out += [(c["cycle"], s) for s in evidences[c["cycle"]]["steps"]
                if s["step"] not in served and s.get("pace_us") and s.get("gpu_idle_us") is not None]
    return out


def pool_steps(head, steps):
    """The headline's figures over these (cycle, step) pairs alone, read on the CPU's steps: the profiled step
    and the CPU step are the same there; the GPU span per step over the steps with a complete slot."""
    n = len(steps)
    steps = [s for _, s in steps]
    pace, idle = sum(s["pace_us"] for s in steps), sum(s["gpu_idle_us"] for s in steps)
    head = {**head, "null_reasons": dict(head["null_reasons"]), "profiled_step_ms": pace / n / 1e3,
            "cpu_step_ms": sum(s["wall_us"] for s in steps) / n / 1e3, "gpu_idle_share": idle / pace,
            "input_gap_share": sum(s["input_gap_us"] for s in steps) / idle if idle else 0.0,
            "gpu_work_ms_per_step": sum(s["gpu_work_us"] for s in steps) / n / 1e3, "gpu_span_ms_per_step": None}
    head["null_reasons"].pop("gpu_span_ms_per_step", None)
    slots = [s for s in steps if s.get("gpu_span_us") is not None]
    if slots:
        head["gpu_span_ms_per_step"] = sum(s["gpu_span_us"] for s in slots) / len(slots) / 1e3
    else:
        head["null_reasons"]["gpu_span_ms_per_step"] = "none of the headline steps has a complete GPU slot"
    return head


def loop_timings(capture, cycles, evidences, pace_s):
    """Each loop step's compute time (its time less its wait for input) and the waits of WAITED_AT of a
    batch's time or more ({step: seconds}), from the capture's own measurements where it has them (steps_s,
    inputs_s), else from the traces (a ProfilerStep's wall time less its input/next_batch); a step neither
    covers gets the mean compute time of the others (the schedule's wait and warm-up steps in runs recorded
    before the loop timed its waits)."""
    n = len(capture["pauses_s"])
    pad = lambda xs: (list(xs or []) + [None] * n)[:n]  # noqa: E731
    took, waited = pad(capture.get("steps_s")), pad(capture.get("inputs_s"))
    traced = {s["step"]: (s["wall_us"] / 1e6, (s["scopes_cpu_us"].get(NEXT_BATCH) or 0.0) / 1e6)
              for c in cycles for s in evidences[c["cycle"]]["steps"] if 0 <= s["step"] < n}
    compute, waits = [None] * n, [None] * n
    for i in range(n):
        if took[i] is not None and waited[i] is not None:
            compute[i], waits[i] = max(0.0, took[i] - waited[i]), waited[i]
        elif i in traced:
            compute[i], waits[i] = max(0.0, traced[i][0] - traced[i][1]), traced[i][1]
    known = [c for c in compute if c is not None]
    fill = statistics.fmean(known) if known else pace_s
    compute = [fill if c is None else c for c in compute]
    measured = {i: w for i, w in enumerate(waits) if w is not None}
    # A wait worth telling: WAITED_AT of a batch's time, or of the step's own time when the pace is unknown.
    seen = {i: w for i, w in measured.items()
            if w >= WAITED_AT * (pace_s if pace_s else (compute[i] or 0.0) + w) and w > 0}
    return compute, seen, measured


def write_evidence(cycles, capture):
    """summarize.py over each cycle's trace, saved beside it with the capture's account; the headline figures.

    capture: detail, unprofiled (time_unprofiled's dict), pauses_s, steps_s and inputs_s (each loop step's
    duration and its wait for input, where measured), queue_depth, queue (words), workers, device_input.
    The headline is pooled over the cycles no refill served, else over the steps none served (see the
    module's docstring).
    """
    evidences = {c["cycle"]: summarize.summarize_file(c["trace"], lanes=True) for c in cycles}
    ahead = bool(cycles) and all(evidences[c["cycle"]].get("idle_basis") == "gpu_timeline" for c in cycles)
    unprofiled_ms, steady, blocks = pooled_pace(capture, ahead)
    pace_s = unprofiled_ms / 1e3 if unprofiled_ms else None
    compute_s, seen, measured = loop_timings(capture, cycles, evidences, pace_s)
    refilled = refills(cycles, capture["pauses_s"], capture["queue_depth"], pace_s, compute_s, seen, measured)
    # Where the CPU runs ahead, the GPU works through queued steps while the host waits: a host-side wait
    # for input idles no GPU, and the headline is read on the GPU's own timeline. No refill counts there.
    for c in cycles:
        if evidences[c["cycle"]].get("idle_basis") == "gpu_timeline":
            refilled[c["cycle"]] = []
    for c in cycles:
        c["refilled_by"] = refilled[c["cycle"]]
        c["follows_dump"] = [r["before_step"] for r in refilled[c["cycle"]] if r["dump"]]
    clean = [c["cycle"] for c in cycles if not c["refilled_by"]]
    chosen = clean or [c["cycle"] for c in cycles]
    head = summarize.headline([evidences[k] for k in chosen])
    picked = None if clean else clean_steps(cycles, evidences)
    if picked:
        chosen = sorted({k for k, _ in picked})
        head = pool_steps(summarize.headline([evidences[k] for k in chosen]), picked)
    elif not clean:
        head["gpu_idle_share"] = head["input_gap_share"] = None
        head["null_reasons"]["input_wait"] = (
            "every traced step found its batch queued by a refill during a pause (see refilled_by per cycle), "
            "or no step was read on the CPU's steps: the trace may hide input waits the bench feels")
    head["headline_steps"] = [s["step"] for _, s in picked] if picked else None
    profiled = ([s["pace_us"] / 1e3 for _, s in picked] if picked else
                [s["pace_us"] / 1e3 for k in chosen for s in evidences[k]["steps"] if s.get("pace_us")])
    ratio = head["profiled_step_ms"] / unprofiled_ms if unprofiled_ms and head["profiled_step_ms"] else None
    se, df = ratio_se(ratio, profiled, steady)
    bracket = distortion_interval(head["profiled_step_ms"], profiled, blocks)
    interval = None if bracket["distortion_low"] is None else (bracket["distortion_low"], bracket["distortion_high"])
    head.update(unprofiled_step_ms=unprofiled_ms, profiler_distortion=ratio, profiler_distortion_se=se,
                profiler_distortion_df=df, **bracket,
                headline_cycles=chosen, unprofiled_step_ms_range=[min(steady), max(steady)] if steady else None)
    account = {"detail": capture["detail"], "unprofiled_step_ms": unprofiled_ms,
               "unprofiled_steps": capture["unprofiled"]["steps"] if capture.get("unprofiled") else None,
               "profiled_step_ms": head["profiled_step_ms"], "profiler_distortion": ratio,
               "profiler_distortion_se": se, "unprofiled_step_ms_each": steady, **bracket,
               "distortion_sentence": distortion_sentence(
                   ratio, capture["workers"], capture["device_input"], se, capture["detail"], df,
                   refilled=any(c["refilled_by"] for c in cycles),
                   spread=(min(steady), max(steady)) if steady else None, interval=interval,
                   uncertain=bracket["distortion_uncertain"]),
               "queue_depth": capture["queue_depth"], "queue": capture["queue"],
               "pauses_s": [round(p, 4) for p in capture["pauses_s"]],
               "compute_s": [round(t, 4) for t in compute_s], "waits_seen_s": {str(k): round(v, 4) for k, v in seen.items()},
               "headline_cycles": chosen, "headline_clean": bool(clean), "headline_steps": head["headline_steps"],
               "dumps": [{"cycle": d["cycle"], "seconds": d.get("dump_seconds"), "before_step": d["dump_before_step"]}
                         for d in cycles if d.get("dump_before_step") is not None]}
    for c in cycles:
        evidence = evidences[c["cycle"]]
        evidence["verdict"] = profiler_caveat(tailor_next(evidence["verdict"], capture.get("on")), [evidence["window"]], {
            "profiler_distortion": ratio, "profiler_distortion_se": se, "profiler_distortion_df": df,
            "unprofiled_step_ms": unprofiled_ms, **bracket})
        if c["refilled_by"] and evidence["verdict"]["stage"]:
            evidence["verdict"]["sentence"] += (" This cycle followed a pause that refilled the loader's queues: "
                                                "its input waits may be understated.")
        c["picture"], c["picture_note"] = draw_cycle(c, evidence)
        if c["picture_note"] and c is cycles[0]:  # one line a run: the reason is the same for every cycle
            print(f"profile: {c['picture_note']}", file=sys.stderr)
        for step in evidence["steps"]:
            step.pop("lanes", None)
        c["verdict"] = evidence["verdict"]["sentence"]
        evidence["capture"] = {**account, "cycle": c["cycle"], "refilled_by": c["refilled_by"]}
        base = c["trace"].rsplit(".pt.trace.", 1)[0]
        c["evidence_json"] = write_json_atomic(base + ".evidence.json", evidence)
        text = summarize.format_table([evidence]) + "\n".join(capture_lines(c, account) + perfetto_line(c)) + "\n"
        c["evidence_txt"] = write_atomic(base + ".evidence.txt", text)
        c["evidence"] = summarize.headline(evidence)
        c["step_wall_ms"] = {s["step"]: s["wall_us"] / 1000.0 for s in evidence["steps"]}
    head["distortion_sentence"] = account["distortion_sentence"]
    shown = [s for _, s in picked] if picked else [evidences[k]["window"] for k in chosen]
    inputs = summarize.sum_known(shown, lambda p: p.get("input_cpu_us"))
    head["input_cpu_share"] = inputs / sum(p["wall_us"] for p in shown) if inputs is not None else None
    head["verdict"] = headline_verdict(head, [evidences[k] for k in chosen], picked, capture.get("on"))
    print(f"profile: verdict: {head['verdict']['sentence']}", file=sys.stderr)
    if head.get("gpu_top_classes"):  # what the GPU does: the table is in each cycle's evidence text
        print(f"profile: GPU time by kernel class: {head['gpu_top_classes']}", file=sys.stderr)
    return head


def headline_verdict(head, evidences, picked, on=None):
    """summarize.verdict over the headline's cycles (or steps), told where the capture limits it: no verdict
    where a refill may hide the input waits, and the profiler's slow-down weighed (profiler_caveat)."""
    if head["null_reasons"].get("input_wait"):
        return {"stage": None, "part": None, "share": None, "runner_up": None, "next": None,
                "sentence": f"Cannot tell which stage holds the step: {head['null_reasons']['input_wait']}."}
    parts = [s for _, s in picked] if picked else [ev["window"] for ev in evidences]
    return profiler_caveat(tailor_next(summarize.verdict(evidences, parts if picked else None), on), parts, head)


def profiler_caveat(v, parts, head):
    """The verdict with the profiler's slow-down weighed, where its 95% interval excludes none.

    The profiler slows the host side, so the GPU's waits for the host grow in the profiled steps while its
    busy time does not. When the GPU's busy time per step would fill GPU_BOUND_AT of the unprofiled step,
    the profiled waits may be the profiler's own: the stage is withheld (profiled_stage keeps it) and the
    sentence says both readings. The interval is distortion_low's where the evidence has it (the steps before
    and after the capture), else the ratio's own (runs timed before the capture alone)."""
    ratio, se, unprofiled, low, high = (head.get(k) for k in (
        "profiler_distortion", "profiler_distortion_se", "unprofiled_step_ms", "distortion_low", "distortion_high"))
    if not (v["stage"] and ratio and unprofiled):
        return v
    if low is not None:
        if not low > 1:
            return v
    elif not (ratio - t975(head.get("profiler_distortion_df")) * se > 1 if se else ratio > DISTORTION_NOTE_AT):
        return v
    times = f"{low:.2f}x to {high:.2f}x" if head.get("distortion_uncertain") else f"{ratio:.2f}x"
    steps = sum(p.get("steps", 1) for p in parts)
    busy = [p.get("gpu_busy_us") for p in parts]
    busy_ms = None if None in busy else sum(busy) / steps / 1e3
    if v["part"] != "busy" and busy_ms is not None and busy_ms / unprofiled >= summarize.GPU_BOUND_AT:
        v = {**v, "profiled_stage": v["stage"], "profiled_share": v["share"], "stage": None, "part": None,
             "share": None, "next": None, "unprofiled_busy_share": busy_ms / unprofiled}
        v["sentence"] = (f"Uncertain: in the profiled steps {v['profiled_stage']} is the GPU's largest wait "
                         f"({100 * v['profiled_share']:.0f}% of the step), but the profiler made those steps "
                         f"{times} as long; at the unprofiled pace ({unprofiled:.2f} ms) the GPU's "
                         f"{busy_ms:.2f} ms of work would fill {100 * busy_ms / unprofiled:.0f}% of the step, where "
                         "GPU compute holds it. mode=bench, against a change, decides.")
        return v
    return {**v, "sentence": v["sentence"] + f" The profiler made these steps {times} as long as unprofiled "
                                            "ones: the shares are of the profiled step."}


LEVERS = (("--amp bf16", lambda on: on.get("amp") == "bf16"), ("--channels-last", lambda on: on.get("channels_last")),
          ("--compile default", lambda on: on.get("compile") not in (None, "off")))


def tailor_next(v, on):
    """GPU compute's next step in this run's terms: the options not yet on, and a larger batch."""
    if v.get("part") != "busy" or on is None:
        return v
    levers = [flag for flag, is_on in LEVERS if not is_on(on)] + ["a larger --batch-size"]
    nxt = f"make the GPU's work cheaper or larger ({', '.join(levers)}), then measure with mode=bench"
    return {**v, "next": nxt, "sentence": v["sentence"].replace(f"Next: {v['next']}.", f"Next: {nxt}.")}


def draw_cycle(c, evidence):
    """The cycle's step picture beside its trace (stepview.py); its path, or None and the reason."""
    folder, base = os.path.split(c["trace"].rsplit(".pt.trace.", 1)[0])
    path = os.path.join(folder, base.replace("trace-", "picture-", 1) + ".png")
    title = f"cycle {c['cycle']}, ProfilerStep#{c['profiler_steps'][0]}-{c['profiler_steps'][1]}"
    try:
        stepview.draw(evidence, path, title)
    except stepview.NoPicture as e:
        return None, str(e)
    return path, None


# Headline figures logged as Polyaxon outputs (scalars only; reasons and lists stay in run.json).
OUTPUT_KEYS = ("profiled_step_ms", "gpu_idle_share", "input_gap_share", "gpu_work_ms_per_step",
               "gpu_span_ms_per_step", "cpu_step_ms", "cpu_runs_ahead", "unprofiled_step_ms", "profiler_distortion",
               "profiler_distortion_se", "unprofiled_drift", "distortion_low", "distortion_high", "gpu_top_classes")


def log_cycles(record, results):
    """Each cycle's files as lineage; the profiled step times as metrics; the headline evidence (pooled and
    per cycle) as Polyaxon outputs."""
    for c in results["cycles"]:
        record.log_file(c["trace"], f"trace-cycle{c['cycle']}")
        for kind, path in c["operator_tables"].items():
            record.log_file(path, f"operators-cycle{c['cycle']}-{kind.replace('_', '-')}")
        record.log_file(c["evidence_json"], f"evidence-cycle{c['cycle']}")
        record.log_file(c["evidence_txt"], f"evidence-cycle{c['cycle']}-table")
        if c.get("picture"):
            record.log_image(c["picture"], f"steps-cycle{c['cycle']}")
    # Each ProfilerStep's wall time as a metric, charted by step on the run's dashboard.
    record.log_steps("profiled_step_wall_ms",
                     {n: ms for c in results["cycles"] for n, ms in c["step_wall_ms"].items()})
    outputs = {k: results["evidence"][k] for k in OUTPUT_KEYS if results["evidence"].get(k) is not None}
    verdict = results["evidence"].get("verdict")
    if verdict:
        outputs["verdict"] = verdict["sentence"]
        if verdict["stage"]:
            outputs["verdict_stage"] = verdict["stage"]
    outputs.update({f"cycle{c['cycle']}_{k}": c["evidence"][k] for c in results["cycles"] for k in OUTPUT_KEYS
                    if c["evidence"].get(k) is not None})
    return outputs
