"""A picture of one profiled cycle: each step as the tutorial tells it, to scale.

    steplens picture TRACE [--out PICTURE.png]

For each step, two lanes: the CPU's four scopes, and the GPU's busy time and idle time (idle split into
the input gap, when the GPU waited while input/next_batch ran; the other waits for the host, when the work
that ended the idle was launched after it began; other idle, with work queued). Each lane starts at its
own zero: the CPU lane at the step's start, the GPU lane at the start of the span its figures are read on
(the CPU's step while the GPU keeps up; the step's own GPU slot when the CPU runs ahead). Every length
comes from steplens summarize's figures for that step. The title names the run (its workers, batch and the fixes
on: formatting.run_label, from run.json) and the cycle; the verdict is under it. Profile mode draws one per
cycle beside its trace; a CPU-only trace gets the CPU lanes alone; in a DDP run rank 0 also draws every
rank's steps in one picture per cycle (steplens ranks).
"""

import argparse
import os
import sys
import textwrap
from typing import Any

from steplens.atomic import run_record_near
from steplens.evidence import summarize
from steplens.evidence.formatting import damage_lines, run_label
from steplens.scopes import (
    EVAL_FORWARD,
    EVAL_NEXT_BATCH,
    EVAL_TO_DEVICE,
    FORWARD_BACKWARD,
    NEXT_BATCH,
    OPTIMIZER,
    SAVE,
    TO_DEVICE,
    scope_set,
)
from steplens.text import safe_text, say
from steplens.trace import reader

# One colour per legend entry, from the Okabe-Ito palette (told apart with the common colour-vision deficiencies),
# greys for the GPU's other idle time, and black for the memory line. The input gap is not input/next_batch's
# colour: one is the GPU's wait, the other the CPU's scope, and the legend must tell them apart.
COLOURS = {
    NEXT_BATCH: "#CC79A7",  # reddish purple
    "input": "#882255",  # wine (Paul Tol's palette): an input source that is not input/next_batch
    TO_DEVICE: "#E69F00",  # orange
    FORWARD_BACKWARD: "#0072B2",  # blue
    OPTIMIZER: "#F0E442",  # yellow
    EVAL_NEXT_BATCH: "#CC79A7",  # the validation phase's scopes: the training ones' colours, stage for stage
    EVAL_TO_DEVICE: "#E69F00",
    EVAL_FORWARD: "#0072B2",
    SAVE: "#56B4E9",  # sky blue
    "busy": "#009E73",  # bluish green
    "input gap": "#D55E00",  # vermillion
    "waiting for the host": "#8c8c8c",
    "other idle": "#d9d9d9",
    "memory": "#000000",
}
NO_MATPLOTLIB = "matplotlib is not installed: no step picture was drawn (pip install matplotlib)"


class NoPicture(Exception):
    pass


def lanes_of(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """Per step, the lanes to draw in milliseconds from each lane's own start, and their lengths.

    Returns [{"step", "cpu_ms", "gpu_ms", "cpu": [(scope, start, length)], "gpu": [(kind, start, length)],
    "memory": [(ms, allocated bytes)]}]; gpu_ms is None where the step has no GPU figures (a CPU-only trace, or
    an open GPU slot); memory is None where the trace has no GPU memory events (the memory lane's points are the
    allocator's running totals, from the CPU lane's zero, memory.lane)."""
    out = []
    for s in evidence["steps"]:
        lanes = s.get("lanes")
        if lanes is None:
            raise ValueError("the evidence carries no lanes: summarize it with lanes=True")
        cpu_ms = s["wall_us"] / 1e3
        gpu = lanes["gpu"] if s.get("pace_us") is not None and s.get("gpu_busy_us") is not None else None
        row = {"step": s["step"], "cpu_ms": cpu_ms, "gpu_ms": None, "cpu": [], "gpu": []}
        start = lanes["cpu_start"]  # the ProfilerStep slice's start: its first scope may start later
        row["cpu"] = [(name, (a - start) / 1e3, (b - a) / 1e3) for name, a, b in lanes["cpu"]]
        # the allocator's events are stamped on the host when the block is asked for: the CPU lane's zero
        points = lanes.get("memory")
        row["memory"] = [((ts - start) / 1e3, allocated) for ts, allocated in points] if points else None
        if gpu:
            g0 = gpu[0][1]
            row["gpu"] = [(kind, (a - g0) / 1e3, (b - a) / 1e3) for kind, a, b in gpu]
            row["gpu_ms"] = s["pace_us"] / 1e3
        out.append(row)
    return out


def draw(evidence: dict[str, Any], path: str, title: str) -> list[dict[str, Any]]:
    """Draw one trace's cycle to path (PNG, written atomically); returns lanes_of(evidence) as drawn.
    Raises NoPicture with the reason when matplotlib is missing."""
    rows = lanes_of(evidence)
    draw_groups(
        [("", rows)],
        path,
        title,
        evidence["verdict"]["sentence"],
        evidence["has_gpu"],
        evidence.get("idle_basis") == "gpu_timeline",
        (evidence.get("memory_lane") or {}).get("null_reason"),
    )
    return rows


def memory_scale(rows: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The memory lanes' common scale (lowest and highest allocated bytes drawn), or None when no row has a lane."""
    values = [v for r in rows for _, v in r.get("memory") or []]
    return (min(values), max(values)) if values else None


def _lane_note(ax: Any, y: float, note: str) -> None:
    """A lane's note in place of its bars, a few points right of the y axis so that it never touches it."""
    ax.annotate(note, (0, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8, color="#555555")


def _memory_lane(ax: Any, row: dict[str, Any], y: float, scale: tuple[int, int]) -> str:
    """One step's allocated memory as a step line in its lane (bottom: the scale's low, top: its high); its label."""
    points = row.get("memory")
    if not points:
        _lane_note(ax, y, "(no GPU memory events)")
        return "GPU mem  n/a"
    lo, hi = scale
    span = (hi - lo) or 1
    xs = [ms for ms, _ in points]
    ys = [y - 0.22 + 0.44 * (v - lo) / span for _, v in points]
    ax.broken_barh([(0, row["cpu_ms"])], (y - 0.22, 0.44), facecolors="#f4f4f4", linewidth=0)
    ax.step(xs, ys, where="post", color=COLOURS["memory"], linewidth=0.9)
    return f"GPU mem  peak {max(v for _, v in points) / 1e6:.0f} MB"


def draw_groups(
    groups: list[tuple[str, list[dict[str, Any]]]],
    path: str,
    title: str,
    said: str,
    has_gpu: bool,
    gpu_slots: bool,
    memory_note: str | None = None,
) -> None:
    """Lane pairs for each (label, rows) group, one group per rank in a DDP run, on one time scale; a third lane,
    the GPU's allocated memory, where the rows carry it; written to path (PNG, atomically).

    said: the sentence under the title (the verdict); gpu_slots: the GPU lanes are GPU slots (the CPU runs
    ahead), which the axis says; memory_note: why there is no memory lane, said in one line under the title.
    Raises NoPicture when matplotlib is missing."""
    fig = figure(groups, title, said, has_gpu, gpu_slots, memory_note)
    import matplotlib.pyplot as plt

    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".partial-{os.getpid()}-{os.path.basename(path)}")
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def figure(
    groups: list[tuple[str, list[dict[str, Any]]]],
    title: str,
    said: str,
    has_gpu: bool,
    gpu_slots: bool,
    memory_note: str | None = None,
) -> Any:
    """The matplotlib figure draw_groups saves (same arguments but the path); the caller closes it.

    Every label keeps clear of the axes' lines and of the others: the y limits hold every lane, its text
    included, and the figure's height is the lanes' plus room for the title's lines, the axis's and the legend's
    (constrained layout places them). Raises NoPicture when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise NoPicture(NO_MATPLOTLIB) from e
    rows = [(label, row) for label, group in groups for row in group]
    scale = memory_scale([row for _, row in rows])
    h = 2.6 if scale else 2.0  # a step's height: its CPU and GPU lanes, and its memory lane
    wrapped = "\n".join(textwrap.wrap(safe_text(said), 130))  # a name in it is drawn escaped, as printed
    if not scale:
        wrapped += "\n" + no_lane_line(memory_note, short=True)
    heading = f"{safe_text(title)}\n{wrapped}"
    xlabel = axis_label(gpu_slots, scale)
    handles = legend([r for _, r in rows], has_gpu, bool(scale), Patch)
    extra = 0.19 * (heading.count("\n") + 1) + 0.17 * (xlabel.count("\n") + 1) + 0.22 * -(-len(handles) // 4)
    fig, ax = plt.subplots(figsize=(11, 0.4 * h * len(rows) + extra + 0.7), layout="constrained")
    ticks, labels = _draw_lanes(ax, rows, h, scale, has_gpu)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(min(ticks) - 0.45, max(ticks) + 0.45)  # every lane inside the axes: no text on the axis line
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_xlim(0, max([r["cpu_ms"] for _, r in rows] + [r["gpu_ms"] or 0 for _, r in rows]) * 1.02)
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    ax.set_title(heading, fontsize=9, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def _draw_lanes(
    ax: Any, rows: list[tuple[str, dict[str, Any]]], h: float, scale: tuple[int, int] | None, has_gpu: bool
) -> tuple[list[float], list[str]]:
    """Each step's lanes, top to bottom; the lanes' heights and their labels."""
    ticks, labels = [], []
    for i, (label, row) in enumerate(rows):
        y_cpu = h * (len(rows) - 1 - i) + h - 1.0
        y_gpu = y_cpu - 0.55
        ax.broken_barh([(0, row["cpu_ms"])], (y_cpu - 0.22, 0.44), facecolors="white", edgecolors="#555555")
        for name, a, w in row["cpu"]:
            ax.broken_barh([(a, w)], (y_cpu - 0.22, 0.44), facecolors=COLOURS[name], linewidth=0, antialiased=False)
        ticks.append(y_cpu)
        labels.append(f"{label}step {row['step']} CPU  {row['cpu_ms']:.2f} ms")
        if row["gpu_ms"] is not None:
            for kind, a, w in row["gpu"]:
                ax.broken_barh([(a, w)], (y_gpu - 0.22, 0.44), facecolors=COLOURS[kind], linewidth=0, antialiased=False)
            labels.append(f"GPU  {row['gpu_ms']:.2f} ms")
        else:
            reason = "no GPU tracks" if not has_gpu else "no complete GPU slot"
            _lane_note(ax, y_gpu, f"({reason})")
            labels.append("GPU  n/a")
        ticks.append(y_gpu)
        if scale:
            labels.append(_memory_lane(ax, row, y_gpu - 0.55, scale))
            ticks.append(y_gpu - 0.55)
    return ticks, labels


def nearby_label(trace: str) -> str | None:
    """The run's label (formatting.run_label) from the run.json of a train.py run the trace lies in
    (outputs/traces/, or outputs/traces/rankR/ in DDP); None elsewhere."""
    found = run_record_near(trace)
    return run_label(found[1]["settings"]) if found else None


def legend(rows: list[dict[str, Any]], has_gpu: bool, memory: bool, patch: Any) -> list[Any]:
    """The legend's patches: the scopes drawn (or the input beside them), the GPU's kinds, the memory line."""
    drawn = {name for r in rows for name, _, _ in r["cpu"]}
    out = [
        patch(facecolor=COLOURS[k], label=k)
        for k in scope_set(drawn)  # the phase's scopes (steplens/scopes.py)
        if k in drawn or "input" not in drawn
    ]
    if "input" in drawn:
        out.insert(0, patch(facecolor=COLOURS["input"], label="input (DataLoader annotation or --input-scope)"))
    if has_gpu:
        out += [
            patch(facecolor=COLOURS[k], label=f"GPU {k}")
            for k in ("busy", "input gap", "waiting for the host", "other idle")
        ]
    if memory:
        out.append(patch(facecolor=COLOURS["memory"], label="GPU allocated memory"))
    return out


def axis_label(gpu_slots: bool, scale: tuple[int, int] | None) -> str:
    """The x axis's words: each lane's zero, and the memory lanes' common scale."""
    label = "milliseconds from the start of each lane, to scale; " + (
        "the GPU lane is the step's own GPU slot (the CPU runs ahead of the GPU)"
        if gpu_slots
        else "both lanes start with the CPU's step"
    )
    if scale:
        label += (
            f"\nGPU memory lanes: allocated MB from {scale[0] / 1e6:.0f} (bottom) to {scale[1] / 1e6:.0f} (top), "
            "on the CPU lane's time (the allocator's events are stamped when the host asks for a block)"
        )
    return label


def no_lane_line(reason: str | None, short: bool = False) -> str:
    """The one line said where no memory lane is drawn; short: the reason's first clause (the picture's line)."""
    reason = reason or "no GPU memory events in these steps"
    return f"no memory lane: {reason.split(':')[0] if short else reason}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens picture", description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a PyTorch profiler Chrome trace (.json or .json.gz)")
    p.add_argument("--out", help="the PNG to write (default: beside the trace, .steps.png)")
    summarize.add_reading_options(p)
    args = p.parse_args(argv)
    if os.path.isdir(args.trace):
        say(f"steplens picture: error: {args.trace} is a folder: give one trace file in it", sys.stderr)
        return 2
    out = args.out or args.trace.rsplit(".pt.trace.", 1)[0].rsplit(".json", 1)[0] + ".steps.png"
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):  # before reading the trace: a bad place costs a line, not the reading
        say(f"steplens picture: error: {folder} is not a folder: create it, or pass --out elsewhere", sys.stderr)
        return 2
    try:
        evidence = summarize.summarize_file(
            args.trace, lanes=True, input_scope=args.input_scope, step_scope=args.step_scope
        )
        for line in damage_lines(evidence):
            say(f"steplens picture: warning: {line}", sys.stderr)
        label = nearby_label(args.trace)
        draw(evidence, out, f"{label}: {os.path.basename(args.trace)}" if label else os.path.basename(args.trace))
        if evidence["memory_lane"]["device"] is None:
            say(f"steplens picture: {no_lane_line(evidence['memory_lane']['null_reason'])}", sys.stderr)
    except (reader.TraceError, NoPicture) as e:
        say(f"steplens picture: error: {e}", sys.stderr)
        return 1
    say(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
