"""steplens roofline: how far each kernel class of a step runs from the GPU's compute or memory limit.

    steplens roofline TRACE                                # an eager step profiled with record_shapes
    steplens roofline TRACE --model train:build_model      # a CUDA-graph step: the work from the model's layers
    steplens roofline A B C --json                         # one JSON object per trace
    python scripts/class_table.py A B C --roofline --model train:build_model --roofline-png r.png   # side by side

For each kernel class (steplens/trace/kernels.py): the work (FLOPs of convolutions and matrix multiplies, bytes
of the rest; steplens/evidence/work.py), the time the trace gives it, the achieved TFLOP/s and GB/s, the GPU's
peaks (flops.PEAKS), the limit that binds and the share of it the class reaches. Every figure is defined in
docs/KERNELS.md#the-roofline-by-kernel-class."""

import argparse
import importlib
import json
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from steplens.evidence import work
from steplens.evidence.attribution import NO_GPU, attribute
from steplens.evidence.flops import PEAKS
from steplens.evidence.formatting import damage_lines
from steplens.text import say, write
from steplens.trace import kernels
from steplens.trace.reader import TraceError, iter_events
from steplens.trace.timeline import GRAPH_LAUNCH_CALLS, Tap, Trace, read, tap_cats

BYTES_NOTE = (
    "bytes are a lower bound (each tensor read or written once): the GB/s and the share of the memory limit "
    "are lower bounds too"
)
GRAPH_REPLAY = "launched by a CUDA graph replay: no operator in the trace (give --model for the model's work)"
NO_OPERATOR = "no operator (cpu_op) around its launch call"
NO_LAUNCH = "no launch call in the trace"
HOST_COPY = "a copy to or from the host: bound by the host link, not the GPU's memory"
NO_WORK = "no work counted"
NO_CLASS_WORK = "no work counted for this class"
WITHHELD = "no roofline: the trace is damaged where the kernel classes are read"
MODEL_TIME = (
    "the work comes from the model's layers; each class's time is all of its kernels in the step, some of them "
    "outside the model (the GPU-side input pipeline, for one): the achieved rates are lower bounds"
)


OPERATOR_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")  # what Operators.keep reads


class Operators:
    """The cpu_ops and launch calls of a trace, kept in the pass that reads its timeline (timeline.read's tap),
    to link each kernel to the operator that launched it: the innermost cpu_op around the launch call, on the
    launch's thread."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> Tap:
        """Forget what an earlier pass kept (a second pass reads the trace without its duplicates); returns keep."""
        self.ops = defaultdict(list)  # (pid, tid): [(start, end, OpCall)]
        self.launches = {}  # correlation id: (pid, tid, start, end, name)
        return self.keep

    def keep(self, cat: Any, name: str, pid: Any, tid: Any, args: dict[str, Any], start: float, dur: float) -> None:
        """Keep one complete event the reader kept, if it is a cpu_op or a launch call (a timeline.Tap)."""
        if cat not in OPERATOR_CATS:
            return
        where = (pid, tid)
        if cat == "cpu_op":
            op = work.OpCall(
                name,
                args.get("Input Dims") or [],
                args.get("Input type") or [],
                args.get("Input Strides") or [],
                args.get("Concrete Inputs") or [],
            )
            self.ops[where].append((start, start + dur, op))
        elif args.get("correlation") is not None:
            self.launches[args["correlation"]] = (pid, tid, start, start + dur, name)

    keep.cats = OPERATOR_CATS  # the reader gives it no other event (timeline.tap_cats)

    def launchers(self) -> dict[Any, tuple[str, tuple | None]]:
        """{correlation id: (launch call name, (op index, OpCall) or None)}: the innermost enclosing cpu_op."""
        by_thread = defaultdict(list)
        for corr, (pid, tid, s, e, name) in self.launches.items():
            by_thread[(pid, tid)].append((s, e, corr, name))
        out = {}
        for where, calls in by_thread.items():
            ops = sorted(self.ops.get(where, []), key=lambda o: (o[0], -o[1]))
            stack, i = [], 0
            for s, _, corr, name in sorted(calls, key=lambda c: c[0]):
                while i < len(ops) and ops[i][0] <= s:  # the ops begun by the launch, nested on a stack
                    while stack and stack[-1][0] < ops[i][0]:
                        stack.pop()
                    stack.append((ops[i][1], (where, i), ops[i][2]))
                    i += 1
                while stack and stack[-1][0] < s:  # ended before the launch: encloses no later launch either
                    stack.pop()
                out[corr] = (name, (stack[-1][1], stack[-1][2]) if stack else None)
        return out


def read_with_operators(
    open_events: Callable[[], Iterable[Any]], tap: Callable[[], Tap] | None = None
) -> tuple[Trace, Operators]:
    """A trace's timeline read as summarize reads it (timeline.read: damage counted, events written twice
    removed in a later pass), and its operators and launch calls kept in the same pass; tap: another caller's
    (timeline.read's), given the same events."""
    ops = Operators()
    if tap is None:
        return read(open_events, ops.restart), ops

    def both() -> Tap:
        keep, other = ops.restart(), tap()

        def give(cat: Any, name: str, pid: Any, tid: Any, args: dict[str, Any], start: float, dur: float) -> None:
            keep(cat, name, pid, tid, args, start, dur)
            other(cat, name, pid, tid, args, start, dur)

        cats = (tap_cats(keep), tap_cats(other))
        give.cats = None if None in cats else cats[0] + cats[1]  # each ignores the other's
        return give

    return read(open_events, both), ops


def device_of(meta: dict[str, Any]) -> str | None:
    """The GPU's name from a trace's deviceProperties (iter_events' meta), or None."""
    props = meta.get("deviceProperties")
    first = props[0] if isinstance(props, list) and props else None
    name = first.get("name") if isinstance(first, dict) else None
    return name if isinstance(name, str) else None


def _window(t):
    """The GPU events the steps launched (the class table's), with each one's class and exclusive time."""
    by_step = attribute(t)[0]
    evs = [ev for num, _, _ in t.steps for ev, _ in by_step.get(num, [])]
    named = [(t.gpu_names.get(ev, ""), "kernel" if ev[0] == "kernel" else "gpu_memcpy", ev[1], ev[2]) for ev in evs]
    return evs, [kernels.classify(n, c) for n, c, _, _ in named], kernels.exclusive(named)


def _credit(parts, classes_us):
    """Which classes an operator's parts go to: {class: [flops, bytes, precisions]}, and the work left over."""
    got, unmatched = {}, 0
    memory = [c for c in classes_us if c not in work.COMPUTE_CLASSES] or list(classes_us)
    for p in parts:
        cls = p.cls if p.cls is not None else max(memory, key=lambda c: classes_us[c])
        if cls not in classes_us:
            unmatched += p.flops or p.bytes
            continue
        g = got.setdefault(cls, [0, 0, set()])
        g[0] += p.flops
        g[1] += p.bytes
        if p.precision:
            g[2].add(p.precision)
    return got, unmatched


def _uncount(apart, reason, excl, n=1):
    a = apart.setdefault(reason, {"kernels": 0, "us": 0.0})
    a["kernels"] += n
    a["us"] += excl


def operator_work(t: Trace, ops: Operators) -> dict[str, Any]:
    """Each class's work from the operators that launched its kernels (an eager trace with record_shapes).

    Returns {"classes": {class: {"us", "count", "counted_us", "flops", "bytes", "precisions"}} (window totals),
    "not_counted": {reason: {"kernels", "us"}}, "unmatched_operators": how many operators' work found no kernel
    of its class}. Copies and memsets carry their own bytes (DtoD: read and written)."""
    evs, classes, excl = _window(t)
    launchers = ops.launchers()
    rows = {c: {"us": 0.0, "count": 0, "counted_us": 0.0, "flops": 0, "bytes": 0, "precisions": set()} for c in classes}
    apart, by_op = {}, defaultdict(list)
    for ev, cls, x in zip(evs, classes, excl):
        rows[cls]["us"] += x
        rows[cls]["count"] += 1
        name = t.gpu_names.get(ev, "")
        if ev[0] != "kernel":
            if ev[0] == "h2d" or "DtoH" in name:
                _uncount(apart, HOST_COPY, x)
            else:
                rows[cls]["bytes"] += ev[5] * (2 if ev[0] == "memcpy" else 1)
                rows[cls]["counted_us"] += x
            continue
        launch = launchers.get(ev[4]) if ev[4] is not None else None
        if launch is None:
            _uncount(apart, NO_LAUNCH, x)
        elif launch[0] in GRAPH_LAUNCH_CALLS:
            _uncount(apart, GRAPH_REPLAY, x)
        elif launch[1] is None:
            _uncount(apart, NO_OPERATOR, x)
        else:
            by_op[launch[1][0]].append((launch[1][1], cls, x))
    unmatched = 0
    for launched in by_op.values():
        op = launched[0][0]
        try:
            parts = work.op_work(op)
        except work.Unmodeled as e:
            for _, _, x in launched:
                _uncount(apart, str(e), x)
            continue
        classes_us = defaultdict(float)
        for _, cls, x in launched:
            classes_us[cls] += x
        got, left = _credit(parts, classes_us)
        unmatched += bool(left)
        for cls, (flops, nbytes, precisions) in got.items():
            rows[cls]["flops"] += flops
            rows[cls]["bytes"] += nbytes
            rows[cls]["precisions"] |= precisions
        for _, cls, x in launched:
            if cls in got:
                rows[cls]["counted_us"] += x
            else:
                _uncount(apart, f"not in the work model of {op.name} (layout conversions, workspace fills)", x)
    return {"classes": rows, "not_counted": apart, "unmatched_operators": unmatched}


def layer_work(t: Trace, model: dict[str, Any]) -> dict[str, Any]:
    """Each class's work from the model's layers (work.model_work, per step), matched to the trace's class
    times: every kernel of a class counts as the class's time. Same shape as operator_work."""
    evs, classes, excl = _window(t)
    steps = len(t.steps)
    rows = {c: {"us": 0.0, "count": 0, "counted_us": 0.0, "flops": 0, "bytes": 0, "precisions": set()} for c in classes}
    for cls, x in zip(classes, excl):
        rows[cls]["us"] += x
        rows[cls]["count"] += 1
    apart = {}
    for cls, w in model["classes"].items():
        if cls not in rows:
            _uncount(apart, f"{cls}: the model's work has no kernel of its class in the trace", 0.0, 0)
            continue
        rows[cls].update(flops=w["flops"] * steps, bytes=w["bytes"] * steps, counted_us=rows[cls]["us"])
        rows[cls]["precisions"] = {model["precision"]} if w["flops"] else set()
    return {"classes": rows, "not_counted": apart, "unmatched_operators": 0}


def limit_row(
    us: float, counted_us: float, flops: float, nbytes: float, precisions: set[str], peaks: dict[str, Any] | None
) -> dict[str, Any]:
    """One class's roofline (per step): achieved rates, the peaks, the floor (the least time its work can take
    at the peaks), the limit that binds, the share of it reached (floor / time) and the time above the floor.
    The share is null with the reason where no work was counted, no peak applies, or it would exceed 1."""
    row = {"us": us, "counted_us": counted_us, "flops": flops, "bytes": nbytes, "precision": None}
    row.update(achieved_tflops=None, achieved_gbps=None, peak_tflops=None, peak_gbps=None)
    row.update(floor_us=None, limit=None, of_limit=None, above_floor_us=None, null_reason=None)
    if not counted_us or not (flops or nbytes):
        row["null_reason"] = NO_CLASS_WORK
        return row
    row["achieved_tflops"] = flops / counted_us / 1e6 if flops else None
    row["achieved_gbps"] = nbytes / counted_us / 1e3 if nbytes else None
    if peaks is None:
        row["null_reason"] = "no peaks known for this GPU"
        return row
    known = [p for p in precisions if peaks.get(p)]
    if flops and known:
        row["precision"] = max(known, key=lambda p: peaks[p])  # mixed precisions: the highest ceiling
        row["peak_tflops"] = peaks[row["precision"]]
    row["peak_gbps"] = peaks["memory_tb_per_s"] * 1e3
    if flops and not row["peak_tflops"]:
        row["null_reason"] = f"no compute peak for its precision ({', '.join(sorted(precisions)) or 'unknown'})"
        return row
    compute_us = flops / (row["peak_tflops"] * 1e6) if flops else 0.0
    memory_us = nbytes / (row["peak_gbps"] * 1e3)
    floor = max(compute_us, memory_us)
    row.update(floor_us=floor, limit="compute" if compute_us >= memory_us else "memory")
    if floor > counted_us:
        row["null_reason"] = (
            f"its work would take {floor:.1f} us at the {row['limit']} peak, more than the {counted_us:.1f} us "
            "it took: the work count or the peak is wrong"
        )
        return row
    row.update(of_limit=floor / counted_us, above_floor_us=counted_us - floor)
    return row


def absent(name: str | None, reason: str | None) -> dict[str, Any]:
    """A roofline in roofline's shape with no classes (yet), null_reason saying why."""
    out = {"trace": name, "gpu": None, "source": None, "steps": None, "peaks": None, "classes": None}
    out.update(total=None, not_counted={}, notes=[], null_reason=reason, damage=[], damage_withheld=None)
    return out


def roofline(t: Trace, ops: Operators, gpu: str | None, model: Any = None, name: str = "trace") -> dict[str, Any]:
    """The roofline of a trace's steps, per step (docs/KERNELS.md#the-roofline-by-kernel-class).

    model: the model's work (work.model_work's dict, or a function of no argument that returns it), used where
    the steps are CUDA-graph replays; without it their kernels are counted apart. Returns {"trace", "gpu",
    "source" ("operators" or "model"), "steps", "peaks", "classes": {class: limit_row + "kernels"}, "total",
    "not_counted": {reason: {"kernels", "us"}} per step, "notes", "null_reason", "damage" (the reader's, as
    summarize reports it), "damage_withheld"}; on a trace without GPU events, or one damaged where the classes
    are read (a step, a launch or a GPU event: Damage.withheld), classes is null and null_reason says why."""
    out = absent(name, None)
    out.update(gpu=gpu, steps=len(t.steps), damage=t.damage.report(), damage_withheld=t.damage.withheld())
    if out["damage_withheld"]:
        out["null_reason"] = f"{WITHHELD}: {out['damage_withheld']}"
        return out
    if not t.gpu:
        out["null_reason"] = f"no roofline: {NO_GPU}"
        return out
    if not t.steps:
        raise TraceError(f"{name}: no ProfilerStep#N slices: was it written by torch.profiler with a schedule?")
    found, out["source"] = operator_work(t, ops), "operators"
    if model is not None and GRAPH_REPLAY in found["not_counted"]:
        found, out["source"] = layer_work(t, model() if callable(model) else model), "model"
        out["notes"].append(MODEL_TIME)
    peaks = PEAKS.get(gpu)
    if peaks:
        out["peaks"] = {k: peaks[k] for k in ("model", "fp32", "tf32", "bf16", "memory_tb_per_s", "source")}
        out["peaks"]["memory_source"] = peaks["memory_source"]
    else:
        out["notes"].append(
            f"no peaks known for GPU {gpu!r} (flops.PEAKS holds {', '.join(sorted(PEAKS))}): give --gpu"
        )
    steps, classes = len(t.steps), {}
    for cls in kernels.CLASSES:
        r = found["classes"].get(cls)
        if r:
            per = [r[k] / steps for k in ("us", "counted_us", "flops", "bytes")]
            classes[cls] = {"kernels": r["count"] / steps, **limit_row(*per, r["precisions"], peaks)}
    out["classes"] = classes
    floors = [c["floor_us"] for c in classes.values() if c["of_limit"] is not None]
    out["total"] = {
        "us": sum(c["us"] for c in classes.values()),
        "counted_us": sum(c["counted_us"] for c in classes.values() if c["of_limit"] is not None),
        "floor_us": sum(floors),
    }
    out["not_counted"] = {
        k: {"kernels": v["kernels"] / steps, "us": v["us"] / steps} for k, v in found["not_counted"].items()
    }
    if found["unmatched_operators"]:
        out["notes"].append(f"{found['unmatched_operators']} operators' work found no kernel of its class: not counted")
    out["notes"].append(BYTES_NOTE)
    if not floors and not any(c["flops"] or c["bytes"] for c in classes.values()):
        largest = max(out["not_counted"].items(), key=lambda kv: kv[1]["us"], default=(NO_WORK, None))[0]
        out["null_reason"] = f"no roofline: {NO_WORK} ({largest})"
    return out


def roofline_section(
    source: str | Iterable[Any], gpu: str | None = None, model: Any = None, name: str | None = None
) -> dict[str, Any]:
    """The roofline of one trace: source is a trace's path (its GPU read from the trace's deviceProperties unless
    gpu is given) or its events. The trace is read as summarize reads it (read_with_operators). See roofline for
    what it returns."""
    if isinstance(source, str):
        meta, path = {}, source
        t, ops = read_with_operators(lambda: iter_events(path, meta=meta))
        gpu, name = gpu or device_of(meta), name or path
    else:
        events = source if isinstance(source, (list, tuple)) else list(source)
        t, ops = read_with_operators(lambda: events)
    return roofline(t, ops, gpu, model, name or "trace")


def _cell(value, fmt):
    return "-" if value is None else fmt.format(value)


COLUMNS = [  # header, getter, format
    ("ms/step", lambda c: c["us"] / 1e3, "{:.3f}"),
    ("counted ms", lambda c: c["counted_us"] / 1e3, "{:.3f}"),
    ("GFLOP", lambda c: c["flops"] / 1e9 if c["flops"] else None, "{:.1f}"),
    ("MB", lambda c: c["bytes"] / 1e6 if c["bytes"] else None, "{:.1f}"),
    ("TFLOP/s", lambda c: c["achieved_tflops"], "{:.1f}"),
    ("GB/s", lambda c: c["achieved_gbps"], "{:.0f}"),
    ("limit", lambda c: c["limit"] and f"{c['limit']}{' ' + c['precision'] if c['limit'] == 'compute' else ''}", "{}"),
    ("floor ms", lambda c: c["floor_us"] / 1e3 if c["of_limit"] is not None else None, "{:.3f}"),
    ("of limit", lambda c: c["of_limit"], "{:.1%}"),
    ("above floor ms", lambda c: c["above_floor_us"] / 1e3 if c["above_floor_us"] is not None else None, "{:.3f}"),
]


def format_roofline(r: dict[str, Any], damage: bool = True) -> str:
    """The roofline of one trace as a text table, its peaks, and what was not counted and why; damage: with
    a line per kind of damage the reader found (summarize prints its own)."""
    head = [f"roofline by kernel class: {r['trace']}"] + (damage_lines(r) if damage else [])
    if r["classes"] is None or r["null_reason"]:
        return "\n".join(head + [r["null_reason"]]) + "\n"
    p = r["peaks"]
    source = "the trace's operators and their shapes" if r["source"] == "operators" else "the model's layers"
    lines = head + [f"work from {source}; mean per step of {r['steps']} steps"]
    if p:
        lines.append(
            f"{r['gpu']} ({p['model']}): dense bf16 {p['bf16']}, tf32 {p['tf32']}, fp32 {p['fp32']} TFLOP/s; "
            f"memory {p['memory_tb_per_s']} TB/s (flops.PEAKS: NVIDIA's datasheets)"
        )
    width = max(len(c) for c in r["classes"]) + 2
    rows = [[cls] + [_cell(get(c), fmt) for _, get, fmt in COLUMNS] for cls, c in r["classes"].items()]
    t = r["total"]
    rows.append(
        ["total", f"{t['us'] / 1e3:.3f}", f"{t['counted_us'] / 1e3:.3f}"]
        + [""] * 5
        + [f"{t['floor_us'] / 1e3:.3f}", "", ""]
    )
    widths = [width] + [max(len(h), *(len(row[i + 1]) for row in rows)) + 2 for i, (h, _, _) in enumerate(COLUMNS)]
    lines.append(
        "".join(
            h.rjust(w) if i else h.ljust(w)
            for i, (h, w) in enumerate(zip(["class"] + [h for h, _, _ in COLUMNS], widths))
        )
    )
    lines += ["".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))) for row in rows]
    for cls, c in r["classes"].items():
        if c["null_reason"] and c["null_reason"] != NO_CLASS_WORK:
            lines.append(f"{cls}: {c['null_reason']}")
    for reason, n in sorted(r["not_counted"].items(), key=lambda kv: -kv[1]["us"]):
        lines.append(f"not counted: {n['us'] / 1e3:.3f} ms/step, {n['kernels']:.0f} kernels: {reason}")
    lines += r["notes"]
    return "\n".join(lines) + "\n"


def run_settings(trace: str) -> dict[str, Any]:
    """The settings of the run that wrote trace (its run.json: outputs/traces/X -> outputs/run.json), or {}."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(trace))), "run.json")
    try:
        with open(path) as f:
            settings = json.load(f).get("settings")
    except (OSError, ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def load_builder(spec: str) -> Any:
    """MODULE:FUNCTION (train:build_model), imported with the current folder first on the path."""
    module, _, function = spec.partition(":")
    if not module or not function:
        raise ValueError(f"--model {spec!r}: expected MODULE:FUNCTION, e.g. train:build_model")
    try:
        import torch  # noqa: F401  the model's layers are counted on torch's meta device
    except ImportError as e:
        raise ValueError(f"--model needs torch, which is not installed here: pip install torch ({e})") from e
    sys.path.insert(0, os.getcwd())
    try:
        builder = getattr(importlib.import_module(module), function, None)
    except ImportError as e:
        raise ValueError(f"--model {spec!r}: cannot import {module} ({e})") from e
    finally:
        sys.path.pop(0)
    if not callable(builder):
        raise ValueError(f"--model {spec!r}: {module} has no function {function}")
    return builder


def model_for(trace: str, builder: Any, batch: int | None, amp: str | None) -> Any:
    """A function giving the model's work for this trace's steps (batch, amp and momentum from the flags, else
    the run.json beside the trace); it raises ValueError where the batch size is unknown."""
    settings = run_settings(trace)
    batch = batch or settings.get("batch_size")
    amp = amp or settings.get("amp") or "off"
    momentum = settings.get("momentum")

    def work_of():
        if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
            raise ValueError(
                f"{trace}: a CUDA-graph step needs its batch size: no run.json with one, give --batch-size"
            )
        return work.model_work(builder, batch, amp, momentum)

    return work_of


def _check(args):
    """The flags and files, checked before any trace is read: one line for the first problem, or None."""
    for t in args.traces:
        if not os.path.isfile(t):
            return f"{t}: {'is a folder: give the trace files in it' if os.path.isdir(t) else 'no such trace'}"
    if args.batch_size is not None and args.batch_size <= 0:
        return f"--batch-size must be a positive integer, got {args.batch_size}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens roofline", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", metavar="TRACE", help="PyTorch profiler Chrome traces (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print one JSON object per trace, one per line")
    p.add_argument("--gpu", default=None, help="the GPU's name as flops.PEAKS keys it (default: the trace's own)")
    p.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FUNCTION",
        help="for CUDA-graph steps, whose trace has no operators: the function that builds the model, imported "
        "from the current folder (the companion's: train:build_model) (default: none; such kernels are counted apart)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="with --model (default: the run.json beside the trace)")
    p.add_argument("--amp", choices=["off", "bf16"], default=None, help="with --model (default: the run.json's)")
    args = p.parse_args(argv)
    problem = _check(args)
    try:
        builder = load_builder(args.model) if args.model and not problem else None
    except ValueError as e:
        problem = str(e)
    if problem:
        say(f"steplens roofline: error: {problem}", sys.stderr)
        return 2
    try:
        found = [
            roofline_section(t, args.gpu, model_for(t, builder, args.batch_size, args.amp) if builder else None)
            for t in args.traces
        ]
    except (TraceError, ValueError) as e:
        say(f"steplens roofline: error: {e}", sys.stderr)
        return 1
    for r in found:
        write(json.dumps(r, sort_keys=True) + "\n" if args.json else format_roofline(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
