"""The verdict: which stage holds the step, from the evidence of one or more traces.

The rule and its thresholds: docs/EVIDENCE.md#the-verdict."""

from collections.abc import Callable, Iterable
from typing import Any

from steplens.evidence import delays
from steplens.evidence.attribution import EPS_US, NO_GPU, NO_INPUT, OUTSIDE_SCOPES, pooled_classes
from steplens.scopes import EVAL_FORWARD, EVAL_TO_DEVICE, SAVE, SCOPES
from steplens.trace import kernels


def headline(evidences: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
    """The figures logged as Polyaxon outputs, pooled over one or several traces' windows.

    profiled_step_ms is the basis span per step (the CPU's step, or the GPU's when the CPU runs
    ahead); the idle shares come from each window's own basis. gpu_span_ms_per_step is the mean of the
    complete GPU slots (each window's last step has none), null when no window has one;
    gpu_work_ms_per_step is over all steps. Invariant, on the complete slots: the work of the steps that
    have one never exceeds their span; were it to, gpu_work_ms_per_step is null and the reason given.
    """
    if isinstance(evidences, dict):
        evidences = [evidences]
    windows = [ev["window"] for ev in evidences]
    steps = sum(w["steps"] for w in windows)
    out = {
        "profiled_step_ms": None,
        "gpu_idle_share": None,
        "input_gap_share": None,
        "gpu_work_ms_per_step": None,
        "gpu_span_ms_per_step": None,
        "cpu_step_ms": None,
        "cpu_runs_ahead": any(ev.get("cpu_runs_ahead") for ev in evidences),
        "null_reasons": {},
    }
    out["cpu_step_ms"] = sum(w["wall_us"] for w in windows) / steps / 1e3
    out.update(pooled_classes(windows, steps))
    bases = {ev.get("idle_basis") for ev in evidences}
    out["idle_basis"] = bases.pop() if len(bases) == 1 else "mixed"
    if all(w.get("pace_us") is not None for w in windows):
        out["profiled_step_ms"] = sum(w["pace_us"] for w in windows) / steps / 1e3
    if not all(ev["has_gpu"] for ev in evidences):
        out["null_reasons"]["gpu"] = NO_GPU
        return out
    missing = [w["gpu_null_reason"] for w in windows if w["gpu_null_reason"]]
    if missing:
        out["null_reasons"]["gpu"] = "; ".join(dict.fromkeys(missing))
        return out
    pace = sum(w["pace_us"] for w in windows)
    idle = sum(w["gpu_idle_us"] for w in windows)
    out["gpu_idle_share"] = idle / pace if pace else None
    gap = sum_known(windows, lambda w: w["input_gap_us"])
    if gap is None:
        out["null_reasons"]["input_gap_share"] = no_input_reason(evidences)
    out["input_gap_share"] = None if gap is None else (gap / idle if idle else 0.0)
    spans = [w["gpu_span_null_reason"] for w in windows if w["gpu_span_null_reason"]]
    if spans:
        out["null_reasons"]["gpu_span_ms_per_step"] = out["null_reasons"]["gpu_work_ms_per_step"] = "; ".join(
            dict.fromkeys(spans)
        )
        return out
    n_slots = sum(w["gpu_slots"] for w in windows)
    work = sum(w["gpu_work_us"] for w in windows) / steps / 1e3
    overlap = [
        w["gpu_span_per_step_null_reason"] for w in windows if w["gpu_slots"] and w["gpu_span_per_step_us"] is None
    ]
    if overlap:
        out["null_reasons"]["gpu_span_ms_per_step"] = out["null_reasons"]["gpu_work_ms_per_step"] = "; ".join(
            dict.fromkeys(overlap)
        )
        return out
    if not n_slots:
        out["null_reasons"]["gpu_span_ms_per_step"] = "; ".join(
            dict.fromkeys(w["gpu_span_per_step_null_reason"] for w in windows)
        )
        out["gpu_work_ms_per_step"] = work
        return out
    out["gpu_span_ms_per_step"] = sum(w["gpu_slots_span_us"] for w in windows) / n_slots / 1e3
    slot_work = sum(w["gpu_slots_work_us"] for w in windows) / n_slots / 1e3
    if slot_work > out["gpu_span_ms_per_step"] + EPS_US / 1e3:
        out["null_reasons"]["gpu_work_ms_per_step"] = (
            f"GPU work per complete slot ({slot_work:.3f} ms) exceeds the GPU span per complete slot "
            f"({out['gpu_span_ms_per_step']:.3f} ms)"
        )
    else:
        out["gpu_work_ms_per_step"] = work
    return out


SAVE_NEXT = (
    "save less often (--checkpoint-every), or copy the state to host memory and write the file from a "
    "background thread, then measure the save with mode=bench"
)


# The tutorial's decision rule: the stage that holds the largest part of the step, and what to try next.
# On a GPU trace the parts are the GPU's busy time and its waits for the host, split by the scope the host
# was in (the input gap is the wait inside input/next_batch); on a CPU-only trace, the four scopes' CPU time.
STAGES = {  # part: (stage in the tutorial's words, what shows it with {p} for its share, what to try next)
    "busy": (
        "GPU compute",
        "the GPU is busy for {p} of the step",
        "make the GPU's work cheaper or larger (bf16 autocast, channels-last, torch.compile, a larger "
        "batch: see the candidate fixes), then measure with mode=bench",
    ),
    "input": (
        "waiting for input",
        "the GPU sits idle while {source} runs for {p} of the step (the input gap)",
        "more DataLoader workers within the job's CPUs (--workers 4; -P workers=4 on Polyaxon), then measure "
        "with mode=bench",
    ),
    "input/to_device": (
        "copying input to the GPU",
        "the GPU sits idle while input/to_device runs for {p} of the step",
        "a side-stream copy (--prefetch-stream) or --gpu-input, then measure with mode=bench",
    ),
    "train/forward_backward": (
        "host-side launch overhead",
        "the GPU sits idle waiting for train/forward_backward's kernel launches for {p} of the step",
        "fewer, larger launches (--cuda-graph with --gpu-input, --compile default, a "
        "larger batch), then measure with mode=bench",
    ),
    "train/optimizer": (
        "the optimizer",
        "the GPU sits idle waiting for train/optimizer's launches for {p} of the step",
        "one fused update kernel (--fused-sgd), then measure with mode=bench",
    ),
    EVAL_TO_DEVICE: (
        "copying input to the GPU",
        "the GPU sits idle while eval/to_device runs for {p} of the step",
        "pinned memory and a non-blocking copy of each held-out batch, then measure with mode=bench",
    ),
    EVAL_FORWARD: (
        "host-side launch overhead",
        "the GPU sits idle waiting for eval/forward's kernel launches for {p} of the step",
        "fewer, larger launches (--compile default, a larger batch), then measure with mode=bench",
    ),
    SAVE: (
        "saving a checkpoint",
        "the GPU sits idle while checkpoint/save runs for {p} of the step",
        SAVE_NEXT,
    ),
    OUTSIDE_SCOPES: (
        "host work outside the four scopes",
        "the GPU sits idle waiting for the host outside the four scopes for {p} of the step",
        "look in the trace at what the CPU runs between the scopes",
    ),
    "queued": (
        "GPU-side gaps",
        "the GPU sits idle with work queued for {p} of the step",
        "look for synchronizations in the trace (the sync calls row)",
    ),
    "communication": (
        "communication between ranks",
        "the GPU runs nothing but communication kernels (NCCL) for {p} of the step",
        "find the rank the others wait for (steplens ranks OUTPUTS/traces), then overlap communication with compute",
    ),
}


CPU_STAGES = {
    "input": ("waiting for input", STAGES["input"][2]),
    "input/to_device": ("copying input", "look at the copy's CPU cost in the trace"),
    "train/forward_backward": ("CPU compute (forward and backward)", "profile on a GPU to see what the GPU would do"),
    "train/optimizer": ("the optimizer", "--fused-sgd, or profile on a GPU"),
    EVAL_TO_DEVICE: ("copying input", "look at the copy's CPU cost in the trace"),
    EVAL_FORWARD: ("CPU compute (the forward pass)", "profile on a GPU to see what the GPU would do"),
    SAVE: ("saving a checkpoint", SAVE_NEXT),
    OUTSIDE_SCOPES: ("CPU work outside the input", "add the four scopes to the loop to tell it apart"),
}


HOST_SCOPES = SCOPES[1:]  # the scopes after the input: a GPU wait inside them is no input wait


def scope_names(evidences: list[dict[str, Any]]) -> tuple[str, ...]:
    """The scopes the traces were read by (summarize's scope_set: a phase's, steplens/scopes.py); the four
    training scopes for evidence written before phases, or when the traces disagree."""
    sets = {tuple(ev.get("scope_set") or SCOPES) for ev in evidences}
    return sets.pop() if len(sets) == 1 else SCOPES


GPU_BOUND_AT = 0.5  # busy for at least this share of the step: GPU compute holds it; else what the GPU waits for


CLOSE = 0.10  # a runner-up within this share of the step is named beside the stage


def _pct(x):
    return f"{100 * x:.0f}%"


def sum_known(parts: Iterable[dict[str, Any]], get: Callable[[dict[str, Any]], float | None]) -> float | None:
    """The parts' total of a figure, or None when any part lacks it."""
    values = [get(p) for p in parts]
    return None if None in values else sum(values)


def _source(evidences):
    names = {(ev.get("input_source") or {}).get("name") for ev in evidences}
    return names.pop() if len(names) == 1 else None


def no_input_reason(evidences: list[dict[str, Any]]) -> str:
    """Why the traces give no input figure, in their own words (a missing --input-scope says its name)."""
    return "; ".join(dict.fromkeys((ev.get("input_source") or {}).get("null_reason") or NO_INPUT for ev in evidences))


def _cpu_verdict(out, cpu, wall, named, no_input, own, loader):
    """A CPU-only trace: the largest CPU part holds the step (it cannot tell whether a GPU would wait)."""
    if not cpu:
        out["sentence"] = (
            f"Cannot tell: a CPU-only trace without record_function scopes or an input source shows "
            f"neither GPU tracks nor where the CPU's time goes ({no_input})."
        )
        return out
    part = max(cpu, key=cpu.get)
    stage, nxt = CPU_STAGES[part]
    nxt = nxt if own else _foreign_next(part, loader)
    out.update(stage=stage, part=part, share=cpu[part] / wall, next=nxt)
    what = _cpu_part_name(part, named)
    detail = f"{what} takes {_pct(out['share'])} of the step's CPU time"
    second = max((k for k in cpu if k != part), key=cpu.get, default=None)
    if second is not None and cpu[second] > 0 and (cpu[part] - cpu[second]) / wall <= CLOSE:
        out["runner_up"] = {"stage": CPU_STAGES[second][0], "part": second, "share": cpu[second] / wall}
        detail += f", closely followed by {_cpu_part_name(second, named)} ({_pct(cpu[second] / wall)})"
    out["sentence"] = (
        f"{stage[0].upper()}{stage[1:]} holds the step: {detail} (a CPU-only trace has no GPU tracks: it "
        f"cannot tell whether a GPU would wait). Next: {nxt}."
    )
    return out


def _cpu_part_name(part, named):
    return named if part == "input" else ("the rest of the step" if part == OUTSIDE_SCOPES else part)


# What to try next on a trace of someone else's loop (it lacks the four scopes): no companion flags.
FOREIGN_NEXT = {
    "busy": "make the GPU's work cheaper or larger (bf16 autocast, channels_last, torch.compile, a larger batch)",
    "input": "more DataLoader worker processes (num_workers) within the job's CPUs, or a cheaper transform",
    "input, no DataLoader": "prepare the next batch while the step runs (a DataLoader with worker processes, "
    "or a background thread), or make it cheaper",
}


MEASURE = "then time the change without the profiler, a few runs each way"


def _foreign_next(part, loader):
    """The next step for a part of a loop that is not the companion's (no flags of train.py in it)."""
    if part == "input":
        return f"{FOREIGN_NEXT['input' if loader else 'input, no DataLoader']}, {MEASURE}"
    if part in FOREIGN_NEXT:
        return f"{FOREIGN_NEXT[part]}, {MEASURE}"
    return STAGES[part][2] if part in STAGES and "--" not in STAGES[part][2] else CPU_STAGES[OUTSIDE_SCOPES][1]


def _gpu_shares(parts, has_scopes, hosts=HOST_SCOPES):
    """Shares of the step: GPU busy, communication, and each thing the idle GPU waited for."""
    pace = sum(p["pace_us"] for p in parts)
    gap = sum_known(parts, lambda p: p.get("input_gap_us"))
    comm = sum(p.get("gpu_comm_only_us") or 0.0 for p in parts)
    shares = {"busy": sum(p["gpu_busy_us"] for p in parts) / pace - comm / pace}
    if comm:
        shares["communication"] = comm / pace
    waited = sum(p["host_wait_us"] for p in parts)
    host = {n: sum(p["waits_by_scope_us"].get(n, 0.0) for p in parts) for n in hosts} if has_scopes else {}
    if gap is not None:
        shares["input"] = gap / pace
    shares.update({n: v / pace for n, v in host.items()})
    shares[OUTSIDE_SCOPES] = max(0.0, waited - (gap or 0.0) - sum(host.values())) / pace
    shares["queued"] = max(0.0, sum(p["gpu_idle_us"] - p["host_wait_us"] for p in parts) / pace)
    return shares, gap


def _gpu_sentence(out, shares, part, named, nxt=None):
    """The sentence of a GPU trace's verdict, with its runner-up when within CLOSE of the step.

    nxt: what to try next, where the trace is not the companion's own (else the stage's own advice)."""
    idle_parts = [k for k in shares if k != "busy"]
    stage, shows, own_next = STAGES[part]
    nxt = nxt or own_next
    out.update(stage=stage, part=part, share=shares[part], next=nxt)
    second = max((k for k in idle_parts if k != part), key=shares.get)
    close = part != "busy" and shares[part] - shares[second] <= CLOSE and shares[second] > 0
    if close:
        out["runner_up"] = {"stage": STAGES[second][0], "part": second, "share": shares[second]}
    detail = shows.format(p=_pct(shares[part]), source=named)
    if close:
        detail += f", closely followed by {STAGES[second][0]} ({_pct(shares[second])})"
    if part == "busy":
        if shares[second] >= CLOSE:
            detail += f"; its largest wait is {STAGES[second][0]} ({_pct(shares[second])})"
        out["sentence"] = f"GPU compute holds the step: {detail}. Next: {nxt}."
    else:  # the GPU idles for more than half the step: the stage is what it waits for most
        idle = 1 - shares["busy"] - shares.get("communication", 0.0)
        out["sentence"] = (
            f"The GPU idles for {_pct(idle)} of the step, and {stage} is its largest wait: {detail}. Next: {nxt}."
        )


# A candidate fix the kernels can show applied: its words in the advice, its name, and what shows it.
APPLIED = {
    "bf16": (("bf16 autocast, ",), "bf16 autocast", "bf16 or fp16 convolutions and matrix multiplies"),
    "channels_last": (
        ("channels-last, ", "channels_last, "),
        "channels-last",
        "NHWC convolutions without layout conversions",
    ),
    "compile": (("torch.compile, ",), "torch.compile", "triton kernels"),
}
HALF_AT = 0.5  # half precision is applied when it runs this share of the convolutions' and matmuls' GPU time
NHWC_AT, CONVERSION_BELOW = 0.5, 0.02  # NHWC convolutions, and conversions under this share of their time
TRITON_AT = 0.05  # torch.compile is applied when triton kernels run this share of the compute kernels' time


def applied_fixes(evidences: list[dict[str, Any]]) -> list[str]:
    """The candidate fixes the traces' kernel names show applied (APPLIED's keys), pooled over the traces."""
    found = [(ev.get("window") or {}).get("kernel_classes") or {} for ev in evidences]
    s = {k: sum((f.get("signs") or {}).get(k, 0.0) for f in found) for k in kernels.SIGNS}
    out = []
    if s["gemm_us"] and s["half_us"] >= HALF_AT * s["gemm_us"]:
        out.append("bf16")
    if s["conv_us"] and s["nhwc_us"] >= NHWC_AT * s["conv_us"] and s["conversion_us"] < CONVERSION_BELOW * s["conv_us"]:
        out.append("channels_last")
    if s["compute_us"] and s["triton_us"] >= TRITON_AT * s["compute_us"]:
        out.append("compile")
    return out


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _drop_applied(out: dict[str, Any], applied: list[str]) -> None:
    """GPU compute's advice without the fixes the trace shows applied; a sentence names them and what shows it."""
    nxt, left = out["next"], []
    for key in applied:
        found = [words for words in APPLIED[key][0] if words in nxt]
        for words in found:
            nxt = nxt.replace(words, "")
        left += [key] if found else []
    old = f"Next: {out['next']}."
    if not left or old not in out["sentence"]:
        return
    names, shown = _and([APPLIED[k][1] for k in left]), _and([APPLIED[k][2] for k in left])
    out["sentence"] = out["sentence"].replace(old, f"Next: {nxt}.") + (
        f" Left out: {names}, which the kernels show applied ({shown})."
    )
    out["next"], out["applied"] = nxt, left


def verdict(
    evidences: dict[str, Any] | list[dict[str, Any]], parts: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The stage that holds the step, with its share of the step and the figure that shows it.

    evidences: one trace's evidence or several; parts: the figure dicts to pool (default: each trace's
    window; profile mode passes the headline's steps). Returns {"stage", "part", "share", "runner_up",
    "sentence", "next"}; stage is None, and the sentence says why, where the figures cannot tell.
    The rule: docs/EVIDENCE.md#the-verdict.
    """
    if isinstance(evidences, dict):
        evidences = [evidences]
    parts = parts if parts is not None else [ev["window"] for ev in evidences]
    out = _verdict(evidences, parts)
    if out["stage"] is not None and all(ev.get("window_only") for ev in evidences):
        out["one_step"] = True
        out["sentence"] = (
            f"Read as one window (the trace has no steps), so no pattern across steps is claimed. {out['sentence']}"
        )
    elif out["stage"] is not None and sum(p.get("steps", 1) for p in parts) == 1:
        out["one_step"] = True
        out["sentence"] = f"One profiled step, so no pattern across steps is claimed. {out['sentence']}"
    if out["part"] in ("busy", "compute"):  # GPU compute: leave out of the advice what the kernels show done
        _drop_applied(out, applied_fixes(evidences))
    if out["part"] == SAVE:  # the checkpoint phase: name the longest save, its step and the GPU's idle in it
        out["save"] = longest_save(evidences)
        out["sentence"] += save_sentence(out["save"])
    return out


def longest_save(evidences: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The longest checkpoint/save of the traces (summarize's saves), with the trace it is in; None without one."""
    saves = [{**s, "trace": ev["trace"]} for ev in evidences for s in ev.get("saves") or []]
    return max(saves, key=lambda s: s["save_us"]) if saves else None


def save_sentence(save: dict[str, Any] | None) -> str:
    """The verdict's words on the longest save: its step, its length, its share of that step, the GPU's idle in it."""
    if save is None:
        return ""
    where = f"ProfilerStep#{save['step']}" if save["step"] is not None else "no profiled step"
    share = "" if save["share_of_step"] is None else f", {_pct(save['share_of_step'])} of that step"
    idle = (
        f"the GPU sat idle for {save['gpu_idle_us'] / 1e3:.1f} ms of it"
        if save["gpu_idle_us"] is not None
        else "no GPU figure (a CPU-only trace)"
    )
    return f" The longest save, in {where}, took {save['save_us'] / 1e3:.1f} ms{share}; {idle}."


def _verdict(evidences: list[dict[str, Any]], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """verdict's rule over the evidences and the parts to pool."""
    out = {"stage": None, "part": None, "share": None, "runner_up": None, "next": None}
    # 0) a damaged trace whose damage touches the steps, the scopes, the launches or the GPU's events
    damaged = [ev["damage_withheld"] for ev in evidences if ev.get("damage_withheld")]
    if damaged:
        out["sentence"] = (
            f"Withheld: the trace is damaged where the verdict reads it ({'; '.join(damaged)}), so its "
            "figures may be wrong. Export the trace again, or repair it."
        )
        return out
    # 1) enough steps to see a pattern
    steps = sum(p.get("steps", 1) for p in parts)
    if steps < 1:
        out["sentence"] = "Too short to tell: no profiled step."
        return out
    # 2) a CPU-only trace: the CPU's own time
    source, names = _source(evidences), scope_names(evidences)
    own_input, hosts = names[0], names[1:]  # input/next_batch (eval/next_batch) and the scopes after it
    named = f"the input ({source})" if source and source != own_input else own_input
    has_scopes = all(set(names) <= set(ev.get("scopes_present", names)) for ev in evidences)
    wall = sum(p["wall_us"] for p in parts)
    cpu = {"input": sum_known(parts, lambda p: p.get("input_cpu_us", p["scopes_cpu_us"].get(own_input)))}
    if has_scopes:
        cpu.update({n: sum_known(parts, lambda p: p["scopes_cpu_us"][n]) for n in hosts})
    elif cpu["input"] is not None:
        cpu[OUTSIDE_SCOPES] = wall - cpu["input"]
    cpu = {k: v for k, v in cpu.items() if v is not None}
    loader = any((ev.get("input_source") or {}).get("dataloader_in_trace", True) for ev in evidences)
    if not all(ev["has_gpu"] for ev in evidences):
        return _cpu_verdict(out, cpu, wall, named, no_input_reason(evidences), has_scopes, loader)
    # 3) a GPU trace: GPU compute holds the step when busy for GPU_BOUND_AT of it, else its largest wait
    missing = [p.get("gpu_null_reason") for p in parts if p.get("gpu_idle_us") is None or not p.get("pace_us")]
    if missing:
        out["sentence"] = f"Cannot tell which stage holds the step: {'; '.join(dict.fromkeys(map(str, missing)))}."
        return out
    found = delay_shares(parts)
    if found is not None:
        out["delays"] = found
    if not has_scopes and found is not None:  # a loop without the scopes: the delays name the stage
        return _delay_verdict(out, found, evidences, parts, gap_known=sum_known(parts, lambda p: p.get("input_gap_us")))
    shares, gap = _gpu_shares(parts, has_scopes, hosts)
    idle_parts = [k for k in shares if k != "busy"]
    part = "busy" if shares["busy"] >= GPU_BOUND_AT else max(idle_parts, key=shares.get)
    if part == OUTSIDE_SCOPES and not has_scopes:
        out["sentence"] = (
            f"Cannot tell which stage holds the step: the GPU sits idle waiting for the host for "
            f"{_pct(shares[part])} of it outside the input, and the trace labels none of the step's "
            "stages, so it cannot say for what (wrap them in torch.profiler.record_function: input/next_batch, "
            "input/to_device, train/forward_backward, train/optimizer)."
            + ("" if gap is not None else f" No input figure: {no_input_reason(evidences)}.")
        )
        return out
    _gpu_sentence(out, shares, part, named, None if has_scopes else _foreign_next(part, loader))
    if gap is None:
        out["sentence"] += f" No input figure: {no_input_reason(evidences)}."
    elif source and source != own_input:
        out["sentence"] += f" The input is read from {source}."
    return out


# A delay class (steplens/evidence/delays.py) to the stage it names, in the same words as the scopes' stages.
DELAY_STAGES = {
    "compute": "GPU compute",
    "communication": "communication between ranks",
    "input": "waiting for input",
    "copy": "copying input to the GPU",
    "launch": "host-side launch overhead",
    "sync": "synchronizing with the CPU",
    "host": "host work between launches",
    "queued": "GPU-side gaps",
}


def delay_shares(parts: list[dict[str, Any]]) -> dict[str, float] | None:
    """Each delay class's share of the parts' pooled pace; None where a part lacks them."""
    if not parts or any(not p.get("delays_us") or not p.get("pace_us") for p in parts):
        return None
    pace = sum(p["pace_us"] for p in parts)
    return {c: sum(p["delays_us"].get(c, 0.0) for p in parts) / pace for c in delays.CLASSES}


def _delay_verdict(out, shares, evidences, parts, gap_known):
    """The verdict of a GPU trace without the scopes: GPU compute when busy for GPU_BOUND_AT of the step, else
    the largest delay, each with the line of figures behind it and the class of fix that fits."""
    waits = {c: v for c, v in shares.items() if c != "compute"}
    cls = "compute" if shares["compute"] >= GPU_BOUND_AT else max(waits, key=waits.get)
    details = evidences[0]["window"].get("delay_details") or {}
    pace = sum(ev["window"]["pace_us"] or 0.0 for ev in evidences) / max(
        1, sum(ev["window"]["steps"] for ev in evidences)
    )
    per_step = {c: v * pace for c, v in shares.items()}
    source = _source(evidences)
    line = delays.evidence(cls, details, per_step, source) if details else ""
    out.update(stage=DELAY_STAGES[cls], part=cls, share=shares[cls], next=f"{delays.FIXES[cls]}, {MEASURE}")
    second = max((c for c in waits if c != cls), key=waits.get)
    text = f"{DELAY_STAGES[cls][0].upper()}{DELAY_STAGES[cls][1:]} holds the step ({_pct(shares[cls])} of it)"
    if cls == "compute":
        if waits[second] >= CLOSE:
            text += f"; its largest wait is {DELAY_STAGES[second]} ({_pct(waits[second])})"
    else:
        # the GPU's measured idle; its copies with no kernel beside them are busy time, counted under copy
        span = sum(p["pace_us"] for p in parts)  # the parts' pooled pace (pace above is per step)
        idle = sum(p["gpu_idle_us"] for p in parts) / span
        copying = max(0.0, sum(p["gpu_busy_us"] for p in parts) / span - shares["compute"] - shares["communication"])
        text = (
            f"The GPU idles for {_pct(idle)} of the step"
            + (f" and copies for {_pct(copying)} of it" if copying >= 0.01 else "")
            + "; "
            + text[0].lower()
            + text[1:]
        )
        if waits[second] > 0 and shares[cls] - waits[second] <= CLOSE:
            out["runner_up"] = {"stage": DELAY_STAGES[second], "part": second, "share": waits[second]}
            text += f", closely followed by {DELAY_STAGES[second]} ({_pct(waits[second])})"
    out["sentence"] = f"{text}: {line}. Next: {out['next']}." if line else f"{text}. Next: {out['next']}."
    if gap_known is None:
        reason = no_input_reason(evidences)
        why = "no DataLoader, no --input-scope" if reason == NO_INPUT else reason  # a --input-scope typo says its name
        out["sentence"] += f" The trace shows no input source ({why}): a wait for input would read as host work."
    return out
