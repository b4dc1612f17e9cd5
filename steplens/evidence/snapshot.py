"""steplens snapshot: what a CUDA memory snapshot holds at its peak, in text, without torch.

    steplens snapshot memory-snapshot.pickle            # the summary, also written beside it (.summary.txt)
    steplens snapshot memory-snapshot.pickle --json     # the same figures as one JSON object
    steplens snapshot memory-snapshot.pickle --top 30   # more groups (default: 15)

Reads the pickle torch.cuda.memory._snapshot() returns (train.py --memory-snapshot writes one): `segments`
(each with `device` and `blocks` of `size`, `state` and the allocating `frames`) and `device_traces` (per
device, the allocator's history: `alloc`, `free_requested`, `free_completed`, ... each with `addr`, `size`
and, for allocations, `frames` of `filename`, `line`, `name`). Per device: the peak of the memory in use over
the recorded history, and the blocks live at that peak grouped by the Python line that allocated them, each
group classed (parameters, backward, optimizer state, activations, the input) where its frames tell it.
docs/MEMORY.md defines every figure. pytorch.org/memory_viz draws the same file.
"""

import argparse
import gzip
import json
import os
import pickle
import sys
import zlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from steplens.atomic import write_atomic

# A block in use, or freed and waiting on another stream: torch writes "active_pending_free" (its docstring says
# "active_awaiting_free"; both are read).
ACTIVE = ("active_allocated", "active_pending_free", "active_awaiting_free")
NO_STACK = "(no Python stack)"
BEFORE_HISTORY = "(allocated before the recorded history, freed in it: no stack kept)"
OTHER = "other"
TOP = 15
BACKWARD = "backward"  # gradients and backward's temporaries
CLASSES = ("parameters", BACKWARD, "optimizer state", "activations", "the input", OTHER)
INPUT_FILES = ("steplens/speedups/prefetch.py", "steplens/speedups/gpu_input.py")
PARAMETER_CALLS = {"_apply", "to", "cuda", "convert", "to_empty"}  # Module.to and its helpers
COUNTING = (
    "a block counts the bytes its tensor asked for, from its alloc to its free_completed (memory_viz's Active "
    "Memory Timeline): a block freed while another stream still uses it counts until that use ends; "
    "torch.cuda.max_memory_allocated counts the allocator's blocks instead (each request rounded up to 512 bytes, "
    "or a cached block it did not split), so this peak, less the blocks waiting on a stream, is at most torch's"
)


class SnapshotError(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """A snapshot holds dicts, lists, strings and numbers alone: any class or function in the file is refused,
    so reading one runs no code from it."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(f"it names {module}.{name}: a memory snapshot holds plain values only")


def load(path: str) -> dict[str, Any]:
    """The snapshot dict of a pickle written by torch.cuda.memory._snapshot(); SnapshotError if it is not one."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"  # a gzip-compressed pickle (.pickle.gz) is read the same way
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
            data = _PlainUnpickler(f).load()
            if gzipped:
                f.read()  # to the end of the member: gzip checks its CRC and length there
    except SnapshotError as e:
        raise SnapshotError(f"{path} is no memory snapshot: {e}") from None
    except (OSError, pickle.UnpicklingError, EOFError, zlib.error, ValueError, TypeError, IndexError, KeyError) as e:
        raise SnapshotError(f"{path} is not a readable pickle: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise SnapshotError(f"{path} is no memory snapshot: no list of segments (torch.cuda.memory._snapshot())")
    if not isinstance(data.get("device_traces", []), list):
        raise SnapshotError(f"{path} is no memory snapshot: device_traces is not a list")
    return data


def _is_torch(filename: str) -> bool:
    return "/torch/" in filename.replace("\\", "/")


def _short(filename: str) -> str:
    """A frame's file as people name it: from site-packages, from steplens/, or its base name."""
    f = filename.replace("\\", "/")
    for mark in ("site-packages/", "dist-packages/"):
        if mark in f:
            return f.split(mark, 1)[1]
    if "/steplens/" in f:
        return "steplens/" + f.rsplit("/steplens/", 1)[1]
    return os.path.basename(f)


def line_of(frames: list[dict[str, Any]] | None) -> str:
    """The Python line that allocated a block: the innermost frame outside torch's own package (the model's or
    the script's line that asked for the tensor), else the innermost frame; `file:line function`."""
    if frames is None:
        return BEFORE_HISTORY
    if not frames:
        return NO_STACK
    frame = next((f for f in frames if not _is_torch(str(f.get("filename", "")))), frames[0])
    return f"{_short(str(frame.get('filename', '?')))}:{frame.get('line', '?')} {frame.get('name', '?')}"


def _frame_class(filename: str, name: str) -> str | None:
    f = filename.replace("\\", "/")
    if "/torch/optim/" in f:
        return "optimizer state"
    if f.endswith("torch/nn/modules/module.py") and name in PARAMETER_CALLS:
        return "parameters"
    if name == "backward" and (f.endswith("torch/_tensor.py") or "/torch/autograd/" in f):
        return BACKWARD
    if "/torch/nn/" in f:
        return "activations"
    if name == "to_device" or f.endswith(INPUT_FILES):
        return "the input"
    return None


def class_of(frames: list[dict[str, Any]] | None) -> str:
    """What a block is, read from its frames innermost first: the first frame a rule knows decides
    (torch.optim: optimizer state; Module.to: parameters; backward: backward; torch.nn: activations;
    the step's copy to the device or the device-side input: the input); else "other". A block with no Python
    stack at all is backward's too: on a GPU, autograd runs the backward pass on its own thread, which has no
    Python frames, so the gradients and backward's temporaries are allocated there."""
    if frames == []:
        return BACKWARD
    for f in frames or []:
        found = _frame_class(str(f.get("filename", "")), str(f.get("name", "")))
        if found:
            return found
    return OTHER


def _events(trace: Iterable[Any]) -> list[tuple[str, int, int, Any, Any]]:
    """(action, addr, size, frames, time_us) of the history's allocations, requested and completed frees, in order.
    An entry's size is the size its tensor asked for (the allocator records orig_size, not the block's)."""
    out = []
    for e in trace:
        if isinstance(e, dict) and e.get("action") in ("alloc", "free_requested", "free_completed"):
            if not isinstance(e.get("addr"), int) or not isinstance(e.get("size"), int):
                raise SnapshotError(f"a history entry without an integer addr and size: {str(e)[:120]}")
            out.append((e["action"], e["addr"], e["size"], e.get("frames"), e.get("time_us")))
    return out


def _active_blocks(snapshot: dict[str, Any], device: int) -> Iterable[dict[str, Any]]:
    for seg in snapshot["segments"]:
        if seg.get("device", 0) == device:
            yield from (b for b in seg.get("blocks", []) if b.get("state") in ACTIVE)


def live_at_end(snapshot: dict[str, Any], device: int) -> dict[int, tuple[int, Any]]:
    """{address: (size, frames)} of the device's blocks in use when the snapshot was taken: the size its tensor
    asked for (requested_size; the block's size where a snapshot has none), as the history counts it."""
    return {
        int(b["address"]): (int(b.get("requested_size", b["size"])), b.get("frames", []))
        for b in _active_blocks(snapshot, device)
    }


def replay(snapshot: dict[str, Any], device: int) -> dict[str, Any]:
    """The device's memory in use over its recorded history, and the blocks live at its peak.

    The history may start after blocks were made (the recording began late, or its ring buffer dropped the
    oldest entries): the blocks live at its start are found by undoing it from the snapshot's end state, as
    memory_viz does. An alloc of a block the end state has no trace of, or a free of one already there, is
    counted in `mismatches` (the figures then rest on a history with gaps)."""
    trace = snapshot.get("device_traces", [])
    events = _events(trace[device] if device < len(trace) else [])
    end = live_at_end(snapshot, device)
    # 1) undo the history from the end state: the blocks live at its start
    live, mismatches = {a: (s, fr) for a, (s, fr) in end.items()}, 0
    for action, addr, size, _, _ in reversed(events):
        if action == "free_requested":
            continue
        if action == "alloc":
            if live.pop(addr, None) is None:
                mismatches += 1
        elif addr in live:
            mismatches += 1
        else:
            live[addr] = (size, None)  # freed in the history: its allocation's stack is not in it
    start = dict(live)
    # 2) replay it forwards: the total after each event, and the event after which it peaks
    total = sum(s for s, _ in start.values())
    start_total, peak, peak_at, sizes = total, total, -1, {a: s for a, (s, _) in start.items()}
    # blocks whose free was requested and waits on a stream's use; a block whose first event in the history is its
    # free_completed had its free requested before the history began: it is pending from the start
    first = {}
    for action, addr, _, _, _ in events:
        first.setdefault(addr, action)
    pending = {a: s for a, s in sizes.items() if first.get(a) == "free_completed"}
    pending_at_peak = sum(pending.values())
    for i, (action, addr, size, _, _) in enumerate(events):
        if action == "free_requested":
            pending[addr] = sizes.get(addr, size)
            continue
        if action == "alloc":
            sizes[addr] = size
            total += size
        else:
            pending.pop(addr, None)
            total -= sizes.pop(addr, size)
        if total > peak:
            peak, peak_at, pending_at_peak = total, i, sum(pending.values())
    # 3) the blocks live at the peak
    live = dict(start)
    for action, addr, size, frames, _ in events[: peak_at + 1]:
        if action == "free_requested":
            continue
        if action == "alloc":
            live[addr] = (size, frames)
        else:
            live.pop(addr, None)
    times = [t for *_, t in events if isinstance(t, (int, float))]
    return {
        "events": sum(action != "free_requested" for action, *_ in events),
        "history_entries": len(trace[device]) if device < len(trace) else 0,
        "history_ms": (max(times) - min(times)) / 1e3 if len(times) > 1 else None,
        "mismatches": mismatches,
        "start_bytes": start_total,
        "end_bytes": total,
        "peak_bytes": peak,
        "pending_free_at_peak_bytes": pending_at_peak,
        "peak_after_event": sum(a != "free_requested" for a, *_ in events[: peak_at + 1]) - 1 if peak_at >= 0 else None,
        "peak_time_us": events[peak_at][4] if peak_at >= 0 else None,
        "live_at_peak": live,
        "blocks_at_end": len(end),
        "end_state_bytes": sum(s for s, _ in end.values()),
        "end_state_block_bytes": sum(int(b["size"]) for b in _active_blocks(snapshot, device)),
    }


def devices_of(snapshot: dict[str, Any]) -> list[int]:
    """The devices the snapshot holds segments or history of."""
    found = {int(seg.get("device", 0)) for seg in snapshot["segments"]}
    found |= {i for i, t in enumerate(snapshot.get("device_traces") or []) if t}
    return sorted(found)


def summarize_device(snapshot: dict[str, Any], device: int, top: int = TOP) -> dict[str, Any]:
    """One device's figures (bytes): the peak in use, and its blocks grouped by allocating line and classed."""
    r = replay(snapshot, device)
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for size, frames in r.pop("live_at_peak").values():
        g = groups[(class_of(frames), line_of(frames))]
        g[0] += size
        g[1] += 1
        g[2] = max(g[2], size)
    rows = [
        {"class": c, "line": line, "bytes": b, "blocks": n, "largest_block_bytes": big}
        for (c, line), (b, n, big) in sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    ]
    by_class = {c: sum(row["bytes"] for row in rows if row["class"] == c) for c in CLASSES}
    rest = rows[top:]
    reserved = sum(int(s.get("total_size", 0)) for s in snapshot["segments"] if s.get("device", 0) == device)
    return {
        "device": device,
        **r,
        "reserved_at_end_bytes": reserved,
        "by_class": {c: b for c, b in by_class.items() if b},
        "groups": rows[:top],
        "rest": {"groups": len(rest), "bytes": sum(g["bytes"] for g in rest), "blocks": sum(g["blocks"] for g in rest)},
        "counting": COUNTING,
    }


def summarize(snapshot: dict[str, Any], top: int = TOP) -> dict[str, Any]:
    """Every device's figures; the invariant: on each, the groups (and the rest) sum to the peak, as do the classes."""
    return {"devices": [summarize_device(snapshot, d, top) for d in devices_of(snapshot)]}


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def format_summary(summary: dict[str, Any], name: str) -> str:
    """The summary as text: per device the peak, the classes, then the groups largest first."""
    lines = [f"memory snapshot {name} (MB = 10^6 bytes)"]
    if not summary["devices"]:
        lines.append("no device: the snapshot holds no segment and no history (was CUDA memory used?)")
    for d in summary["devices"]:
        span = f" over {d['history_ms']:.1f} ms" if d["history_ms"] is not None else ""
        lines += [
            "",
            f"cuda:{d['device']}: peak in use {_mb(d['peak_bytes'])} ({d['events']} allocations and completed frees "
            f"of {d['history_entries']} history entries{span}; {_mb(d['start_bytes'])} at the history's start, "
            f"{_mb(d['end_bytes'])} at its end, "
            f"{_mb(d['reserved_at_end_bytes'])} reserved at the snapshot)",
        ]
        if d["mismatches"]:
            lines.append(f"warning: {d['mismatches']} events do not match the end state: the history has gaps")
        classes = ", ".join(f"{c} {_mb(b)}" for c, b in d["by_class"].items())
        lines.append(f"at the peak, by class: {classes or 'nothing in use'}")
        lines.append(f"{'MB':>9} {'blocks':>6} {'largest MB':>10}  {'class':<16} line that allocated them")
        for g in d["groups"]:
            lines.append(
                f"{g['bytes'] / 1e6:9.1f} {g['blocks']:6d} {g['largest_block_bytes'] / 1e6:10.1f}  "
                f"{g['class']:<16} {g['line']}"
            )
        if d["rest"]["groups"]:
            r = d["rest"]
            lines.append(f"{r['bytes'] / 1e6:9.1f} {r['blocks']:6d} {'':>10}  {'':<16} ({r['groups']} smaller groups)")
        lines.append(f"counting: {d['counting']}")
    return "\n".join(lines) + "\n"


def summary_path(path: str) -> str:
    """The summary's file beside the snapshot: memory-snapshot.pickle (or .pickle.gz) -> memory-snapshot.summary.txt."""
    base = path[: -len(".gz")] if path.endswith(".gz") else path
    base = base[: -len(".pickle")] if base.endswith(".pickle") else base
    return base + ".summary.txt"


def write_summary(path: str, top: int = TOP) -> tuple[str, dict[str, Any]]:
    """Read the snapshot at path, write its summary beside it (atomically); the summary's path and figures."""
    try:
        summary = summarize(load(path), top)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a dict of the right shape, wrong contents
        raise SnapshotError(f"{path}: a segment or block lacks a field a snapshot has ({e!r})") from None
    out = write_atomic(summary_path(path), format_summary(summary, os.path.basename(path)))
    return out, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens snapshot", description=__doc__.split("\n")[0])
    p.add_argument(
        "snapshot",
        help="a pickled torch.cuda.memory._snapshot() (train.py --memory-snapshot), gzip-compressed or not; the "
        "summary is printed and "
        "written beside it (FILE.summary.txt)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object (default: text)")
    p.add_argument("--top", type=int, default=TOP, help=f"groups listed, largest first (default: {TOP})")
    args = p.parse_args(argv)
    if args.top < 1:
        print(f"steplens snapshot: error: --top must be >= 1, got {args.top}", file=sys.stderr)
        return 2
    if not os.path.isfile(args.snapshot):
        print(f"steplens snapshot: error: {args.snapshot} is not a file", file=sys.stderr)
        return 2
    try:
        out, summary = write_summary(args.snapshot, args.top)
    except SnapshotError as e:
        print(f"steplens snapshot: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        sys.stdout.write(format_summary(summary, os.path.basename(args.snapshot)))
        print(f"summary: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
