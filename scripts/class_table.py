"""Which kernel class a change shrank: GPU time by kernel class of several traces, side by side, as Markdown.

    python scripts/class_table.py TRACE [TRACE...] [--out FILE.md] [--png FILE.png]
    python scripts/class_table.py TRACE [TRACE...] --roofline [--model train:build_model] [--roofline-png FILE.png]

Each TRACE is a PyTorch profiler trace (.pt.trace.json[.gz]); the first is the reference.
Per class (steplens/trace/kernels.py)
and trace: the GPU time a step launches, in ms, and per training sample, in µs, where the batch size is known
(from the run.json of the run that wrote the trace, in TRACE's folder's parent, which also names its machine;
else per step only). A batch of 1024 does 8x the work of one of 128, so per-sample time is what tells whether
a class got cheaper: each later trace's cell gives its class's per-sample time over the reference's (per-step
time where a batch size is unknown). The classes of each trace must sum to the GPU work its steps launched
(steplens summarize's gpu_work_us, overlaps counted once); a trace where they do not stops the table (exit 1), as
does a trace without GPU events. --png draws the same figures as one stacked bar a trace (per sample where
every trace's batch size is known, else per step), each class a colour. --roofline adds each class's
share of its compute or memory limit per trace (steplens roofline; --model gives the work of CUDA-graph
steps from the model's layers); --roofline-png draws those shares, one bar a trace in each class.
"""

import argparse
import io
import json
import os
import sys

from steplens.atomic import write_atomic
from steplens.evidence import attribution, roofline, summarize
from steplens.evidence.formatting import damage_lines
from steplens.trace import kernels, reader

HERE = os.path.dirname(os.path.abspath(__file__))

LABEL_KEYS = (
    "batch_size",
    "compile",
    "amp",
    "cuda_graph",
    "channels_last",
    "fused_sgd",
    "cudnn_benchmark",
    "workers",
    "gpu_input",
    "data",
    "scale_lr",
    "lr_warmup_steps",
    "profile_detail",
)


ABSENT = {"lr_warmup_steps": 0}  # runs recorded before the flag existed ran without a ramp


def value(settings, key):
    return settings.get(key, ABSENT.get(key))


class TableError(Exception):
    pass


def run_of(trace):
    """The run.json of the run that wrote trace (outputs/traces/X -> outputs/run.json), or {}."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(trace))), "run.json")
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError):
        return {}
    return run if isinstance(run, dict) else {}


def checked(trace, with_roofline=False, model=None):
    """A trace's evidence (with its roofline, from the same read); a trace damaged where its GPU events are read
    is refused, other damage is said."""
    evidence = summarize.summarize_file(trace, with_roofline=with_roofline, model=model)
    if evidence["damage_withheld"]:
        raise TableError(f"{trace}: damaged where the classes are read: {evidence['damage_withheld']}")
    for line in damage_lines(evidence):
        print(f"class_table.py: warning: {trace}: {line}", file=sys.stderr)
    return evidence


def classes_of(trace, evidence, run):
    """{"label", "batch", "steps", "ms": {class: ms per step}, "total_ms"} of one summarized trace."""
    settings, env = run.get("settings"), run.get("environment")
    settings, env = (settings if isinstance(settings, dict) else {}), (env if isinstance(env, dict) else {})
    batch = settings.get("batch_size")
    batch = batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None
    window = evidence["window"]
    kc, steps = window.get("kernel_classes"), window.get("steps")
    if not evidence.get("has_gpu") or not kc or not kc.get("busy_us") or not steps:
        raise TableError(f"{trace}: no GPU kernels in its steps (a CPU-only trace has no kernel classes)")
    got = sum(c["us"] for c in kc["classes"].values())
    if abs(got - window["gpu_work_us"]) > attribution.EPS_US * max(1, len(kc["classes"])):
        raise TableError(
            f"{trace}: the classes sum to {got:.1f} us but its steps launched "
            f"{window['gpu_work_us']:.1f} us of GPU work"
        )
    shown = [f"{k}={settings[k]}" for k in LABEL_KEYS if settings.get(k) not in (None, False, "off", ABSENT.get(k))]
    machine = [env["gpu"]] if env.get("gpu") else []
    machine += [
        f"{name} {str(env[k]).removeprefix('GPU-')[:8]}"
        for k, name in (("boot_id", "boot"), ("gpu_uuid", "GPU"))
        if env.get(k)
    ]
    label = ", ".join(shown) or os.path.basename(trace)
    if batch is None:
        label += " (no batch size: no run.json with one beside the trace)"
    return {
        "label": label + (f" on {', '.join(machine)}" if machine else ""),
        "batch": batch,
        "settings": settings,
        "machine": ", ".join(machine[1:]),
        "steps": steps,
        "ms": {c: v["us"] / steps / 1e3 for c, v in kc["classes"].items()},
        "total_ms": got / steps / 1e3,
    }


def markdown(rows, traces):
    ref = rows[0]

    def cell(r, ms, ref_ms):
        if ms is None:
            return "-"
        text = f"{ms:.3f}" + ("" if not r["batch"] else f"; {ms / r['batch'] * 1e3:.2f}")
        if r is not ref and ref_ms:
            per = (r["batch"], ref["batch"]) if r["batch"] and ref["batch"] else (1, 1)
            text += f" ({ms / per[0] / (ref_ms / per[1]):.2f}x)"
        return text

    header = ["class"] + [f"{i}: ms per step; µs per sample" for i in range(1, len(rows) + 1)]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    present = [c for c in kernels.CLASSES if any(c in r["ms"] for r in rows)]
    for c in present:
        out.append("| " + " | ".join([c] + [cell(r, r["ms"].get(c), ref["ms"].get(c)) for r in rows]) + " |")
    out.append(
        "| "
        + " | ".join(["**total (GPU work a step launched)**"] + [cell(r, r["total_ms"], ref["total_ms"]) for r in rows])
        + " |"
    )
    legend = []
    for i, (r, t) in enumerate(zip(rows, traces), 1):
        vs = ""
        if i > 1 and r["batch"] and ref["batch"]:
            vs = f"; total per sample {r['total_ms'] / r['batch'] / (ref['total_ms'] / ref['batch']):.3f}x trace 1's"
        legend.append(f"{i}. {r['label']} ({r['steps']} steps{vs}): `{t}`")
    return (
        "\n".join(
            [
                "GPU time by kernel class (steplens/trace/kernels.py), per step and per training sample; "
                "(Nx): per sample "
                "(per step where a batch size is unknown) over trace 1's:",
                "",
                *out,
                "",
                *legend,
            ]
        )
        + "\n"
    )


# One colour per class, in kernels.CLASSES' order (the convolutions in blues, the small kernels in warm colours).
COLOURS = [
    "#08519c",
    "#3182bd",
    "#6baed6",
    "#9ecae1",
    "#e6550d",
    "#fd8d3c",
    "#fdd0a2",
    "#31a354",
    "#969696",
    "#756bb1",
    "#d9d9d9",
]


def picture(rows, path):
    """One horizontal stacked bar a trace: its classes' GPU time per sample (per step if a batch is unknown).
    Written through write_atomic (a temp file and a rename)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_sample = all(r["batch"] for r in rows)
    scale = [1e3 / r["batch"] if per_sample else 1.0 for r in rows]
    unit = "µs per training sample" if per_sample else "ms per step"
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.55 * len(rows)))
    names = bar_names(rows)
    y = list(range(len(rows)))[::-1]
    for cls, colour in zip(kernels.CLASSES, COLOURS):
        if not any(cls in r["ms"] for r in rows):
            continue
        left = [
            sum(r["ms"].get(c, 0.0) for c in kernels.CLASSES[: kernels.CLASSES.index(cls)]) * k
            for r, k in zip(rows, scale)
        ]
        ax.barh(
            y,
            [r["ms"].get(cls, 0.0) * k for r, k in zip(rows, scale)],
            left=left,
            color=colour,
            label=kernels.SHORT.get(cls, cls),
            height=0.6,
        )
    for yi, r, k in zip(y, rows, scale):
        ax.text(r["total_ms"] * k, yi, f" {r['total_ms'] * k:.2f}", va="center", fontsize=8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"GPU time by kernel class, {unit}")
    ax.set_xlim(0, max(r["total_ms"] * k for r, k in zip(rows, scale)) * 1.12)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6 / len(rows)), ncol=6, fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    save(fig, path)


def save(fig, path):
    """The figure as a PNG, through write_atomic (a temp file and a rename); the figure is closed."""
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    try:
        fig.savefig(png, dpi=110, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    write_atomic(path, png.getvalue())


def roofline_markdown(rooflines):
    """Each class's share of the limit that binds, per trace: 'share of limit (limit); ms above the floor'."""

    def cell(r, cls):
        c = (r["classes"] or {}).get(cls)
        if not c:
            return "-"
        if c["of_limit"] is None:
            return f"n/a ({c['null_reason']})" if c["null_reason"] != roofline.NO_CLASS_WORK else "-"
        return f"{c['of_limit']:.1%} ({c['limit']}); {c['above_floor_us'] / 1e3:.3f}"

    present = [c for c in kernels.CLASSES if any((r["classes"] or {}).get(c) for r in rooflines)]
    header = ["class"] + [f"{i}: of limit; ms above floor" for i in range(1, len(rooflines) + 1)]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join([c] + [cell(r, c) for r in rooflines]) + " |" for c in present]
    floors = [
        f"{r['total']['floor_us'] / 1e3:.3f} of {r['total']['us'] / 1e3:.3f}" if r["total"] else "-" for r in rooflines
    ]
    out.append("| " + " | ".join(["**floor of the counted classes, of all GPU work (ms)**"] + floors) + " |")
    sources = "; ".join(f"{i}: {r['source'] or r['null_reason']}" for i, r in enumerate(rooflines, 1))
    return (
        "\n".join(
            [
                "",
                "Roofline by kernel class (steplens roofline): the share of the limit that binds (the time the "
                "class's work takes at the GPU's peak over the time it took), the limit, and the ms per step above "
                "that floor. "
                f"Work from: {sources}. {roofline.BYTES_NOTE}.",
                "",
                *out,
            ]
        )
        + "\n"
    )


def roofline_picture(rows, rooflines, path):
    """One group of bars a class: each trace's share of the limit that binds, with its ms per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [
        c for c in kernels.CLASSES if any(((r["classes"] or {}).get(c) or {}).get("of_limit") for r in rooflines)
    ]
    names = bar_names(rows)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.28 * len(present) * len(rooflines)))
    y, ticks = 0.0, []
    for cls in present:
        top = y
        for i, r in enumerate(rooflines):
            c = (r["classes"] or {}).get(cls) or {}
            share = c.get("of_limit") or 0.0
            ax.barh(y, share, color=f"C{i}", height=0.8, label=names[i] if cls == present[0] else None)
            if c.get("of_limit") is not None:
                ax.text(share, y, f" {share:.0%} of {c['limit']}, {c['us'] / 1e3:.3f} ms", va="center", fontsize=7)
            y -= 1
        ticks.append(((top + y + 1) / 2, kernels.SHORT[cls]))
        y -= 0.7
    ax.set_yticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=8)
    ax.set_xlim(0, 1.3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("share of the limit that binds: the time the class's work takes at the peak / the time it took")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9 / len(present)), ncol=2, fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    save(fig, path)


def bar_names(rows):
    """One short name a bar: the settings that differ between the traces (a setting older runs lack reads as
    its default), and the machine where the traces come from more than one."""
    differ = [k for k in LABEL_KEYS if len({json.dumps(value(r["settings"], k)) for r in rows}) > 1]
    machines = len({r["machine"] for r in rows}) > 1
    return [
        f"{i}. "
        + (", ".join(f"{k}={value(r['settings'], k)}" for k in differ) or r["label"])[:100]
        + (f" ({r['machine']})" if machines and r["machine"] else "")
        for i, r in enumerate(rows, 1)
    ]


def main(argv=None):
    p = argparse.ArgumentParser(prog="class_table.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", metavar="TRACE", help="profiler traces; the first is the reference")
    p.add_argument("--out", default=None, help="also write the table to this Markdown file")
    p.add_argument("--png", default=None, help="also draw the classes as stacked bars into this PNG")
    p.add_argument("--roofline", action="store_true", help="also each class's share of its limit (steplens roofline)")
    p.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FUNCTION",
        help="with --roofline: the model builder for CUDA-graph steps (the companion's: train:build_model)",
    )
    p.add_argument("--roofline-png", default=None, help="with --roofline: draw the shares into this PNG")
    args = p.parse_args(argv)
    if (args.model or args.roofline_png) and not args.roofline:
        print("class_table.py: error: --model and --roofline-png go with --roofline", file=sys.stderr)
        return 2
    for t in args.traces:
        if not os.path.isfile(t):
            why = "is a folder: give the trace files in it" if os.path.isdir(t) else "no such trace"
            print(f"class_table.py: error: {t}: {why}", file=sys.stderr)
            return 2
    for path in (args.out, args.png, args.roofline_png):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            print(f"class_table.py: error: {path}: its folder does not exist", file=sys.stderr)
            return 2
    try:
        builder = roofline.load_builder(args.model) if args.model else None
    except ValueError as e:
        print(f"class_table.py: error: {e}", file=sys.stderr)
        return 2
    try:
        model = (lambda t: roofline.model_for(t, builder, None, None)) if builder else (lambda t: None)
        evidences = [checked(t, args.roofline, model(t)) for t in args.traces]
        rows = [classes_of(t, ev, run_of(t)) for t, ev in zip(args.traces, evidences)]
        rooflines = [ev["roofline"] for ev in evidences] if args.roofline else []
    except (TableError, reader.TraceError, ValueError) as e:
        print(f"class_table.py: error: {e}", file=sys.stderr)
        return 1
    text = markdown(rows, args.traces) + (roofline_markdown(rooflines) if rooflines else "")
    if args.out:
        write_atomic(args.out, text)
    if args.png:
        picture(rows, args.png)
    if args.roofline_png:
        roofline_picture(rows, rooflines, args.roofline_png)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
