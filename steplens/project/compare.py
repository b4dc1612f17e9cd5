"""steplens compare: paired comparison of repeated bench runs, as Markdown, CSV, JSON and a picture.

    steplens compare --offline .polyaxon-offline --out results/local --baseline workers=4
    steplens compare -p YOUR_PROJECT [-q 'tags:study1'] --out comparison --baseline workers=4
    steplens compare -p YOUR_PROJECT --limit 200 --out comparison     # the newest 200 runs only
    steplens compare --offline ROOT --out DIR --model train:build_model   # CUDA-graph profile traces' roofline too

Every run the query matches is read, page by page, and a line says how many (docs/COMPARE.md#many-runs).
Each group's profile trace also gives its roofline by kernel class: docs/COMPARE.md, the roofline of each
group's profile trace.
The design, the groups and the statistics: docs/COMPARE.md."""

import argparse
import csv
import io
import json
import math
import os
import sys
import textwrap
from typing import Any

from steplens.atomic import write_atomic
from steplens.evidence.formatting import damage_lines
from steplens.evidence.roofline import NO_CLASS_WORK, load_builder
from steplens.project.comparison import (
    HOST_FIGURES,
    LOSS_FLOOR,
    LOSS_TOLERANCE,
    LOSS_WORSE,
    NO_FLOPS,
    add_rooflines,
    compare_records,
)
from steplens.project.runs import DOWNLOADS, PAGE_SIZE, CompareError, gather_offline, gather_polyaxon, read_line
from steplens.trace.kernels import CLASSES


def fmt_loss(loss: dict[str, Any] | None) -> str:
    """The final-loss cell: '-' for runs without a loss, the median, and the mark when it is worse."""
    if loss is None:
        return "-"
    shown = "diverged" if loss["final"] is None else f"{loss['final']:.3f}"
    return f"{shown} ({LOSS_WORSE})" if loss["worse_than_baseline"] else shown


def fmt_memory(memory: dict[str, Any] | None) -> str:
    """The peak-memory cell: the median window peaks of GPU memory, allocated / reserved; '-' where a run has none."""
    if memory is None:
        return "-"
    return f"{memory['median_allocated_mb']:.0f} / {memory['median_reserved_mb']:.0f}"


def fmt_opt(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else fmt.format(v)


def fmt_rate(v: float) -> str:
    return f"{v / 1000:.2f}k" if v >= 1000 else f"{v:.1f}"


def fmt_share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def kernel_class_lines(groups: list[dict[str, Any]]) -> str:
    """What the GPU does in the GPU-bound groups (a --cuda-graph bench, or a profile verdict of GPU compute):
    the three largest kernel classes and their shares of the GPU work, from the matching profile run."""
    bound = [g for g in groups if g.get("gpu_bound") or g["evidence"].get("verdict_stage") == "GPU compute"]
    if not bound:
        return ""
    lines = [
        f"- {g['group']}: {g['evidence'].get('gpu_top_classes') or 'n/a (the profile run predates kernel classes)'}"
        for g in bound
    ]
    return (
        "\nGPU time by kernel class in the GPU-bound groups (largest three, share of the GPU work a step "
        "launches; steplens/trace/kernels.py):\n\n" + "\n".join(lines) + "\n"
    )


def roofline_cell(c: dict[str, Any] | None) -> str:
    """One class of one group: the achieved rate against the peak that binds it, and the share of that limit
    (roofline.limit_row's figures); '-' where no work was counted, else n/a with the reason."""
    if c is None or c["null_reason"] == NO_CLASS_WORK:
        return "-"
    if c["of_limit"] is None:
        return f"n/a ({c['null_reason']})"
    if c["limit"] == "compute":
        v = c["achieved_tflops"]
        rate = f"{v:,.1f}" if v >= 10 else f"{v:.3g}"
        rate += f" of {c['peak_tflops']:g} TFLOP/s {c['precision']}"
    else:
        v = c["achieved_gbps"]
        rate = (f"{v:,.0f}" if v >= 100 else f"{v:.3g}") + f" of {c['peak_gbps']:,.0f} GB/s"
    share = c["of_limit"]
    return f"{rate} ({share:.1%})" if share >= 0.001 else f"{rate} ({share * 100:.2g}%)"


def roofline_lines(groups: list[dict[str, Any]]) -> str:
    """The roofline by kernel class of each group's profile trace: a row a class, a column a group with one;
    then, per group, its trace and where its work came from, or why it has none; the notes once."""
    found = [(g, g["evidence"]["roofline"]) for g in groups if g["evidence"].get("roofline")]
    if not found:
        return ""
    shown = [(g, r) for g, r in found if r["classes"] is not None and not r["null_reason"]]
    out = [
        "\nRoofline by kernel class (the profile run's trace, as steplens roofline reads it; per step, each class's "
        "achieved rate against the peak that binds it, and the share of that limit):\n"
    ]
    if shown:
        classes = [c for c in CLASSES if any(r["classes"].get(c) for _, r in shown)]
        out.append("| class | " + " | ".join(g["group"] for g, _ in shown) + " |")
        out.append("|---" * (len(shown) + 1) + "|")
        out += [f"| {c} | " + " | ".join(roofline_cell(r["classes"].get(c)) for _, r in shown) + " |" for c in classes]
        out.append("")
    for g, r in found:
        if r["classes"] is None or r["null_reason"]:
            out.append(f"- {g['group']}: {r['null_reason']}")
        else:
            t, source = r["total"], "the trace's operators" if r["source"] == "operators" else "the model's layers"
            out.append(
                f"- {g['group']}: {r['trace']}: work from {source}, mean per step of {r['steps']} steps; the counted "
                f"classes' floor is {t['floor_us'] / 1e3:.3f} ms of the step's {t['us'] / 1e3:.3f} ms of GPU work"
            )
        out += [f"  - {line}" for line in damage_lines(r)]
        for reason, n in sorted(r["not_counted"].items(), key=lambda kv: -kv[1]["us"]):
            out.append(f"  - not counted: {n['us'] / 1e3:.3f} ms per step, {n['kernels']:.0f} kernels: {reason}")
    notes = dict.fromkeys(n for _, r in shown for n in r["notes"])  # each note once, in order
    return "\n".join(out + ([""] + [f"Note: {n}." for n in notes] if notes else [])) + "\n"


def _rates_section(out, table):
    """The rates, the ratios to the baseline and the paired sign test; each pair's ratio."""
    out.write(
        "| group | n | median samples/s | peak GPU MB allocated / reserved | final loss | min | max | spread "
        "| ratio of medians | min/max bounds | pairs | paired ratio: median (range) | sign test p | verdict |\n"
        + "|---" * 14
        + "|\n"
    )
    for g in table["groups"]:
        cells = ["baseline", "", "", "", ""]
        if "ratio" in g:
            paired = g["paired"]
            cells = [
                f"{g['ratio']:.2f}",
                f"{g['ratio_bounds'][0]:.2f}-{g['ratio_bounds'][1]:.2f}",
                str(paired["n"]),
                (f"{paired['median']:.3f} ({paired['min']:.3f}-{paired['max']:.3f})" if paired["n"] else ""),
                fmt_p(g["sign_test"]["p"]),
            ]
        shown = "" if g["verdict"] == "baseline" else g["verdict"]
        out.write(
            f"| {g['group']} | {g['n']} | {fmt_rate(g['median'])} | {fmt_memory(g.get('memory'))} "
            f"| {fmt_loss(g['loss'])} | {fmt_rate(g['min'])} "
            f"| {fmt_rate(g['max'])} "
            f"| {g['spread']:.2f} | {' | '.join(cells)} | {shown} |\n"
        )
    compared = [g for g in table["groups"] if "ratio" in g and g["pairs"]]
    if compared:
        out.write("\nPairs (each run over the baseline run beside it in the alternating order):\n\n")
        for g in compared:
            ratios = " ".join(f"{p['ratio']:.3f}" for p in g["pairs"])
            out.write(f"- {g['group']} (by {g['pairing']}): {ratios}\n")


def fmt_cell(v: float | None, fmt: str) -> str:
    """A host-side cell: empty where the figure was not logged (never 0)."""
    return "" if v is None else fmt.format(v)


def _host_section(out, table):
    """Beside each group's rate, the bench window's host side: CPUs used against the budget, the throttled share,
    the workers' supply and the host memory peaks; empty cells where the runs did not log a figure."""
    rows = table["groups"]
    if not any(v is not None for g in rows for k, v in (g.get("host") or {}).items() if k != "batch_size"):
        return
    budget = table["machine"].get("cpu_budget")
    out.write(
        "\nThe host side of the bench window (medians): CPUs used "
        f"(the budget: {'not recorded' if budget is None else f'{budget:g} CPUs'}), the share of the window the "
        "cgroup throttled, the batches per second the DataLoader workers could supply beside the steps per second "
        "the group ran, and host memory (PSS of the main process and workers together, and /dev/shm: the larger "
        "of the reads before and after the window). An empty cell: the runs did not log it.\n\n"
        "| group | median samples/s | steps/s | CPUs used | throttled share | workers' supply batches/s "
        "| host PSS peak MB | /dev/shm peak MB |\n|---|---|---|---|---|---|---|---|\n"
    )
    for g in rows:
        h = g.get("host") or {}
        steps = g["median"] / h["batch_size"] if h.get("batch_size") else None
        out.write(
            f"| {g['group']} | {fmt_rate(g['median'])} | {fmt_cell(steps, '{:.1f}')} "
            f"| {fmt_cell(h.get('cpus_used'), '{:.2f}')} | {fmt_cell(h.get('cpu_throttled_share'), '{:.2f}')} "
            f"| {fmt_cell(h.get('input_supply_per_sec'), '{:.1f}')} | {fmt_cell(h.get('pss_peak_mb'), '{:.0f}')} "
            f"| {fmt_cell(h.get('shm_peak_mb'), '{:.1f}')} |\n"
        )


def _flops_section(out, table):
    """Model FLOPs, TFLOP/s and MFU per group, or why they are absent."""
    with_flops = [g for g in table["groups"] if g["ceiling"]]
    without = [g["group"] for g in table["groups"] if not g["ceiling"]]
    out.write(
        "\nModel FLOPs (train.py's count, forward and backward convolutions and matmuls) and MFU "
        "(achieved over the GPU's dense peak for the precision used):\n\n"
    )
    if with_flops:
        out.write(
            "| group | GFLOP per sample | median TFLOP/s | median MFU | peak TFLOP/s (precision) |\n"
            "|---|---|---|---|---|\n"
        )
        for g in with_flops:
            c = g["ceiling"]
            mfu = f"{c['median_mfu']:.3f}" if c["median_mfu"] is not None else f"n/a ({c['mfu_note']})"
            peaks = ", ".join(f"{p:g} ({q})" if p is not None else "n/a" for p, q in c["peaks"])
            per_sample = "n/a" if c["flops_per_sample"] is None else f"{c['flops_per_sample'] / 1e9:.3f}"
            out.write(f"| {g['group']} | {per_sample} | {c['median_tflops']:.2f} | {mfu} | {peaks} |\n")
    if without and not with_flops:
        out.write(f"TFLOP/s and MFU absent for every group: {NO_FLOPS}.\n")
    elif without:
        out.write(f"\nTFLOP/s and MFU absent for {'; '.join(without)}: {NO_FLOPS}.\n")


def _gpu_bound_section(out, table):
    """The GPU-bound share of --cuda-graph groups."""
    bound = [g for g in table["groups"] if g["gpu_bound"]]
    if bound:
        out.write(
            "\nGPU-bound share (--cuda-graph runs): the window's rate over the rate the step's own GPU time "
            "allows (back-to-back graph replays, CUDA events). Near 1 the step is GPU-bound; it does not say "
            "how close the GPU runs to its arithmetic peak (that is MFU):\n\n"
        )
        out.write(
            "| group | GPU ms per step | samples/s the GPU time allows | median GPU-bound share | lowest |\n"
            "|---|---|---|---|---|\n"
        )
        for g in bound:
            b = g["gpu_bound"]
            out.write(
                f"| {g['group']} | {b['median_gpu_ms_per_step']:.3f} | "
                f"{fmt_rate(b['median_gpu_time_samples_per_sec'])} | {b['median_share']:.3f} | "
                f"{b['min_share']:.3f} |\n"
            )


def _distributed_section(out, table):
    """The global rate and the per-rank spread of DDP groups."""
    distributed = [g for g in table["groups"] if g.get("rank_spread")]
    if distributed:
        out.write("\nDistributed runs (samples/s is the global rate, set by the longest rank window):\n\n")
        out.write(
            "| group | world size | median global samples/s | per-rank spread (median) "
            "| per-rank spread (max) |\n|---|---|---|---|---|\n"
        )
        for g in distributed:
            sp = g["rank_spread"]
            out.write(
                f"| {g['group']} | {sp['world_size']} | {fmt_rate(g['median'])} | {sp['median']:.1%} | "
                f"{sp['max']:.1%} |\n"
            )


def _evidence_section(out, table, links_from):
    """The trace evidence of profile runs of the same settings, their verdicts and pictures."""
    evidence = [g for g in table["groups"] if g["evidence"]]
    if evidence:
        out.write(
            "\nTrace evidence (profile runs of the same settings; profiler distortion = profiled step over "
            "unprofiled steps timed before and after the capture in the same run, +/- one standard error; below 1 "
            "only when queued batches served the profiled steps or the host's pace changed):\n\n"
        )
        out.write(
            "| group | capture | GPU idle share | input gap share of idle | profiled step ms "
            "| unprofiled step ms | profiler distortion | median samples/s |\n|---|---|---|---|---|---|---|---|\n"
        )
        for g in evidence:
            e = g["evidence"]
            se, digits = e.get("profiler_distortion_se"), 2
            if se is not None and se < 0.005:
                digits = 3  # graph replays: a steady pace, an error below what two decimals show
            se = "" if se is None else f" +/- {se:.{digits}f}"
            out.write(
                f"| {g['group']} | {e['profile_detail']} | {fmt_share(e['gpu_idle_share'])} | "
                f"{fmt_share(e['input_gap_share'])} | {e['profiled_step_ms']:.1f} | "
                f"{fmt_opt(e.get('unprofiled_step_ms'), '{:.1f}')} | "
                f"{fmt_opt(e.get('profiler_distortion'), '{:.' + str(digits) + 'f}x')}{se} | "
                f"{fmt_rate(g['median'])} |\n"
            )
        without = [g["group"] for g in table["groups"] if not g["evidence"]]
        if without:
            out.write(f"\nNo profile run of the same settings on this machine: {'; '.join(without)}.\n")
        for g in evidence:
            e = g["evidence"]
            if e.get("verdict") or e.get("pictures"):
                shown = ", ".join(
                    f"[{os.path.basename(p)}]({os.path.relpath(p, links_from or os.curdir)})" for p in e["pictures"]
                )
                out.write(
                    f"\n- {g['group']}: {e.get('verdict') or 'no verdict recorded'}"
                    + (f" Step pictures: {shown}" if shown else "")
                    + "\n"
                )
        out.write(kernel_class_lines(evidence))
        out.write(roofline_lines(evidence))
        first, last = table["groups"][0], max(table["groups"], key=lambda g: g["median"])
        if first["evidence"] and last["evidence"] and first is not last:
            a, b = first["evidence"], last["evidence"]
            out.write(
                f"\n{first['group']} -> {last['group']}: input gap share {fmt_share(a['input_gap_share'])} -> "
                f"{fmt_share(b['input_gap_share'])}; GPU idle share {fmt_share(a['gpu_idle_share'])} -> "
                f"{fmt_share(b['gpu_idle_share'])}; {fmt_rate(first['median'])} -> {fmt_rate(last['median'])} "
                "samples/s (medians)\n"
            )


def markdown_table(table: dict[str, Any], links_from: str | None = None) -> str:
    """One machine's comparison as Markdown: rates, the sign test, the host side, FLOPs, GPU-bound share, ranks."""
    out = io.StringIO()
    _rates_section(out, table)
    _host_section(out, table)
    _flops_section(out, table)
    _gpu_bound_section(out, table)
    _distributed_section(out, table)
    _evidence_section(out, table, links_from)
    return out.getvalue()


def _pooled_section(out, pooled):
    """The pairs of several machines in one sign test (comparison.pooled_pairs)."""
    if not pooled:
        return
    out.write(
        "\nPairs pooled across machines (each pair within one machine; the rates are not pooled):\n\n"
        "| group | baseline | pairs per machine | paired ratio: median (range) | sign test p | verdict |\n"
        + "|---" * 6
        + "|\n"
    )
    for p in pooled:
        per = ", ".join(str(m["pairs"]) for m in p["machines"])
        paired = p["paired"]
        out.write(
            f"| {p['group']} | {p['baseline']} | {per} (n={paired['n']}) "
            f"| {paired['median']:.3f} ({paired['min']:.3f}-{paired['max']:.3f}) | {fmt_p(p['sign_test']['p'])} "
            f"| {p['verdict']} |\n"
        )


def markdown(result: dict[str, Any], links_from: str | None = None) -> str:
    """The tables as Markdown; links_from: the folder the file will lie in, which links are relative to
    (default: the current folder)."""
    out = io.StringIO()
    if result.get("read"):
        out.write(f"Runs: {read_line(result['read'])}.\n\n")
    for i, table in enumerate(result["tables"]):
        out.write(f"{'' if i == 0 else chr(10)}Machine: {table['machine_label']}\n\n")
        out.write(markdown_table(table, links_from))
    _pooled_section(out, result.get("pooled") or [])
    for w in result["warnings"]:
        out.write(f"\nWARNING: {w}\n")
    if result["left_out"]:
        out.write(
            "\nLeft out of the rates: " + "; ".join(f"{r['uuid'][:8]} ({r['why']})" for r in result["left_out"]) + "\n"
        )
    need = result["pairs_needed"]
    out.write(
        f"\nMethod: whole-job repeats in alternating order; each run is paired with the baseline run beside it "
        f"(same repeat index, else start time). Test: exact two-sided sign test on the paired ratios, "
        f"p = 2 P(Binomial(n, 1/2) <= min(k, n - k)) with k ratios above 1 of n; with n pairs the smallest "
        f'possible p is 2/2^n, so a verdict at p < {result["alpha"]} needs n >= {need}. "within the noise": '
        f"no difference shown with these pairs. Min/max bounds: min(group)/max(baseline) to "
        f"max(group)/min(baseline).\n"
    )
    return out.getvalue()


CSV_COLUMNS = [
    "machine",
    "group",
    "n",
    "median",
    "min",
    "max",
    "spread",
    "ratio",
    "bound_low",
    "bound_high",
    "pairing",
    "pairs",
    "paired_median",
    "paired_min",
    "paired_max",
    "sign_test_p",
    "verdict",
    "final_loss",
    "loss_worse_than_baseline",
    "flops_per_sample",
    "median_tflops",
    "median_mfu",
    "peak_allocated_mb",
    "peak_reserved_mb",
    "gpu_bound_share",
    "cpus_used",
    "cpu_throttled_share",
    "input_supply_per_sec",
    "pss_peak_mb",
    "shm_peak_mb",
    "gpu_idle_share",
    "input_gap_share",
    "profiled_step_ms",
    "unprofiled_step_ms",
    "profiler_distortion",
    "profile_detail",
    "rates",
]


def loss_cells(loss: dict[str, Any] | None) -> tuple[float | str, bool | str]:
    """The CSV's final_loss and loss_worse_than_baseline: empty for runs without a loss."""
    if loss is None:
        return "", ""
    return ("diverged" if loss["final"] is None else loss["final"]), loss["worse_than_baseline"]


def csv_text(result: dict[str, Any]) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(CSV_COLUMNS)
    for table in result["tables"]:
        for g in table["groups"]:
            e, c, b = g["evidence"] or {}, g["ceiling"] or {}, g["gpu_bound"] or {}
            paired = g.get("paired") or {}
            w.writerow(
                [
                    table["machine_label"],
                    g["group"],
                    g["n"],
                    g["median"],
                    g["min"],
                    g["max"],
                    g["spread"],
                    g.get("ratio", 1.0),
                    *(g.get("ratio_bounds") or ("", "")),
                    g.get("pairing", ""),
                    paired.get("n", ""),
                    paired.get("median", ""),
                    paired.get("min", ""),
                    paired.get("max", ""),
                    (g.get("sign_test") or {}).get("p", ""),
                    g["verdict"],
                    *loss_cells(g["loss"]),
                    c.get("flops_per_sample") or "",
                    c.get("median_tflops", ""),
                    "" if c.get("median_mfu") is None else c["median_mfu"],
                    *(
                        ("", "")
                        if not g.get("memory")
                        else (g["memory"]["median_allocated_mb"], g["memory"]["median_reserved_mb"])
                    ),
                    b.get("median_share", ""),
                    *("" if (g.get("host") or {}).get(k) is None else g["host"][k] for k in HOST_FIGURES),
                    e.get("gpu_idle_share", ""),
                    e.get("input_gap_share", ""),
                    e.get("profiled_step_ms", ""),
                    "" if e.get("unprofiled_step_ms") is None else e["unprofiled_step_ms"],
                    "" if e.get("profiler_distortion") is None else e["profiler_distortion"],
                    e.get("profile_detail", ""),
                    " ".join(f"{r:.1f}" for r in g["rates"]),
                ]
            )
    for p in result.get("pooled") or []:
        row = dict.fromkeys(CSV_COLUMNS, "")
        paired = p["paired"]
        row.update(
            machine=f"pooled over {len(p['machines'])} machines",
            group=p["group"],
            pairing="each pair within one machine",
            pairs=paired["n"],
            paired_median=paired["median"],
            paired_min=paired["min"],
            paired_max=paired["max"],
            sign_test_p=p["sign_test"]["p"],
            verdict=p["verdict"],
        )
        w.writerow(row.values())
    return out.getvalue()


def json_text(result: dict[str, Any]) -> str:
    tables = [
        {**t, "groups": [{k: v for k, v in g.items() if k != "key"} for g in t["groups"]]} for t in result["tables"]
    ]
    return json.dumps({**result, "tables": tables}, indent=2, sort_keys=True, default=str) + "\n"


def plot(result: dict[str, Any], path: str) -> str:
    """Each run's rate as a point in run order, coloured by group, with each group's median; one panel per machine."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    try:
        fig.savefig(path, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def figure(result: dict[str, Any]) -> Any:
    """The matplotlib figure plot saves; the caller closes it.

    One panel per machine, each with its title above and its legend below; constrained layout keeps each
    panel's title, axis labels and legend clear of the others'. Each panel's y axis starts at 0 and ends above
    its fastest run, so no point is cut at the top; the x axis counts runs in whole numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    tables = result["tables"]
    several = len(tables) > 1
    heights = [3.2 + 0.18 * len(t["groups"]) + (0.5 if several else 0.2) for t in tables]
    fig, axes = plt.subplots(
        len(tables),
        1,
        figsize=(8, sum(heights)),
        dpi=120,
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": heights},
    )
    colors = plt.get_cmap("tab10")
    for ax, table in zip(axes[:, 0], tables):
        for i, g in enumerate(table["groups"]):
            xs = [n for n, r in enumerate(table["bench_runs"], start=1) if r["group"] == g["group"]]
            ys = [r["samples_per_sec"] for r in table["bench_runs"] if r["group"] == g["group"]]
            name = textwrap.fill(f"{g['group']} (median {fmt_rate(g['median'])})", 100, subsequent_indent="  ")
            ax.scatter(xs, ys, color=colors(i % 10), label=name, zorder=3)
            ax.axhline(g["median"], color=colors(i % 10), linewidth=0.8, alpha=0.6)
        top = max(r["samples_per_sec"] for r in table["bench_runs"])
        ax.set_ylim(0, top * 1.08)  # room above the fastest run's point
        ax.set_xlim(0.5, len(table["bench_runs"]) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("run order")
        ax.set_ylabel("samples/s (bench window)")
        ax.grid(alpha=0.3)
        # Below the axes: group labels of many options are long and would cover the points.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.18), frameon=False)
        title = f"{len(table['bench_runs'])} bench runs in {len(table['groups'])} groups"
        ax.set_title(textwrap.fill(title + (f"; {table['machine_label']}" if several else ""), 90), fontsize=9)
    return fig


def matplotlib_missing() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


def write_outputs(result: dict[str, Any], out_dir: str) -> tuple[dict[str, str], str | None]:
    """comparison.md, .csv, .json and .png, all or none: each is written to a temp file first and the
    temp files are renamed only once every one of them is complete. Without matplotlib there is no
    picture, and an older comparison.png is removed (it would not match the new tables).

    Returns the written paths and a note (None, or why the picture is missing).
    """
    os.makedirs(out_dir, exist_ok=True)
    texts = {
        "markdown": ("comparison.md", markdown(result, out_dir)),
        "csv": ("comparison.csv", csv_text(result)),
        "json": ("comparison.json", json_text(result)),
    }
    staged, note = {}, None

    def temp_for(name):
        return os.path.join(out_dir, f".partial-{os.getpid()}-{name}")

    try:
        for kind, (name, text) in texts.items():
            tmp = temp_for(name)
            staged[kind] = (tmp, os.path.join(out_dir, name))
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        if matplotlib_missing():
            note = (
                "comparison.png not drawn: the plot needs matplotlib (pip install matplotlib); the tables are written"
            )
        else:
            staged["png"] = (temp_for("comparison.png"), os.path.join(out_dir, "comparison.png"))
            plot(result, staged["png"][0])
    except BaseException:
        for tmp, _ in staged.values():
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    for tmp, final in staged.values():
        os.replace(tmp, final)
    stale = os.path.join(out_dir, "comparison.png")
    if "png" not in staged and os.path.exists(stale):
        os.remove(stale)
    return {kind: final for kind, (_, final) in staged.items()}, note


def log_to_polyaxon(paths: dict[str, str]) -> None:
    """Inside a Polyaxon run: the picture as an image, the tables copied into the run's outputs and logged as its
    artifacts (comparison-markdown, -csv, -json)."""
    from polyaxon import tracking

    from steplens.polyaxonenv import log_outputs, managed_identity

    tracking.init(**managed_identity())
    if "png" in paths:
        tracking.log_image(data=paths["png"], name="comparison")
    outputs = tracking.get_outputs_path()
    copies = {}
    for kind in ("markdown", "csv", "json"):
        with open(paths[kind], "rb") as f:
            copies[f"comparison-{kind}"] = write_atomic(os.path.join(outputs, os.path.basename(paths[kind])), f.read())
    log_outputs(tracking, copies, "the comparison's tables as artifacts")
    tracking.end()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked: a bad value is one line on stderr and exit 2 (argparse's own error)."""
    p = argparse.ArgumentParser(prog="steplens compare", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--offline", metavar="PATH", help="a folder of offline runs (POLYAXON_OFFLINE_ROOT)")
    src.add_argument("-p", "--project", help="a Polyaxon project ([owner/]name)")
    p.add_argument("-q", "--query", default=None, help="Polyaxon query to select runs, e.g. 'tags:study1'")
    p.add_argument(
        "--baseline",
        default=None,
        help="group to compare against, by its label or by settings only it has, e.g. workers=4 (default: the first)",
    )
    p.add_argument(
        "--per-host",
        action="store_true",
        help="runs of several machines (host, GPU, driver, torch, CUDA, CPU budget): one table per "
        "machine (default: refuse to pool them)",
    )
    p.add_argument(
        "--loss-tolerance",
        type=float,
        default=LOSS_TOLERANCE,
        help="a group's final loss is worse than the baseline's above baseline x (1 + this), "
        f"or above baseline + --loss-floor when that is larger (default: {LOSS_TOLERANCE})",
    )
    p.add_argument(
        "--loss-floor",
        type=float,
        default=LOSS_FLOOR,
        help="the smallest excess over the baseline's final loss that counts as worse, for losses "
        f"near zero (default: {LOSS_FLOOR})",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FUNCTION",
        help="for the roofline of CUDA-graph profile traces, whose trace has no operators: the function that "
        "builds the model, imported from the current folder (the companion's: train:build_model) (default: none; "
        "such traces get no roofline, and a line says why)",
    )
    p.add_argument("--out", default="comparison", help="folder for comparison.md/.csv/.json/.png (default: comparison)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="read only the newest N runs the query matches (default: every one; a line says how many were read)",
    )
    p.add_argument(
        "--page-size",
        type=int,
        default=PAGE_SIZE,
        metavar="N",
        help=f"runs per listing request to the Polyaxon server (default: {PAGE_SIZE})",
    )
    p.add_argument(
        "--downloads",
        type=int,
        default=DOWNLOADS,
        metavar="N",
        help=f"run.json downloads at once, for older runs without machine facts as outputs (default: {DOWNLOADS})",
    )
    args = p.parse_args(argv)
    for name in ("loss_tolerance", "loss_floor"):
        if not (getattr(args, name) >= 0 and math.isfinite(getattr(args, name))):
            p.error(f"--{name.replace('_', '-')} must be a finite number >= 0, got {getattr(args, name)}")
    for name in ("limit", "page_size", "downloads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.offline and args.query:
        p.error("-q/--query selects runs on a Polyaxon server (-p PROJECT); offline runs are read whole")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        builder = load_builder(args.model) if args.model else None
    except ValueError as e:
        print(f"steplens compare: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.offline:
            records, read = gather_offline(args.offline, args.limit)
        else:
            records, read = gather_polyaxon(args.project, args.query, args.limit, args.page_size, args.downloads)
        result = compare_records(
            records,
            baseline=args.baseline,
            per_host=args.per_host,
            loss_tolerance=args.loss_tolerance,
            loss_floor=args.loss_floor,
        )
        add_rooflines(result, builder)
    except CompareError as e:
        print(f"steplens compare: error: {e}", file=sys.stderr)
        return 1
    result["read"] = read
    paths, note = write_outputs(result, args.out)
    sys.stdout.write(markdown(result))
    if note:
        print(f"steplens compare: note: {note}", file=sys.stderr)
    print(f"\nwritten: {', '.join(paths.values())}", file=sys.stderr)
    if os.environ.get("POLYAXON_RUN_INSTANCE"):
        log_to_polyaxon(paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
