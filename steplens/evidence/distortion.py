"""The profiler's distortion: profiled against unprofiled step time, its error, and the queues its pauses refill.

capture_headline weighs a profile run's capture against its cycles' evidence in one pass: the unprofiled pace,
the pauses that refilled the loader's queue, the headline pooled where no refill served, and the distortion.
The method: docs/EVIDENCE.md#the-profilers-cost and docs/EVIDENCE.md#the-profilers-pauses-and-refilled-queues."""

import math
import statistics
from collections.abc import Sequence
from typing import Any

from steplens.evidence import diagnosis
from steplens.stats import t975

# Above this, the workers get at least 10% more time per batch than in an unprofiled run; below its
# inverse, the profiled steps ran faster than the unprofiled ones, which the profiler cannot cause.
DISTORTION_NOTE_AT = 1.1


# A traced step that spent this share of an unprofiled step in input/next_batch waited for its batch.
WAITED_AT = 0.25


def queue_waits(
    pauses_s: Sequence[float],
    compute_s: Sequence[float],
    depth: int,
    pace_s: float,
    seen_waits: dict[int, float] | None = None,
) -> list[float]:
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


def refills(
    cycles: list[dict[str, Any]],
    pauses_s: Sequence[float],
    queue_depth: int,
    pace_s: float | None,
    compute_s: Sequence[float | None] | None = None,
    seen_waits: dict[int, float] | None = None,
    measured_waits: dict[int, float] | None = None,
) -> dict[int, list[dict[str, Any]]]:
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
            what = (
                f"cycle {dumps[j]}'s trace dump"
                if j in dumps
                else ("the profiler's start" if j < first else "profiler.step()")
            )
            out[c["cycle"]].append(
                {
                    "before_step": j,
                    "seconds": round(pauses_s[j], 4),
                    "batches": round(min(queue_depth, pauses_s[j] / pace_s), 2) if pace_s else queue_depth,
                    "steps": steps,
                    "what": what,
                    "dump": j in dumps,
                }
            )
    return out


def distortion_sentence(
    ratio: float | None,
    workers: int,
    device_input: bool,
    se: float | None = None,
    detail: str = "full",
    df: float | None = None,
    refilled: bool = True,
    spread: tuple[float, float] | None = None,
    interval: tuple[float, float] | None = None,
    uncertain: str | None = None,
) -> str | None:
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
    give = (
        ""
        if se is None
        else f", give or take {se:.2f} (one standard error, from the spread of the profiled and the unprofiled steps)"
    )
    if uncertain:
        within = (
            ""
            if interval is None
            else f"; against either block it lies between {interval[0]:.2f} and {interval[1]:.2f}"
        )
        return said + give + f", but the distortion is uncertain: {uncertain}{within} (mode=bench times the pace)"
    if interval is not None:
        give += f"; 95% interval {interval[0]:.2f} to {interval[1]:.2f} against the steps before and after the capture"
    if (interval[0] < 1 < interval[1]) if interval is not None else (se is not None and abs(ratio - 1) < t975(df) * se):
        return (
            said
            + give
            + ": too uncertain to tell the profiler's cost from none"
            + (
                "; with DataLoader workers both timings can be paced by the loader, which hides the profiler's "
                "cost to the main process"
                if workers
                else ""
            )
        )
    if ratio <= 1 / DISTORTION_NOTE_AT:
        ranged = f" (unprofiled steps {spread[0]:.1f} to {spread[1]:.1f} ms)" if spread else ""
        if workers and refilled:
            return (
                said + give + ", which the profiler cannot cause: the DataLoader workers had batches queued during "
                "the profiler's pauses (see refilled_by), so the trace understates the input wait; the unprofiled "
                f"step{ranged} is the closer figure of the loader-bound pace"
            )
        return (
            said + give + ", which the profiler cannot cause: the host's pace changed between the two timings"
            f"{ranged}, so the ratio says nothing of the profiler's cost here"
        )
    if ratio < DISTORTION_NOTE_AT:
        return None
    if workers:
        return (
            said + give + f": the profiler slows the main process while the {workers} DataLoader workers run "
            "unprofiled in their own processes, so each profiled step gives them more time to load and input "
            f"waits the bench feels may not show in the trace ({lean})"
        )
    if device_input:
        return said + give + ": the trace's CPU times are inflated; the GPU's figures are not"
    return (
        said + give + ": loading runs in the profiled main process, so the trace overstates the in-process "
        f"input cost ({lean})"
    )


def unprofiled_pace(
    unprofiled: dict[str, Any] | None, cpu_runs_ahead: bool = False
) -> tuple[float | None, list[float] | None]:
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


def ratio_se(
    ratio: float | None, profiled_ms: Sequence[float] | None, unprofiled_ms: Sequence[float] | None
) -> tuple[float | None, float | None]:
    """One standard error of mean(profiled) / mean(unprofiled) from the spread of each (the delta method, the
    steps taken as independent: an alternating pace counts as spread), and its Welch-Satterthwaite degrees
    of freedom. (None, None) with fewer than 2 of either."""
    if ratio is None or len(profiled_ms or []) < 2 or len(unprofiled_ms or []) < 2:
        return None, None
    parts = [
        (statistics.variance(xs) / len(xs) / statistics.fmean(xs) ** 2, len(xs) - 1)
        for xs in (profiled_ms, unprofiled_ms)
    ]
    total = sum(v for v, _ in parts)
    df = total**2 / sum(v * v / d for v, d in parts) if total else None
    return ratio * math.sqrt(total), df


def pooled_pace(
    capture: dict[str, Any], cpu_runs_ahead: bool = False
) -> tuple[float | None, list[float] | None, list[tuple[str, float, list[float] | None, int | None]]]:
    """The unprofiled step of the run: the steps before and after the capture pooled (unprofiled_pace on
    each block), their per-step times, and each block as (name, mean ms, per-step ms or None, steps timed).
    A run recorded before the second block was timed, or stopped before it completed a step, has the first
    alone."""
    blocks = []
    for name, key in (("before", "unprofiled"), ("after", "unprofiled_after")):
        mean, steady = unprofiled_pace(capture.get(key), cpu_runs_ahead)
        each = (capture.get(key) or {}).get("step_ms_each")
        if steady is None and each:  # a block a stop cut short to 1 or 2 steps keeps them (--unprofiled-steps >= 3)
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


def distortion_interval(
    profiled_ms: float | None,
    profiled_each: Sequence[float] | None,
    blocks: list[tuple[str, float, list[float] | None, int | None]],
) -> dict[str, Any]:
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
        out.update(
            {
                f"unprofiled_{name}_ms": mean,
                f"unprofiled_{name}_steps": steps,
                f"unprofiled_{name}_sd_ms": statistics.stdev(each) if many else None,
            }
        )
        ratio = profiled_ms / mean if profiled_ms and mean else None
        se, df = ratio_se(ratio, profiled_each, each)
        # On the log scale (se / ratio is the log ratio's se): a ratio of step times stays above 0.
        spans.append(
            None if se is None else (ratio * math.exp(-t975(df) * se / ratio), ratio * math.exp(t975(df) * se / ratio))
        )
    if spans and None not in spans:
        out["distortion_low"], out["distortion_high"] = min(a for a, _ in spans), max(b for _, b in spans)
    if len(blocks) < 2:
        return out
    (_, b, before, _), (_, a, after, _) = blocks
    out["unprofiled_drift"] = a / b
    if not (before and after and len(before) >= 2 and len(after) >= 2):
        return out
    if not profiled_ms:  # no profiled time: there is no ratio for a drift to move
        return out
    vb, va = statistics.variance(before) / len(before), statistics.variance(after) / len(after)
    df = (vb + va) ** 2 / (vb * vb / (len(before) - 1) + va * va / (len(after) - 1)) if vb + va else None
    differ = abs(a - b) > t975(df) * math.sqrt(vb + va) if vb + va else a != b
    # A drift matters when it moves the ratio by more than a quarter of the slow-down itself: blocks of
    # near-constant steps (a CUDA-graph replay) differ by 0.01 ms "beyond their spread" and change nothing.
    moved = abs(profiled_ms / b - profiled_ms / a)
    if differ and moved > DRIFT_MATTERS * abs(profiled_ms / ((a + b) / 2) - 1):
        out["distortion_uncertain"] = (
            f"the unprofiled steps before the capture took {b:.2f} ms and those after it {a:.2f} ms, further "
            "apart than their own spread allows: the host's pace drifted across the capture"
        )
    return out


DRIFT_MATTERS = (
    0.25  # the blocks' drift makes the distortion uncertain when it moves the ratio this share of (ratio - 1)
)


def refilled_steps(refilled_by: list[dict[str, Any]]) -> set[int]:
    """The profiler steps a cycle's refilling pauses served."""
    return {i for r in refilled_by for i in r["steps"]}


def clean_steps(cycles: list[dict[str, Any]], evidences: dict[int, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """When every cycle has steps a refill served: the traced steps none served, with their per-step figures,
    if the cycles read idle time on the CPU's steps (per-step figures then add up to the window's; on the
    GPU's own timeline they do not, and no step is returned)."""
    if any(evidences[c["cycle"]].get("idle_basis") != "cpu_steps" for c in cycles):
        return []
    out = []
    for c in cycles:
        served = refilled_steps(c["refilled_by"])
        out += [
            (c["cycle"], s)
            for s in evidences[c["cycle"]]["steps"]
            if s["step"] not in served and s.get("pace_us") and s.get("gpu_idle_us") is not None
        ]
    return out


def pool_steps(head: dict[str, Any], steps: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The headline's figures over these (cycle, step) pairs alone, read on the CPU's steps: the profiled step
    and the CPU step are the same there; the GPU span per step over the steps with a complete slot."""
    n = len(steps)
    steps = [s for _, s in steps]
    pace, idle = sum(s["pace_us"] for s in steps), sum(s["gpu_idle_us"] for s in steps)
    head = {
        **head,
        "null_reasons": dict(head["null_reasons"]),
        "profiled_step_ms": pace / n / 1e3,
        "cpu_step_ms": sum(s["wall_us"] for s in steps) / n / 1e3,
        "gpu_idle_share": idle / pace,
        "input_gap_share": sum(s["input_gap_us"] for s in steps) / idle if idle else 0.0,
        "gpu_work_ms_per_step": sum(s["gpu_work_us"] for s in steps) / n / 1e3,
        "gpu_span_ms_per_step": None,
    }
    head["null_reasons"].pop("gpu_span_ms_per_step", None)
    slots = [s for s in steps if s.get("gpu_span_us") is not None]
    if slots:
        head["gpu_span_ms_per_step"] = sum(s["gpu_span_us"] for s in slots) / len(slots) / 1e3
    else:
        head["null_reasons"]["gpu_span_ms_per_step"] = "none of the headline steps has a complete GPU slot"
    return head


def loop_timings(
    capture: dict[str, Any], cycles: list[dict[str, Any]], evidences: dict[int, dict[str, Any]], pace_s: float | None
) -> tuple[list[float | None], dict[int, float], dict[int, float]]:
    """Each loop step's compute time (its time less its wait for input) and the waits of WAITED_AT of a
    batch's time or more ({step: seconds}), from the capture's own measurements where it has them (steps_s,
    inputs_s), else from the traces (a ProfilerStep's wall time less its input scope); a step neither
    covers gets the mean compute time of the others (the schedule's wait and warm-up steps in runs recorded
    before the loop timed its waits)."""
    n = len(capture["pauses_s"])
    pad = lambda xs: (list(xs or []) + [None] * n)[:n]  # noqa: E731
    took, waited = pad(capture.get("steps_s")), pad(capture.get("inputs_s"))
    traced = {
        s["step"]: (s["wall_us"] / 1e6, (s["scopes_cpu_us"].get(evidences[c["cycle"]]["scope_set"][0]) or 0.0) / 1e6)
        for c in cycles
        for s in evidences[c["cycle"]]["steps"]
    }  # a step outside the loop's n is never read
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
    seen = {
        i: w for i, w in measured.items() if w >= WAITED_AT * (pace_s if pace_s else (compute[i] or 0.0) + w) and w > 0
    }
    return compute, seen, measured


def capture_account(
    capture: dict[str, Any],
    cycles: list[dict[str, Any]],
    head: dict[str, Any],
    figures: dict[str, Any],
    steady: list[float] | None,
    compute_s: Sequence[float | None],
    seen: dict[int, float],
    chosen: list[int],
    clean: bool,
) -> dict[str, Any]:
    """The capture's account kept beside each cycle's evidence: the unprofiled pace, the distortion, the pauses."""
    unprofiled_ms, ratio, se, df = (
        figures["unprofiled_step_ms"],
        figures["profiler_distortion"],
        figures["profiler_distortion_se"],
        figures["profiler_distortion_df"],
    )
    # distortion_interval's figures: the three set above come again, with the same values, in their places
    bracket = {k: v for k, v in figures.items() if k != "profiler_distortion_df"}
    interval = None if bracket["distortion_low"] is None else (bracket["distortion_low"], bracket["distortion_high"])
    return {
        "detail": capture["detail"],
        "unprofiled_step_ms": unprofiled_ms,
        "unprofiled_steps": capture["unprofiled"]["steps"] if capture.get("unprofiled") else None,
        "profiled_step_ms": head["profiled_step_ms"],
        "profiler_distortion": ratio,
        "profiler_distortion_se": se,
        "unprofiled_step_ms_each": steady,
        **bracket,
        "distortion_sentence": distortion_sentence(
            ratio,
            capture["workers"],
            capture["device_input"],
            se,
            capture["detail"],
            df,
            refilled=any(c["refilled_by"] for c in cycles),
            spread=(min(steady), max(steady)) if steady else None,
            interval=interval,
            uncertain=bracket["distortion_uncertain"],
        ),
        "queue_depth": capture["queue_depth"],
        "queue": capture["queue"],
        "run_label": capture.get("run_label"),
        "pauses_s": [round(p, 4) for p in capture["pauses_s"]],
        "compute_s": [None if t is None else round(t, 4) for t in compute_s],
        "waits_seen_s": {str(k): round(v, 4) for k, v in seen.items()},
        "headline_cycles": chosen,
        "headline_clean": clean,
        "headline_steps": head["headline_steps"],
        "dumps": [
            {"cycle": d["cycle"], "seconds": d.get("dump_seconds"), "before_step": d["dump_before_step"]}
            for d in cycles
            if d.get("dump_before_step") is not None
        ],
    }


def capture_headline(
    capture: dict[str, Any], cycles: list[dict[str, Any]], evidences: dict[int, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[int, dict[str, Any]]] | None]:
    """The capture weighed against the cycles' evidence: the headline, the capture's account, the steps pooled.

    Each cycle's refilled_by (the pauses whose refills served its steps, refills) and follows_dump are set;
    the headline is pooled over the cycles no refill served, else over the steps none served (clean_steps),
    with the profiler's distortion against the unprofiled pace (pooled_pace, ratio_se, distortion_interval).
    Returns the headline, the capture's account (capture_account) and the (cycle, step) pairs the headline
    was pooled over (None where it was pooled over whole cycles, head["headline_cycles"]).
    """
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
    head = diagnosis.headline([evidences[k] for k in chosen])
    picked = None if clean else clean_steps(cycles, evidences)
    if picked:
        chosen = sorted({k for k, _ in picked})
        head = pool_steps(diagnosis.headline([evidences[k] for k in chosen]), picked)
    elif not clean:
        head["gpu_idle_share"] = head["input_gap_share"] = None
        head["null_reasons"]["input_wait"] = (
            "every traced step found its batch queued by a refill during a pause (see refilled_by per cycle), "
            "or no step was read on the CPU's steps: the trace may hide input waits the bench feels"
        )
    head["headline_steps"] = [s["step"] for _, s in picked] if picked else None
    profiled = (
        [s["pace_us"] / 1e3 for _, s in picked]
        if picked
        else [s["pace_us"] / 1e3 for k in chosen for s in evidences[k]["steps"] if s.get("pace_us")]
    )
    ratio = head["profiled_step_ms"] / unprofiled_ms if unprofiled_ms and head["profiled_step_ms"] else None
    se, df = ratio_se(ratio, profiled, steady)
    bracket = distortion_interval(head["profiled_step_ms"], profiled, blocks)
    head.update(
        unprofiled_step_ms=unprofiled_ms,
        profiler_distortion=ratio,
        profiler_distortion_se=se,
        profiler_distortion_df=df,
        **bracket,
        headline_cycles=chosen,
        unprofiled_step_ms_range=[min(steady), max(steady)] if steady else None,
    )
    figures = {
        "profiler_distortion": ratio,
        "profiler_distortion_se": se,
        "profiler_distortion_df": df,
        "unprofiled_step_ms": unprofiled_ms,
        **bracket,
    }
    account = capture_account(capture, cycles, head, figures, steady, compute_s, seen, chosen, bool(clean))
    return head, account, picked
