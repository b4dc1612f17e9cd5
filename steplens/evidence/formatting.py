"""The evidence as text tables: per step, the window, and the kernel classes; a run named by its settings."""

from typing import Any

from steplens.evidence import delays
from steplens.evidence.attribution import CAVEAT, NO_GPU
from steplens.scopes import EVAL_FORWARD, FORWARD_BACKWARD, SCOPES
from steplens.trace import kernels

OFF_AT_ZERO = {"lr_warmup_steps"}  # 0 means no ramp, as in older runs that lack the setting
# Settings that every run has; any other setting that is switched on is a candidate fix worth naming.
DEFAULT_BATCH = 128  # train.py's --batch-size default, the tutorial's: left out of a run's label

BASE_SETTINGS = {
    "mode",
    "workers",
    "batch_size",
    "warmup_steps",
    "bench_steps",
    "data",
    "data_dir",
    "device",
    "seed",
    "lr",
    "momentum",
    "weight_decay",
    "trace_format",
    "output_dir",
    "repeat",
    "profile_detail",
    "unprofiled_steps",
    "force_workers",
    "ddp_backend",
    "slow_input_ms",
    "world_size",
    "nproc_per_node",
}


def configuration(settings: dict[str, Any], batch: bool = True) -> str:
    """The run's settings as train.py flags: workers, a batch size other than the default (batch=False: never),
    then every candidate fix that is on."""
    flags = [f"--workers {settings.get('workers', 0)}"] if not settings.get("gpu_input") else []
    if batch and settings.get("batch_size") not in (None, DEFAULT_BATCH):  # what tells a batch study's rows apart
        flags.append(f"--batch-size {settings['batch_size']}")
    for k in sorted(set(settings) - BASE_SETTINGS):
        v = settings[k]
        if (
            v is False
            or v is None
            or v == "off"
            or (k in OFF_AT_ZERO and v == 0)
            or (k, v) == ("profile_phase", "train")
        ):
            continue  # off: --lr-warmup-steps 0 is no ramp (as in older runs); train is the default phase
        flag = "--" + k.replace("_", "-")
        flags.append(flag if v is True else f"{flag} {v}")
    return " ".join(flags) or "defaults"


def run_label(settings: dict[str, Any]) -> str:
    """The run's configuration in a few words, for a picture's title: the DataLoader workers, the batch, a lean
    capture, and every candidate fix that is on, e.g. "workers=4, batch 128, --amp bf16 --channels-last"."""
    flags, parts = configuration(settings, batch=False), []
    if not settings.get("gpu_input"):  # --gpu-input has no DataLoader: the flag itself says so, among the fixes
        parts.append(f"workers={settings.get('workers', 0)}")
        flags = flags.removeprefix(f"--workers {settings.get('workers', 0)}").strip()
    if settings.get("batch_size") is not None:
        parts.append(f"batch {settings['batch_size']}")
    if settings.get("profile_detail") == "lean":
        parts.append("lean capture")
    if flags and flags != "defaults":
        parts.append(flags)
    return ", ".join(parts)


def _scope_ms(scope):
    return lambda f: f["gpu_work_by_scope_us"].get(scope, 0.0) / 1e3


def rows_for(names: tuple[str, ...]) -> list[tuple[str, Any, str]]:
    """The table's rows for a trace read by these scopes (a phase's: steplens/scopes.py): label, getter, format."""
    return [  # label, getter, format
        ("step wall ms", lambda f: f["wall_us"] / 1e3, "{:.2f}"),
        *[(f"cpu {n} ms", (lambda n: lambda f: f["scopes_cpu_us"][n] / 1e3)(n), "{:.2f}") for n in names],
        ("cpu input ms (input source)", lambda f: f["input_cpu_us"] / 1e3, "{:.2f}"),
        ("gpu busy ms", lambda f: f["gpu_busy_us"] / 1e3, "{:.2f}"),
        ("gpu idle ms", lambda f: f["gpu_idle_us"] / 1e3, "{:.2f}"),
        ("gpu idle share", lambda f: f["gpu_idle_share"], "{:.3f}"),
        ("input gap ms", lambda f: f["input_gap_us"] / 1e3, "{:.2f}"),
        ("input gap / idle", lambda f: f["input_gap_share"], "{:.3f}"),
        ("gpu span ms", lambda f: f["gpu_span_us"] / 1e3, "{:.2f}"),
        ("gpu work launched ms", lambda f: f["gpu_work_us"] / 1e3, "{:.2f}"),
        *[(f"  launched in {n} ms", _scope_ms(n), "{:.2f}") for n in names],
        ("gpu lag after step ms", lambda f: f["gpu_lag_us"] / 1e3, "{:.2f}"),
        ("h2d copies", lambda f: f["h2d"]["count"], "{:d}"),
        ("h2d MB", lambda f: f["h2d"]["bytes"] / 1e6, "{:.2f}"),
        ("h2d ms", lambda f: f["h2d"]["us"] / 1e3, "{:.3f}"),
        ("h2d overlapped ms", lambda f: f["h2d"]["overlapped_with_kernels_us"] / 1e3, "{:.3f}"),
        ("kernels", lambda f: f["kernels"]["count"], "{:d}"),
        ("kernel median us", lambda f: f["kernels"]["median_us"], "{:.1f}"),
        ("kernels < 10us", lambda f: f["kernels"]["share_under_10us"], "{:.3f}"),
        ("launch cpu ms", lambda f: f["launch_cpu_us"] / 1e3, "{:.2f}"),
        ("graph launches", lambda f: f["graph_launches"], "{:d}"),
        ("launch / gpu busy", lambda f: f["launch_to_busy"], "{:.3f}"),
        ("sync calls", lambda f: f["sync"]["count"], "{:d}"),
        ("sync cpu ms", lambda f: f["sync"]["cpu_us"] / 1e3, "{:.2f}"),
    ]


# The share-of-step column has two denominators, and each cell names its own: a CPU row's share is over the
# step's CPU wall time ("of wall"), a GPU row's over the step's pace ("of pace": the step's span on the basis its
# idle time is read on). While the GPU keeps up the two are equal; when the CPU runs ahead (CUDA graphs, any
# GPU-bound step) the pace is the GPU's time per step, longer than the CPU's wall. share_line says both under the table.
OF_WALL, OF_PACE = "of wall", "of pace"
OVER_PACE = ("gpu busy ms", "gpu idle ms", "input gap ms")  # the rows whose share is over the pace


def share_cell(label: str, share: float | None) -> str:
    """A share-of-step cell: the share and its denominator ("19.1% of wall", "90.6% of pace"), or n/a."""
    return "n/a" if share is None else f"{share:.1%} {OF_PACE if label in OVER_PACE else OF_WALL}"


def share_line(ev: dict[str, Any]) -> str:
    """The line under a one-trace table that names the share column's denominators, with their means per step."""
    w = ev["window"]
    wall = f'"{OF_WALL}" is over the step\'s CPU wall time ({w["wall_us"] / w["steps"] / 1e3:.2f} ms a step)'
    if not ev["has_gpu"]:
        return f"share of step: {wall}"
    if w.get("pace_us") is None:
        return f'share of step: {wall}; "{OF_PACE}": n/a (no GPU figures)'
    pace = f"{w['pace_us'] / w['steps'] / 1e3:.2f} ms a step"
    basis = (
        f"the GPU's own time per step ({pace}): the CPU runs ahead of the GPU"
        if ev["idle_basis"] == "gpu_timeline"
        else f"the CPU's step ({pace}): the GPU keeps up with the CPU"
    )
    return f'share of step: {wall}; "{OF_PACE}" is over the step\'s pace, {basis}'


def shares_for(names: tuple[str, ...]) -> dict[str, Any]:
    """The share-of-step column's getters, by row label, for a trace read by these scopes."""
    return {
        **{f"cpu {n} ms": (lambda n: lambda f: f["scopes_cpu_us"][n] / f["wall_us"])(n) for n in names},
        "cpu input ms (input source)": lambda f: f["input_cpu_us"] / f["wall_us"],
        "gpu busy ms": lambda f: f["gpu_busy_us"] / f["pace_us"],
        "gpu idle ms": lambda f: f["gpu_idle_us"] / f["pace_us"],
        "input gap ms": lambda f: f["input_gap_us"] / f["pace_us"],
    }


ROWS, SHARES = rows_for(SCOPES), shares_for(SCOPES)  # the four training scopes' table


def mean_per_step(window: dict[str, Any], steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The window's additive figures divided by its step count (shares and medians stay). With the steps, the GPU's
    lag after a step is their mean (the window's own gpu_lag_us is the lag after its last step)."""
    n = window["steps"]
    m = dict(window)
    lags = [s["gpu_lag_us"] for s in steps or [] if s.get("gpu_lag_us") is not None]
    if lags:
        m["gpu_lag_us"] = sum(lags) / len(lags)
    for k in (
        "wall_us",
        "gpu_busy_us",
        "gpu_idle_us",
        "input_gap_us",
        "gpu_work_us",
        "launch_cpu_us",
        "graph_launches",
    ):
        if m.get(k) is not None:
            m[k] = m[k] / n
    m["gpu_span_us"] = window.get("gpu_span_per_step_us")  # the mean complete slot: the last step has none
    m["scopes_cpu_us"] = {k: None if v is None else v / n for k, v in window["scopes_cpu_us"].items()}
    if m.get("input_cpu_us") is not None:
        m["input_cpu_us"] = m["input_cpu_us"] / n
    if m.get("gpu_work_by_scope_us") is not None:
        m["gpu_work_by_scope_us"] = {k: v / n for k, v in window["gpu_work_by_scope_us"].items()}
    for group, keys in (
        ("h2d", ("count", "bytes", "us", "overlapped_with_kernels_us")),
        ("kernels", ("count",)),
        ("sync", ("count", "cpu_us")),
    ):
        if m.get(group) is not None:
            m[group] = {**m[group], **{k: m[group][k] / n for k in keys}}
    return m


def _value(getter, fig):
    try:
        return getter(fig)
    except (TypeError, KeyError, ZeroDivisionError):  # a share of nothing is n/a
        return None


def _fmt(value, fmt):
    if value is None:
        return "n/a"
    if fmt == "{:d}" and value != int(value):
        return f"{value:.1f}"
    return fmt.format(int(value) if fmt == "{:d}" else value)


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


CLASSES_TITLE = (
    "GPU time by kernel class (steplens/trace/kernels.py) of the GPU work each step launched; "
    "where kernels overlap, the one that started first keeps the time, so the classes sum to the "
    "GPU work launched"
)


def format_classes(evidences: list[dict[str, Any]]) -> list[str]:
    """The kernel-class table of GPU traces: one trace, a column per step (ms) and the window's count, median and
    share; several, each window's ms per step and share. Then the top kernels and the names no rule knows."""
    shown = [ev for ev in evidences if ev["has_gpu"] and (ev["window"].get("kernel_classes") or {}).get("busy_us")]
    if not shown:
        return []
    parts = [CLASSES_TITLE]
    present = [c for c in kernels.CLASSES if any(c in ev["window"]["kernel_classes"]["classes"] for ev in shown)]
    if len(evidences) == 1:
        ev = shown[0]
        w, n = ev["window"]["kernel_classes"], ev["window"]["steps"]
        steps = [(s["step"], (s.get("kernel_classes") or {}).get("classes", {})) for s in ev["steps"]]
        header = ["class"] + [f"#{num} ms" for num, _ in steps] + ["mean/step ms", "kernels/step", "median us", "share"]
        rows = [
            [cls]
            + [_fmt(c[cls]["us"] / 1e3 if cls in c else 0.0, "{:.3f}") for _, c in steps]
            + (
                [
                    _fmt(w["classes"][cls]["us"] / n / 1e3, "{:.3f}"),
                    _fmt(w["classes"][cls]["count"] / n, "{:.1f}"),
                    _fmt(w["classes"][cls]["median_us"], "{:.1f}"),
                    _fmt(w["classes"][cls]["share"], "{:.1%}"),
                ]
                if cls in w["classes"]
                else ["0.000", "0.0", "n/a", "0.0%"]
            )
            for cls in present
        ]
        rows.append(
            ["total = gpu work launched"]
            + [_fmt(s.get("gpu_work_us", 0.0) / 1e3, "{:.3f}") for s in ev["steps"]]
            + [
                _fmt(w["busy_us"] / n / 1e3, "{:.3f}"),
                _fmt(sum(c["count"] for c in w["classes"].values()) / n, "{:.1f}"),
                "",
                "100.0%",
            ]
        )
        parts.append(_table(header, rows))
    else:
        header = ["class (ms/step, share)"] + [chr(ord("A") + i) for i, ev in enumerate(evidences) if ev in shown]
        rows = [
            [cls]
            + [
                f"{c['us'] / ev['window']['steps'] / 1e3:.3f} ({c['share']:.1%})" if c else "0"
                for ev in shown
                for c in [ev["window"]["kernel_classes"]["classes"].get(cls)]
            ]
            for cls in present
        ]
        parts.append(_table(header, rows))
    for ev in shown:
        w, n = ev["window"]["kernel_classes"], ev["window"]["steps"]
        parts.append(
            f"{ev['trace']}: kernel time summed {w['kernel_us'] / n / 1e3:.3f} ms/step, of which "
            f"{w['overlap_us'] / n / 1e3:.3f} ms/step ran beside other GPU work (counted once above)"
        )
        parts.append(f"{ev['trace']}: top kernels (summed duration per step, count per step, class):")
        parts += [
            f"  {k['us'] / n / 1e3:7.3f} ms  {k['count'] / n:5.1f}  {kernels.SHORT[k['class']]:<15} {k['name'][:100]}"
            for k in w.get("top", [])
        ]
        if w["other_names"]:
            parts.append(
                f"{ev['trace']}: no class rule knows {len(w['other_names'])} names (other): "
                + "; ".join(name[:80] for name in w["other_names"][:5])
            )
    return parts


MEMORY_ROWS = [  # label, key in a step's (or the window's) memory figures
    ("allocated at start MB", "allocated_start"),
    ("allocated peak MB", "allocated_peak"),
    ("allocated at end MB", "allocated_end"),
    ("reserved at start MB", "reserved_start"),
    ("reserved peak MB", "reserved_peak"),
    ("reserved at end MB", "reserved_end"),
]


def _mb(value):
    return "n/a" if value is None else f"{value / 1e6:.1f}"


def format_memory(ev: dict[str, Any], table: bool) -> list[str]:
    """The memory the trace records, per device: a table (a column per step, each scope's change and peak) when
    table, else one line a device with the window's peaks; or the line saying why there is none."""
    mem = ev.get("memory")
    if mem is None:
        return []
    if mem["null_reason"]:
        return [f"{ev['trace']}: no memory figures: {mem['null_reason']}"]
    parts = []
    for name, dev in mem["devices"].items():
        w = dev["window"]
        if not table:
            parts.append(
                f"{ev['trace']}: memory {name}: peak allocated {_mb(w['allocated_peak'])} MB, "
                f"peak reserved {_mb(w['reserved_peak'])} MB"
            )
            continue
        rows = [[label] + [_mb(s[key]) for s in dev["steps"]] + [_mb(w.get(key))] for label, key in MEMORY_ROWS]
        for scope in ev.get("scope_set") or SCOPES:
            for label, key in ((f"  {scope} change MB", "allocated_change"), (f"  {scope} peak MB", "allocated_peak")):
                rows.append([label] + [_mb((s["scopes"].get(scope) or {}).get(key)) for s in dev["steps"]] + [""])
        header = [f"memory {name}"] + [f"#{s['step']}" for s in dev["steps"]] + ["window"]
        parts.append(_table(header, rows))
        parts.append(
            f"{ev['trace']}: memory {name}: {dev['events']} events; allocated counts {dev['allocated_counts']}"
        )
        if dev["reserved_null_reason"]:
            parts.append(f"{ev['trace']}: memory {name}: no reserved figures: {dev['reserved_null_reason']}")
        for key, what in (
            ("outside_steps", "events outside every step, in no figure"),
            ("running_total_breaks", "events whose allocated total is not the one before plus their bytes"),
        ):
            if dev[key]:
                parts.append(f"{ev['trace']}: memory {name}: {dev[key]} {what}")
    return parts


def save_lines(saves: list[dict[str, Any]] | None) -> list[str]:
    """A line per checkpoint/save (summarize's saves): its step, its length and share, the GPU's idle time in it."""
    out = []
    for s in saves or []:
        where = f"ProfilerStep#{s['step']}" if s["step"] is not None else "no profiled step"
        share = "" if s["share_of_step"] is None else f", {s['share_of_step']:.0%} of the step"
        idle = (
            f"the GPU idle for {s['gpu_idle_us'] / 1e3:.2f} ms of it"
            if s["gpu_idle_us"] is not None
            else f"GPU idle n/a: {s['gpu_idle_null_reason']}"
        )
        out.append(f"checkpoint/save in {where}: {s['save_us'] / 1e3:.2f} ms{share}; {idle}")
    return out


def damage_lines(ev: dict[str, Any]) -> list[str]:
    """One line per kind of damage the reader found in a trace: how many, what, what was done, an example."""
    return [f"damaged: {d['count']} {d['what']} ({d['action']}; e.g. {d['example']})" for d in ev.get("damage", [])]


def trace_lines(ev: dict[str, Any], table: bool) -> list[str]:
    """The lines under the table about one trace: its input source, damage, absent scopes, saves, memory (a table
    when table), Perfetto, the idle basis and the notes."""
    parts = []
    src = ev["input_source"]
    parts.append(
        f"{ev['trace']}: "
        + (
            f"input read from {src['name']} ({src['kind']})"
            if src["name"] and not src["null_reason"]
            else f"no input figures: {src['null_reason']}"
        )
    )
    absent = [n for n in ev.get("scope_set") or SCOPES if n not in ev["scopes_present"]]
    if absent:
        parts.append(f"{ev['trace']}: not in the trace, so n/a: {', '.join(absent)}")
    parts += [f"{ev['trace']}: {line}" for line in save_lines(ev.get("saves"))]
    parts += format_memory(ev, table)
    drops = ev.get("perfetto_drops", {}).get("count")
    parts.append(
        f"{ev['trace']}: "
        + (
            f"Perfetto before v57.1 would drop {drops} complete events that cross others on their track"
            if drops
            else "every complete event nests: every Perfetto version shows them all"
        )
    )
    if not ev["has_gpu"]:
        parts.append(f"{ev['trace']}: {NO_GPU}")
        parts += [f"{ev['trace']}: {note}" for note in ev["notes"]]
        return parts
    parts.append(
        f"{ev['trace']}: "
        + (
            "idle time is read on the GPU's own timeline: the CPU runs ahead of the GPU"
            if ev["idle_basis"] == "gpu_timeline"
            else "idle time is read on the CPU's steps: the GPU keeps up with the CPU"
        )
    )
    for note in ev["notes"]:
        parts.append(f"{ev['trace']}: {note}")
    for s in ev["steps"]:
        if s["gpu_span_null_reason"] and s["gpu_work_us"]:
            parts.append(f"{ev['trace']}: step #{s['step']}: {s['gpu_span_null_reason']}")
    if ev["crossing_slices"]["count"]:
        parts.append(
            f"{ev['trace']}: {ev['crossing_slices']['count']} slices overlap others on their thread "
            "without nesting (with_stack's Python slices): Perfetto before v57.1 drops them"
        )
    return parts


def delay_lines(ev: dict[str, Any]) -> list[str]:
    """The step's time by delay (steplens/evidence/delays.py) in one line, and the figures behind each delay of
    at least DELAY_SHOWN of the step in a line each; nothing on a trace without them."""
    shares = (ev.get("verdict") or {}).get("delays")
    if not shares:
        return []
    shown = [
        c for c in delays.CLASSES if shares.get(c, 0.0) >= 0.005 or c in ("compute", "input", "copy", "launch", "sync")
    ]
    lines = ["delays (share of the step): " + ", ".join(f"{delays.NAMES[c]} {shares[c]:.0%}" for c in shown)]
    lines += _scope_share_line(ev["verdict"], shares)
    w = ev["window"]
    details = w.get("delay_details")
    if details and w.get("pace_us"):
        per_step = {c: shares[c] * w["pace_us"] / w["steps"] for c in shares}
        source = (ev.get("input_source") or {}).get("name")
        for c in sorted(shares, key=shares.get, reverse=True):
            if shares[c] >= DELAY_SHOWN:
                lines.append(f"  {delays.NAMES[c]}: {delays.evidence(c, details, per_step, source)}")
    return lines


DELAY_SHOWN = 0.10  # a delay of at least this share of the step gets its line of figures

# Where the verdict on a trace with the scopes and the delays measure the same thing two ways, and say why they differ.
LAUNCH_SCOPES = (FORWARD_BACKWARD, EVAL_FORWARD)


def _scope_share_line(verdict: dict[str, Any], shares: dict[str, float]) -> list[str]:
    """One line where the verdict's share and the delay that reads the same time differ by a point or more, for the
    two cases whose difference is known: the GPU's busy time (its copies included) against GPU compute (kernels
    alone: copies count under copy), and the GPU's idle inside the forward scope against launch-bound (which also
    counts the launch waits in the other scopes and between them); where the forward scope's idle is the larger,
    the line names the delays its idle can hold beyond launch waits. Elsewhere the two are different measures,
    and no line claims a reason."""
    part, share = verdict.get("part"), verdict.get("share")
    if share is None:
        return []
    if part == "busy" and share - shares.get("compute", 0.0) >= 0.01:
        return [
            f"  (the verdict's {share:.0%} is the GPU's busy time, its copies included; {delays.NAMES['compute']} "
            f"{shares['compute']:.0%} is its kernels alone: the copies count under {delays.NAMES['copy']})"
        ]
    if part in LAUNCH_SCOPES and shares.get("launch", 0.0) - share >= 0.01:
        return [
            f"  (the verdict's {share:.0%} is the GPU's idle inside {part} alone; {delays.NAMES['launch']} "
            f"{shares['launch']:.0%} also counts the launch waits outside it)"
        ]
    if part in LAUNCH_SCOPES and share - shares.get("launch", 0.0) >= 0.01:  # what else the scope's idle holds
        return [
            f"  (the verdict's {share:.0%} is all of the GPU's idle inside {part}; {delays.NAMES['launch']} "
            f"{shares.get('launch', 0.0):.0%} counts launch waits alone: the rest is {delays.NAMES['sync']}, "
            f"{delays.NAMES['host']} or {delays.NAMES['copy']} inside it)"
        ]
    return []


BRIEF_NOTES = 3  # the brief output's notes at most: the rest are behind --full


def brief_lines(ev: dict[str, Any]) -> list[str]:
    """One trace in a few lines: the verdict, the delays and their figures, the trace in one line, its damage, the
    GPU's top kernel classes and its first notes (--full has the rest)."""
    parts = [f"verdict: {ev['verdict']['sentence']}"]
    parts += delay_lines(ev)
    w = ev["window"]
    facts = [f"{w['steps']} step{'s' if w['steps'] != 1 else ''}"]
    if ev["has_gpu"] and w.get("pace_us"):
        whose = "the GPU's own step, as the CPU runs ahead" if ev.get("cpu_runs_ahead") else "the CPU's step"
        facts.append(f"the shares are of {w['pace_us'] / w['steps'] / 1e3:.2f} ms a step on average ({whose})")
    else:
        facts.append(f"mean step {w['wall_us'] / w['steps'] / 1e3:.2f} ms")
        if not ev["has_gpu"]:
            facts.append("no GPU events (a CPU-only trace)")
    parts.append(f"trace: {ev['trace']}: {', '.join(facts)}")
    parts += damage_lines(ev)
    top = (w.get("kernel_classes") or {}).get("classes") if ev["has_gpu"] else None
    if top:
        ranked = sorted(top.items(), key=lambda kv: -kv[1]["us"])[:4]
        parts.append("GPU time by kernel class: " + ", ".join(f"{c} {v['share']:.0%}" for c, v in ranked))
    notes = list(ev["notes"])
    parts += [f"note: {n}" for n in notes[:BRIEF_NOTES]]
    if len(notes) > BRIEF_NOTES:
        parts.append(f"note: {len(notes) - BRIEF_NOTES} more notes with --full")
    return parts


def format_brief(evidences: list[dict[str, Any]]) -> str:
    """summarize's default output: each trace in brief_lines, then where the rest is."""
    parts = []
    for i, ev in enumerate(evidences):
        lines = brief_lines(ev)
        if len(evidences) > 1:
            lines = [f"{chr(ord('A') + i)}: {lines[0]}"] + [f"   {line}" for line in lines[1:]]
        parts += lines
    parts.append("more: --full for the figures per step and every note, --json for every figure")
    return "\n".join(parts) + "\n"


def format_table(evidences: list[dict[str, Any]]) -> str:
    """One trace: a column per step plus the window. Several: one window column each (B/A for two)."""
    parts = []
    # the phases' scopes: train's four, eval's three, or train's with the save (all of them, for traces of several)
    names = tuple(dict.fromkeys(n for ev in evidences for n in ev.get("scope_set") or SCOPES))
    rows, share_of = rows_for(names), shares_for(names)
    rows_used = rows if any(ev["has_gpu"] for ev in evidences) else rows[: 2 + len(names)]
    if len(evidences) == 1:
        ev = evidences[0]
        cols = [(f"#{s['step']}", s) for s in ev["steps"]] + [("mean/step", mean_per_step(ev["window"], ev["steps"]))]
        header = ["figure"] + [c for c, _ in cols] + ["share of step"]
        rows = [
            [label]
            + [_fmt(_value(g, f), fmt) for _, f in cols]
            + ([share_cell(label, _value(share_of[label], ev["window"]))] if label in share_of else [""])
            for label, g, fmt in rows_used
        ]
        parts.append(f"verdict: {ev['verdict']['sentence']}")
        parts += delay_lines(ev)
        parts.append(f"trace: {ev['trace']}")
        parts += [f"{ev['trace']}: {line}" for line in damage_lines(ev)]  # before every figure it may touch
    else:
        header = ["figure (mean/step)"] + [chr(ord("A") + i) for i in range(len(evidences))]
        if len(evidences) == 2:
            header.append("B/A")
        rows = []
        for label, g, fmt in rows_used:
            vals = [_value(g, mean_per_step(ev["window"], ev["steps"])) for ev in evidences]
            row = [label] + [_fmt(v, fmt) for v in vals]
            if len(evidences) == 2:
                a, b = vals
                row.append("n/a" if a in (None, 0) or b is None else f"{b / a:.2f}")
            rows.append(row)
        for i, ev in enumerate(evidences):
            parts.append(f"{chr(ord('A') + i)}: {ev['trace']}\n   verdict: {ev['verdict']['sentence']}")
            parts += [f"   {line}" for line in damage_lines(ev)]  # before every figure it may touch
    parts.append(_table(header, rows))
    if len(evidences) == 1:
        parts.append(share_line(evidences[0]))
    parts += format_classes(evidences)
    for ev in evidences:
        parts += trace_lines(ev, len(evidences) == 1)
    parts.append(f"note: {CAVEAT}")
    return "\n".join(parts) + "\n"
