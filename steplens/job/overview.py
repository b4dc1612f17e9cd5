"""A run's answer in Markdown for Polyaxon's run page: its one-line description and its readme.

Polyaxon's UI (a cluster's, or `haupt viewer --path ROOT` over offline runs) shows the readme in the
run page's overview panel. Everything here is read from the run's record (run.json's data); a figure
the record holds as null is written "n/a", with the reason where the record gives one. File names
are relative to the run's outputs/ folder (the UI's Files tab). Given where the run's files are served
(image_url), each step picture also shows in the readme as an image; its path stays beside it.
"""

import json
import os
from collections.abc import Callable
from typing import Any

# A file's path under the run's outputs/ folder -> the URL path Polyaxon serves it at (None: not served).
ImageUrl = Callable[[str], "str | None"]


def succeeded(data: dict[str, Any], out_dir: str, image_url: ImageUrl | None = None) -> tuple[str, str]:
    """(description, readme) of a run that ended well: a profile run's verdict and figures, or a bench rate.
    With image_url, the readme shows each step picture as a Markdown image too."""
    head = _heading(data)
    results = data.get("results") or {}
    if data.get("mode") == "profile":
        body = profile_text(results, out_dir, image_url) + ranks_profile_text(results, out_dir, image_url)
        verdict = (results.get("evidence") or {}).get("verdict") or {}
        said = verdict.get("stage") or (
            f"uncertain ({verdict['profiled_stage']} only in the profiled steps)"
            if verdict.get("profiled_stage")
            else "no verdict"
        )
        if verdict.get("stage") and verdict.get("share") is not None:
            said += f" holds the step ({verdict['share']:.0%})"
        return f"{head}: {said}", body
    body = bench_text(results, data.get("settings") or {}) + ranks_bench_text(results)
    return f"{head}: {_rate(results.get('samples_per_sec'))}", body


def ended(data: dict[str, Any]) -> tuple[str, str]:
    """(description, readme) of a run that failed or was stopped: one line saying so, and why."""
    head = _heading(data)
    if data.get("status") == "stopped":
        s = data.get("stopped") or {}
        kept = "the profiled cycles' results are kept" if (data.get("results") or {}).get("evidence") else "no results"
        line = (
            f"Stopped by {s.get('signal', 'a signal')} during {s.get('phase', 'the run')}, after "
            f"{s.get('steps_completed_in_phase', 0)} steps of that phase: {kept}."
        )
    else:
        line = f"Failed: {_one_line(data.get('error') or 'no error recorded')}. No results."
    return f"{head}: {data.get('status', 'ended')}", f"{line} See run.json for what was recorded.\n"


# --------------------------------------------------------------------------- mode=profile

# The figures the readme gives per cycle: (key in the cycle's evidence, label, format).
CYCLE_FIGURES = (
    ("profiled_step_ms", "profiled step", "{:.1f} ms"),
    ("gpu_idle_share", "GPU idle", "{:.0%} of the step"),
    ("input_gap_share", "input gap", "{:.0%} of the GPU's idle time"),
)


def bracket_text(evidence: dict[str, Any]) -> str:
    """The unprofiled steps before and after the capture, their drift and the distortion's 95% interval, in
    words ("" for a run timed before the capture alone)."""
    before, after = evidence.get("unprofiled_before_ms"), evidence.get("unprofiled_after_ms")
    if before is None or after is None:
        return ""
    said = (
        f"; unprofiled steps {before:.1f} ms before the capture and {after:.1f} ms after it "
        f"(after/before {evidence['unprofiled_drift']:.2f})"
    )
    if evidence.get("distortion_low") is not None:
        said += f"; 95% interval {evidence['distortion_low']:.2f}x to {evidence['distortion_high']:.2f}x"
    if evidence.get("distortion_uncertain"):
        said += f"; uncertain: {evidence['distortion_uncertain']}"
    return said


def profile_text(results: dict[str, Any], out_dir: str, image_url: ImageUrl | None = None) -> str:
    evidence = results.get("evidence") or {}
    verdict = (evidence.get("verdict") or {}).get("sentence")
    whose = " (rank 0's traces)" if results.get("across_ranks") is not None else ""
    lines = [f"**Verdict{whose}:** {verdict or 'n/a (run.json holds no verdict)'}", ""]
    ratio, se = evidence.get("profiler_distortion"), evidence.get("profiler_distortion_se")
    if ratio is None:
        slow = "n/a (no unprofiled or no profiled step time to compare)"
    else:
        slow = f"{ratio:.2f}x" + ("" if se is None else f" +/- {se:.2f} (one standard error)") + bracket_text(evidence)
    lines += [
        f"**Profiler slow-down:** profiled steps over unprofiled ones: {slow}. "
        "mode=bench measures a change without the profiler.",
        "",
    ]
    for c in results.get("cycles") or []:
        ev = c.get("evidence") or {}
        steps = c.get("profiler_steps") or []
        span = f", steps {steps[0]}-{steps[-1]}" if len(steps) == 2 else ""
        shown, reasons = figures(ev)
        lines += [f"### Cycle {c.get('cycle')}{span}", "", f"- {shown}"]
        lines += [f"- n/a: {reason}" for reason in reasons]
        if c.get("verdict"):
            lines.append(f"- verdict: {c['verdict']}")
        if c.get("picture"):
            rel = _rel(c["picture"], out_dir)
            lines.append(f"- step picture: `{rel}` (also on the dashboard as steps-cycle{c.get('cycle')})")
            lines += image_lines(rel, image_url)
        else:
            lines.append(f"- step picture: n/a ({c.get('picture_note') or 'none drawn'})")
        if c.get("trace"):
            lines.append(f"- trace: `{_rel(c['trace'], out_dir)}` (download it, open it in ui.perfetto.dev)")
        lines.append("")
    return "\n".join(lines)


def image_lines(rel: str, image_url: ImageUrl | None) -> list[str]:
    """The picture at rel (under outputs/) as a Markdown image, on the line under its path; its alt text is the
    path, shown where the image does not load. [] where the run's files are not served."""
    url = image_url(rel) if image_url else None
    return [f"  ![{rel}]({url})"] if url else []


def figures(evidence: dict[str, Any]) -> tuple[str, list[str]]:
    """The cycle's headline figures as text, a null one as "n/a"; and the reasons steplens summarize gave for them."""
    shown, reasons = [], []
    said = evidence.get("null_reasons") or {}
    for key, label, fmt in CYCLE_FIGURES:
        value = evidence.get(key)
        if value is not None:
            shown.append(f"{label} {fmt.format(value)}")
            continue
        shown.append(f"{label} n/a")
        # A figure's own reason first, then the reasons that null a group of figures (no GPU, hidden input waits).
        reason = next((said[k] for k in (key, "input_wait", "gpu") if said.get(k)), None)
        if reason and reason not in reasons:
            reasons.append(reason)
    return "; ".join(shown), reasons


def ranks_profile_text(results: dict[str, Any], out_dir: str, image_url: ImageUrl | None = None) -> str:
    """DDP: the evidence across ranks (the slowest rank, its stage), and each rank's own verdict."""
    top = results.get("across_ranks")
    if top is None:
        return ""
    if top.get("error"):
        return f"\n### Across ranks\n\nn/a ({top['error']})\n"
    if top.get("slowest_rank") is None:
        named = "slowest rank: none consistent across the aligned steps"
    else:
        stage = top.get("slow_stage") or "n/a (no scope of the slowest rank takes longer than on the others)"
        named = f"slowest rank: {top['slowest_rank']}; its stage: {stage}"
    lines = ["", "### Across ranks", "", f"- {named}", f"- {top.get('verdict')}"]
    for k, path in enumerate(top.get("pictures") or [], start=1):
        rel = _rel(path, out_dir)
        lines.append(f"- every rank's steps: `{rel}` (also on the dashboard as steps-ranks-cycle{k})")
        lines += image_lines(rel, image_url)
    lines.append("- the figures per rank and step: `traces/ranks.evidence.txt`")
    for rank, said in rank_verdicts(out_dir):
        lines.append(f"- rank {rank}'s own verdict: {said}")
    return "\n".join(lines) + "\n"


def rank_verdicts(out_dir: str) -> list[tuple[str, str]]:
    """(rank, verdict sentence) from the other ranks' records (outputs/ranks/rankR.json) found beside run.json."""
    folder = os.path.join(out_dir, "ranks")
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        sentence = (((record.get("results") or {}).get("evidence") or {}).get("verdict") or {}).get("sentence")
        if sentence:
            found.append((name[len("rank") : -len(".json")], sentence))
    return found


# --------------------------------------------------------------------------- mode=bench


def bench_text(results: dict[str, Any], settings: dict[str, Any]) -> str:
    rate = results.get("samples_per_sec")
    lines = [
        f"**Rate:** {_rate(rate)}",
        "",
        f"- window: {results.get('window_steps', 'n/a')} batches of {settings.get('batch_size', 'n/a')}, "
        f"{_num(results.get('window_seconds'), '{:.3f} s')}, between two synchronizations, no profiler",
    ]
    if results.get("window_note"):
        lines.append(f"- note: {results['window_note']}")
    c = results.get("ceiling") or {}
    if c.get("mfu") is not None:
        lines.append(
            f"- MFU: {c['mfu']:.1%} of the {c.get('peak_precision')} dense peak "
            f"({c.get('peak_tflops'):g} TFLOP/s); model {_num(c.get('model_tflops_per_sec'), '{:.1f}')} "
            "TFLOP/s per GPU"
        )
    elif c:
        lines.append(f"- MFU: n/a ({c.get('note') or 'no peak to compare with'})")
    if results.get("gpu_bound_share") is not None:
        lines.append(
            f"- GPU-bound share: {results['gpu_bound_share']:.1%} (the step's GPU time allows "
            f"{_rate(results.get('gpu_time_samples_per_sec'))})"
        )
    elif results.get("gpu_time"):
        lines.append(f"- GPU-bound share: n/a ({results['gpu_time'].get('note') or 'not measured'})")
    return "\n".join(lines) + "\n"


def ranks_bench_text(results: dict[str, Any]) -> str:
    """DDP: how the global rate was made, and each rank's own window."""
    every = results.get("ranks")
    if not every:
        return ""
    lines = [
        "",
        "### Across ranks",
        "",
        f"- {results.get('world_size')} ranks: the global rate is every rank's samples over the longest "
        f"window ({_num(results.get('global_window_seconds'), '{:.3f} s')}, rank "
        f"{results.get('longest_window_rank')})",
    ]
    for r in every:
        lines.append(
            f"- rank {r.get('rank')} ({r.get('host')}, {r.get('device')}): {_rate(r.get('samples_per_sec'))}, "
            f"window {_num(r.get('window_seconds'), '{:.3f} s')}"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- words


def _heading(data):
    s = data.get("settings") or {}
    device = (data.get("environment") or {}).get("gpu") or data.get("device") or "device unknown"
    world = (data.get("distributed") or {}).get("world_size") or 1
    return f"{data.get('mode', 'run')}, workers {s.get('workers', 'n/a')}, {device}" + (
        f", {world} ranks" if world > 1 else ""
    )


def _rate(value):
    return "n/a" if value is None else f"{value:.1f} samples/s"


def _num(value, fmt):
    return "n/a" if value is None else fmt.format(value)


def _rel(path, out_dir):
    """A file's path under the run's outputs folder (the record may have been moved since it was written)."""
    if not os.path.isabs(path):
        return path
    if os.path.commonpath([path, os.path.abspath(out_dir)]) == os.path.abspath(out_dir):
        return os.path.relpath(path, out_dir)
    marker = os.sep + "outputs" + os.sep
    return path.rsplit(marker, 1)[1] if marker in path else os.path.basename(path)


def _one_line(text):
    return " ".join(str(text).split())[:300]
