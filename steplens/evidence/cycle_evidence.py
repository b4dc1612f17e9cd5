"""Profile mode's evidence per cycle: the trace's figures beside the capture's account (distortion.py), the verdict
told the capture's limits, the files."""

import os
import sys
from typing import Any

from steplens.atomic import write_atomic, write_json_atomic
from steplens.evidence import diagnosis, formatting, picture, summarize
from steplens.evidence.distortion import DISTORTION_NOTE_AT, capture_headline
from steplens.stats import t975


def capture_lines(cycle: dict[str, Any], capture: dict[str, Any]) -> list[str]:
    """The evidence text's account of the capture, in plain words: the profiler's cost, the pauses before this
    cycle, and which steps the run's headline figures come from (run.json keeps the terms of docs/EVIDENCE.md)."""
    se = capture.get("profiler_distortion_se")
    cycles = ", ".join(map(str, capture.get("headline_cycles") or [])) or "?"
    lines = [
        f"the profiler's cost (--profile-detail {capture['detail']}), for the whole run (cycle(s) {cycles}, "
        "not this cycle alone): a profiled step took "
        f"{_ms(capture['profiled_step_ms'])} ms, an unprofiled one {_ms(capture['unprofiled_step_ms'])} ms "
        f"({_blocks(capture)}{_spread(capture.get('unprofiled_step_ms_each'))}): the profiler slowed the step "
        f"{_ratio(capture['profiler_distortion'])}x{'' if se is None else f' +/- {se:.2f}'} "
        "(profiler_distortion in run.json)"
    ]
    if capture.get("distortion_low") is not None:
        lines.append(
            f"  95% interval {capture['distortion_low']:.2f} to {capture['distortion_high']:.2f}: it covers "
            "the ratio against either block, each give or take its own sampling error"
        )
    if capture["distortion_sentence"]:
        lines.append(f"  {capture['distortion_sentence']}")
    for d in capture["dumps"]:
        if d["before_step"] <= cycle["profiler_steps"][0]:
            lines.append(
                f"pause: this cycle's steps start {cycle['profiler_steps'][0] - d['before_step']} steps "
                f"after cycle {d['cycle']}'s trace was written ({d['seconds']:.3f} s, before step "
                f"{d['before_step']})"
            )
    for r in cycle["refilled_by"]:
        lines.append(
            f"pause: {r['what']} ({r['seconds']:.3f} s, before step {r['before_step']}) gave the "
            f"DataLoader time for about {r['batches']:g} batches (its queue holds {capture['queue_depth']}, "
            f"{capture['queue']}): step(s) {', '.join(map(str, r['steps']))} found their batch ready where "
            "an unpaused run would have waited, so this cycle may understate the input wait"
        )
    if capture["headline_clean"]:
        lines.append(
            f"the run's headline figures come from cycle(s) "
            f"{', '.join(map(str, capture['headline_cycles']))}: no pause hid an input wait there"
        )
    elif capture.get("headline_steps"):
        lines.append(
            f"the run's headline figures come from the steps no pause served "
            f"({', '.join(map(str, capture['headline_steps']))}): every cycle had steps a pause served"
        )
    else:
        lines.append(
            f"the run's headline figures come from cycle(s) {', '.join(map(str, capture['headline_cycles']))}, "
            "but every traced step found its batch ready after a pause: the idle and input gap "
            "figures are left out"
        )
    return lines


def perfetto_line(cycle: dict[str, Any]) -> list[str]:
    """The evidence text's line on how the trace was made to nest for Perfetto (docs/PERFETTO.md)."""
    p = cycle.get("perfetto")
    if not p:
        return []
    if "error" in p:
        return [
            f"Perfetto: the trace is kept as the profiler exported it, and Perfetto before v57.1 may drop "
            f"slices from it ({p['error']})"
        ]
    return [
        f"Perfetto: {p['clipped']} Python slices clipped by at most {p['clipped_max_us']:.1f} µs, "
        f"{p['moved']} GPU events moved to a sibling track; every slice nests "
        f"({p['violations_before']} would have been dropped by Perfetto before v57.1)"
    ]


def input_lines(figures: dict[str, Any] | None) -> list[str]:
    """The evidence text's lines on the DataLoader's own timeline (docs/INPUT.md#the-dataloader-workers)."""
    if not figures:
        return []
    if not figures.get("verdict"):
        return [f"input: {figures.get('note') or 'too few batches in the window to tell'}"]
    busy = ", ".join(f"{k} {100 * v:.0f}%" for k, v in figures["busy_share"].items())
    make, transport = figures["make_ms"], figures["transport_ms"]
    return [
        f"input: {figures['verdict']}",
        f"  busy share per worker: {busy}; one batch takes {make['median']:.1f} ms to make (p90 "
        f"{make['p90']:.1f}); transport {transport['median']:.2f} ms (p90 {transport['p90']:.2f}); the "
        "profiled step is slower than an unprofiled one, so mode=bench's figures decide",
    ]


def usage_line(cpu: dict[str, Any], memory: dict[str, Any] | None) -> str:
    """A cycle's CPU use and host memory, read at its edges, in one line.

    (docs/INPUT.md#cpu-use-and-host-memory-per-profiled-cycle)"""
    said = f"CPU: {cpu['cpu_sentence']}"
    if memory and memory.get("pss_peak_mb") is not None:
        whose = "main process and workers" if cpu.get("workers_cpu_s") else "main process"
        said += f"; host memory: PSS {memory['pss_peak_mb']:.1f} MB ({whose})"
    if memory and memory.get("shm_peak_mb") is not None:
        said += f", /dev/shm {memory['shm_peak_mb']:g} MB used"
    return said


def usage_lines(cycle: dict[str, Any]) -> list[str]:
    """The evidence text's lines on the cycle's CPU use and host memory; none where they were not read."""
    cpu, memory = cycle.get("cpu"), cycle.get("host_memory")
    if not cpu:
        return []
    workers = sum(s for s in cpu["workers_cpu_s"].values() if s)
    return [
        usage_line(cpu, memory),
        f"  over the cycle's {cpu['window_s']:.3f} s (read as its first step began and as its last ended): main "
        f"process {cpu['main_cpu_s']:.3f} CPU s, {len(cpu['workers_cpu_s'])} workers {workers:.3f} CPU s; "
        f"{sum(cpu['nonvoluntary_switches'].values())} involuntary context switches; PSS and /dev/shm are "
        "the larger of the two reads",
    ]


def _blocks(capture):
    """The unprofiled blocks in words: the steps before the capture, and those after it where timed."""
    after = capture.get("unprofiled_after_ms")
    if after is None:
        return f"{capture['unprofiled_steps']} steps in the same process just before the capture"
    before, drift = capture["unprofiled_before_ms"], capture["unprofiled_drift"]
    sd = lambda k: "" if capture.get(k) is None else f", sd {capture[k]:.2f}"  # noqa: E731
    return (
        f"{capture['unprofiled_before_steps']} steps in the same process just before the capture, "
        f"{before:.2f} ms{sd('unprofiled_before_sd_ms')}, and {capture['unprofiled_after_steps']} just after "
        f"it, {after:.2f} ms{sd('unprofiled_after_sd_ms')}: after/before {drift:.2f}"
    )


def _spread(each):
    return f"; the {len(each)} averaged, {min(each):.2f} to {max(each):.2f} ms" if each else ""


def _ms(v):
    return "n/a" if v is None else f"{v:.2f}"


def _ratio(v):
    return "n/a" if v is None else f"{v:.2f}"


def write_cycle_files(
    c: dict[str, Any],
    evidence: dict[str, Any],
    account: dict[str, Any],
    head: dict[str, Any],
    on: dict[str, Any] | None,
    first: bool,
) -> None:
    """One cycle's evidence files (.evidence.json, .evidence.txt) and picture, with its verdict told the capture's
    limits (the headline's distortion figures, profiler_caveat); the cycle's entry in run.json gets their paths."""
    evidence["verdict"] = profiler_caveat(tailor_next(evidence["verdict"], on), [evidence["window"]], head)
    if c["refilled_by"] and evidence["verdict"]["stage"]:
        evidence["verdict"]["sentence"] += (
            " This cycle followed a pause that refilled the loader's queues: its input waits may be understated."
        )
    c["picture"], c["picture_note"] = draw_cycle(c, evidence, account.get("run_label"))
    if c["picture_note"] and first:  # one line a run: the reason is the same for every cycle
        print(f"profile: {c['picture_note']}", file=sys.stderr)
    for step in evidence["steps"]:
        step.pop("lanes", None)
    c["verdict"] = evidence["verdict"]["sentence"]
    evidence["capture"] = {**account, "cycle": c["cycle"], "refilled_by": c["refilled_by"]}
    if c.get("input"):  # the DataLoader's own timeline over this cycle's steps (job/loader_timeline.py)
        evidence["input"] = c["input"]
    if c.get("cpu"):  # CPU use and host memory read at the cycle's edges (job/capture.py CycleEdges)
        evidence["cpu"], evidence["host_memory"] = c["cpu"], c["host_memory"]
    base = c["trace"].rsplit(".pt.trace.", 1)[0]
    c["evidence_json"] = write_json_atomic(base + ".evidence.json", evidence)
    lines = capture_lines(c, account) + perfetto_line(c) + input_lines(c.get("input")) + usage_lines(c)
    text = formatting.format_table([evidence]) + "\n".join(lines) + "\n"
    c["evidence_txt"] = write_atomic(base + ".evidence.txt", text)
    c["evidence"] = diagnosis.headline(evidence)
    if evidence["has_gpu"]:  # Kineto's dropped records, read from the trace: launches whose GPU work is missing
        c["gpu_work_launches"] = evidence["window"]["gpu_work_launches"]
        c["launches_without_gpu_work"] = evidence["window"]["launches_without_gpu_work"]
    c["step_wall_ms"] = {s["step"]: s["wall_us"] / 1000.0 for s in evidence["steps"]}


def write_evidence(cycles: list[dict[str, Any]], capture: dict[str, Any]) -> dict[str, Any]:
    """steplens summarize over each cycle's trace, saved beside it with the capture's account; the headline figures.

    capture: detail, unprofiled (time_unprofiled's dict), pauses_s, steps_s and inputs_s (each loop step's
    duration and its wait for input, where measured), queue_depth, queue (words), workers, device_input.
    The headline is pooled over the cycles no refill served, else over the steps none served
    (distortion.capture_headline).
    """
    evidences = {c["cycle"]: summarize.summarize_file(c["trace"], lanes=True) for c in cycles}
    head, account, picked = capture_headline(capture, cycles, evidences)
    chosen = head["headline_cycles"]
    for c in cycles:
        write_cycle_files(c, evidences[c["cycle"]], account, head, capture.get("on"), first=c is cycles[0])
    head["distortion_sentence"] = account["distortion_sentence"]
    shown = [s for _, s in picked] if picked else [evidences[k]["window"] for k in chosen]
    inputs = diagnosis.sum_known(shown, lambda p: p.get("input_cpu_us"))
    head["input_cpu_share"] = inputs / sum(p["wall_us"] for p in shown) if inputs is not None else None
    head["verdict"] = headline_verdict(head, [evidences[k] for k in chosen], picked, capture.get("on"))
    print(f"profile: verdict: {head['verdict']['sentence']}", file=sys.stderr)
    if capture.get("input"):  # the DataLoader's own timeline over every cycle's steps
        head["input"] = capture["input"]
        print(f"profile: input: {capture['input'].get('verdict') or capture['input'].get('note')}", file=sys.stderr)
    if head.get("gpu_top_classes"):  # what the GPU does: the table is in each cycle's evidence text
        print(f"profile: GPU time by kernel class: {head['gpu_top_classes']}", file=sys.stderr)
    return head


def headline_verdict(
    head: dict[str, Any],
    evidences: list[dict[str, Any]],
    picked: list[tuple[int, dict[str, Any]]] | None,
    on: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """diagnosis.verdict over the headline's cycles (or steps), told where the capture limits it: no verdict
    where a refill may hide the input waits, and the profiler's slow-down weighed (profiler_caveat)."""
    if head["null_reasons"].get("input_wait"):
        return {
            "stage": None,
            "part": None,
            "share": None,
            "runner_up": None,
            "next": None,
            "sentence": f"Cannot tell which stage holds the step: {head['null_reasons']['input_wait']}.",
        }
    parts = [s for _, s in picked] if picked else [ev["window"] for ev in evidences]
    return profiler_caveat(tailor_next(diagnosis.verdict(evidences, parts if picked else None), on), parts, head)


def profiler_caveat(v: dict[str, Any], parts: list[dict[str, Any]], head: dict[str, Any]) -> dict[str, Any]:
    """The verdict with the profiler's slow-down weighed, where its 95% interval excludes none.

    The profiler slows the host side, so the GPU's waits for the host grow in the profiled steps while its
    busy time does not. When the GPU's busy time per step would fill GPU_BOUND_AT of the unprofiled step,
    the profiled waits may be the profiler's own: the stage is withheld (profiled_stage keeps it) and the
    sentence says both readings. The interval is distortion_low's where the evidence has it (the steps before
    and after the capture), else the ratio's own (runs timed before the capture alone)."""
    ratio, se, unprofiled, low, high = (
        head.get(k)
        for k in (
            "profiler_distortion",
            "profiler_distortion_se",
            "unprofiled_step_ms",
            "distortion_low",
            "distortion_high",
        )
    )
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
    if v["part"] != "busy" and busy_ms is not None and busy_ms / unprofiled >= diagnosis.GPU_BOUND_AT:
        v = {
            **v,
            "profiled_stage": v["stage"],
            "profiled_share": v["share"],
            "stage": None,
            "part": None,
            "share": None,
            "next": None,
            "unprofiled_busy_share": busy_ms / unprofiled,
        }
        v["sentence"] = (
            f"Uncertain: in the profiled steps {v['profiled_stage']} is the GPU's largest wait "
            f"({100 * v['profiled_share']:.0f}% of the step), but the profiler made those steps "
            f"{times} as long; at the unprofiled pace ({unprofiled:.2f} ms) the GPU's "
            f"{busy_ms:.2f} ms of work would fill {100 * busy_ms / unprofiled:.0f}% of the step, where "
            "GPU compute holds it. mode=bench, against a change, decides."
        )
        return v
    return {
        **v,
        "sentence": v["sentence"] + f" The profiler made these steps {times} as long as unprofiled "
        "ones: the shares are of the profiled step.",
    }


LEVERS = (  # flag, whether the run has it on, the key of diagnosis.APPLIED the kernels can show it by
    ("--amp bf16", lambda on: on.get("amp") == "bf16", "bf16"),
    ("--channels-last", lambda on: on.get("channels_last"), "channels_last"),
    ("--compile default", lambda on: on.get("compile") not in (None, "off"), "compile"),
)


def tailor_next(v: dict[str, Any], on: dict[str, Any] | None) -> dict[str, Any]:
    """GPU compute's next step in this run's terms: the options neither on nor shown applied by the kernels (the
    verdict's "applied": torch.compile may lay convolutions out in NHWC by itself), and a larger batch."""
    if v.get("part") != "busy" or on is None:
        return v
    shown = v.get("applied") or []
    levers = [flag for flag, is_on, key in LEVERS if not is_on(on) and key not in shown] + ["a larger --batch-size"]
    nxt = f"make the GPU's work cheaper or larger ({', '.join(levers)}), then measure with mode=bench"
    return {**v, "next": nxt, "sentence": v["sentence"].replace(f"Next: {v['next']}.", f"Next: {nxt}.")}


def draw_cycle(c: dict[str, Any], evidence: dict[str, Any], label: str | None = None) -> tuple[str | None, str | None]:
    """The cycle's step picture beside its trace (picture.py), its title opening on the run's label
    (formatting.run_label); its path, or None and the reason."""
    folder, base = os.path.split(c["trace"].rsplit(".pt.trace.", 1)[0])
    path = os.path.join(folder, base.replace("trace-", "picture-", 1) + ".png")
    title = f"cycle {c['cycle']}, ProfilerStep#{c['profiler_steps'][0]}-{c['profiler_steps'][1]}"
    title = f"{label}: {title}" if label else title
    try:
        picture.draw(evidence, path, title)
    except picture.NoPicture as e:
        return None, str(e)
    return path, None
