"""What is wrong with a trace: each kind of damage counted while reading, with an example and what was done.

A trace the profiler wrote has none of these. Traces that were edited, concatenated, cut or converted do. The
reader skips what it cannot read and removes exact duplicates; the evidence says so in one line per kind, and
withholds the verdict where the damage touches what the verdict reads (docs/DAMAGE.md)."""

import bisect
import json
import math
import statistics
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from steplens.scopes import KNOWN
from steplens.text import has_control, is_control
from steplens.trace.spill import SortedRecords

# kind: (what it is, what the reader did)
KINDS = {
    "non_object": ("entries of traceEvents that are not objects", "skipped"),
    "missing_field": ("complete events without a name, ts or dur", "skipped"),
    "wrong_type": ("complete events with a field of the wrong type (name, pid, tid or args)", "skipped"),
    "non_numeric": ("complete events whose ts or dur is not a number", "skipped"),
    "string_number": ("complete events whose ts or dur is a number written as a string", "read as numbers"),
    "non_finite": ("complete events whose ts or dur is NaN or infinite", "skipped"),
    "negative_duration": ("complete events with a negative dur", "skipped"),
    "far_outside": (
        f"complete events more than {3600:,} s from the median start of the trace's first events",
        "skipped",
    ),
    "duplicate": ("complete events written twice (same name, track, start, duration and ids)", "removed"),
    "duplicate_memory": ("[memory] events written twice (same device, time and totals)", "read once"),
    "unreadable_memory": (
        "[memory] events without a finite time, or with a byte count or total that is no number within 64 bits",
        "skipped",
    ),
    "repeated_step": ("ProfilerStep#N numbers carried by more than one slice", "kept"),
    "overlapping_steps": ("ProfilerStep slices that overlap the next step", "kept"),
    "unreadable_step": (
        "ProfilerStep slices whose name is not ProfilerStep#N (a control character, no number)",
        "left out",
    ),
    "empty_step": ("ProfilerStep slices of zero length", "left out"),
    "step_in_ns": (
        "ProfilerStep slices about 1000 times as long as their siblings while their own events are not (a length "
        "written in ns, read as µs)",
        "left out of the steps: their events read as outside every step; the other steps' figures stand",
    ),
    "unprintable_name": (
        "complete events whose name holds a control character or a lone surrogate",
        "kept, printed escaped; a kernel's name only labels its class",
    ),
    "step_past_capture": ("ProfilerStep slices that reach past the profiler's capture (it ended mid-step)", "kept"),
    "gpu_outside_capture": ("GPU events outside the profiler's capture, or longer than it", "kept"),
    "capture_cut": ("captures whose launch calls stop before their last step ends (their end lost its events)", "kept"),
    "no_correlation": (
        "GPU events without a correlation id (the id that ties each to its launch: a converted or edited trace)",
        "placed by the clock; where launches are left unmatched, they are said to be, not dropped by the profiler",
    ),
    "gpu_stops_early": (
        "kernel launch calls after the GPU's last event ends, with no GPU record (the GPU's events stop before the "
        "launches do: the end lost its GPU events)",
        "kept",
    ),
    "window_past_capture": (
        "traces without steps whose CPU events reach past the profiler's capture (the one window they are read as "
        "is longer than the capture)",
        "kept",
    ),
    "repeated_gpu_record": (
        "GPU events that carry the correlation id of another GPU event of the same launch, a launch that is no graph "
        "launch (a record written twice, its start shifted)",
        "kept",
    ),
    "thin_step": (
        "ProfilerStep slices with under half the kernel launches of their busiest sibling (events lost, or a step "
        "that does other work: gradient accumulation, validation)",
        "kept: named, not withheld, since a sound loop can have such steps",
    ),
    "several_captures": ("capture spans beyond the first (two captures merged into one file)", "refused"),
    "several_processes": (
        "CPU processes beyond the first (two processes' traces merged into one file)",
        "refused",
    ),
    "capture_missing": (
        "profiler exports without the profiler's capture span, among the last events it writes (the end is lost)",
        "read as they are",
    ),
}

# What the verdict would have needed, for the kinds that withhold it (damage_withheld says it).
NEEDS = {
    "unreadable_step": "every step of the capture",
    "empty_step": "every step's length",
    "unprintable_name": "the names of the steps, the scopes and the launches",
    "step_past_capture": "whole steps",
    "gpu_outside_capture": "the GPU's busy time, which such an event fills",
    "capture_cut": "every step's launches and GPU work",
    "no_correlation": "each GPU event's correlation id, which ties it to the launch and the step it belongs to",
    "gpu_stops_early": "the GPU's events of every launch",
    "window_past_capture": "a window inside the capture, since its length divides every share",
    "repeated_gpu_record": "one GPU record per launch, since a second one adds busy time",
    "thin_step": "every step's launches and GPU work",
    "several_captures": "one capture, read alone",
    "several_processes": "one process, read alone",
    "capture_missing": "every event of the capture, and an export cut short loses the last ones",
}


# The categories the figures and the verdict are read from: steps and scopes, the GPU's events, the launches.
FIGURE_CATS = frozenset(
    ("user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")
)


FAR_US = 3600e6  # an event this far from the median of the trace's first events belongs to no capture of it
ANCHOR_EVENTS = 1001  # how many complete events fix the trace's time before the rest are checked against it


def _example(ev: Any) -> str:
    try:
        text = json.dumps(ev, sort_keys=True, allow_nan=True, default=str)
    except (TypeError, ValueError):
        text = repr(ev)
    return text if len(text) <= 160 else text[:157] + "..."


class Damage:
    """Counts of each kind of damage, the first example of each, and how many touch the figures."""

    def __init__(self):
        self.counts, self.examples, self.touching = {}, {}, {}

    def add(self, kind: str, ev: Any, touches: bool) -> None:
        if kind not in self.counts:
            self.counts[kind], self.touching[kind] = 0, 0
            self.examples[kind] = _example(ev)
        self.counts[kind] += 1
        self.touching[kind] += bool(touches)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def report(self) -> list[dict[str, Any]]:
        """One entry per kind found, in KINDS' order: kind, count, what it is, what was done, an example."""
        return [
            {
                "kind": kind,
                "count": self.counts[kind],
                "what": KINDS[kind][0],
                "action": KINDS[kind][1],
                "touches_figures": self.touching[kind],
                "example": self.examples[kind],
            }
            for kind in KINDS
            if kind in self.counts
        ]

    def withheld(self) -> str | None:
        """Why the verdict cannot be trusted, or None: damage that changes what the figures read.

        Duplicates (removed exactly), numbers written as strings (read as numbers) and entries that are no
        events change nothing; any other damage to a step, a scope, a launch or a GPU event does.
        """
        harmless = {"duplicate", "string_number", "non_object", "duplicate_memory", "unreadable_memory"}
        hits = [
            f"{self.touching[k]} {KINDS[k][0]}" + (f": the verdict needs {NEEDS[k]}" if k in NEEDS else "")
            for k in KINDS
            if k not in harmless and self.touching.get(k)
        ]
        return "; ".join(hits) or None


def _number(value: Any) -> tuple[float | None, str | None]:
    """A ts or dur as a float, and the damage it carries (None when it is a plain finite number)."""
    if isinstance(value, bool) or value is None:
        return None, "non_numeric"
    if isinstance(value, (int, float)):
        v, kind = float(value), None
    elif isinstance(value, str):
        try:
            v, kind = float(value), "string_number"
        except ValueError:
            return None, "non_numeric"
    else:
        return None, "non_numeric"
    return (v, kind) if math.isfinite(v) else (None, "non_finite")


def figure_cat(ev: dict[str, Any]) -> bool:
    """Whether the event's cat is one a figure reads (a cat of any other JSON type, a list say, is none)."""
    cat = ev.get("cat")
    return type(cat) is str and cat in FIGURE_CATS


def check_complete(ev: dict[str, Any], damage: Damage) -> tuple[float, float] | None:
    """(start, duration) of a complete event in µs, or None after counting why it cannot be read."""
    touches = figure_cat(ev) or "cat" not in ev
    if "ts" not in ev or "dur" not in ev or "name" not in ev:
        damage.add("missing_field", ev, touches)
        return None
    if (
        not isinstance(ev["name"], str)
        or not isinstance(ev.get("args", {}), dict)
        or not all(isinstance(ev.get(k), (int, str, type(None))) for k in ("pid", "tid"))
    ):
        damage.add("wrong_type", ev, touches)
        return None
    (ts, ts_kind), (dur, dur_kind) = _number(ev["ts"]), _number(ev["dur"])
    bad = [k for k in (ts_kind, dur_kind) if k and k != "string_number"]
    if bad:
        damage.add(bad[0], ev, touches)
        return None
    if dur < 0:
        damage.add("negative_duration", ev, touches)
        return None
    name = ev["name"]
    if has_control(name) and not name.startswith(STEP_PREFIX):  # a step's name: timeline.step_number
        damage.add("unprintable_name", ev, name_touches(ev.get("cat"), name))
    if "string_number" in (ts_kind, dur_kind):
        damage.add("string_number", ev, touches)
    return ts, dur


STEP_PREFIX = "ProfilerStep"
NAME_CATS = frozenset(("user_annotation", "gpu_user_annotation", "cuda_runtime", "cuda_driver"))
GPU_NAME_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
NAME_WORDS = ("nccl", "htod")  # what a GPU event's name decides: communication (NCCL), a host-to-device copy
LOADER_PREFIX = "enumerate(DataLoader)#"  # the DataLoader's own annotation, read as the input source


def name_touches(cat: Any, name: str) -> bool:
    """Whether an unprintable name changes a figure: a scope's or a launch's name is read by name (a damaged one
    reads as another name); a GPU event's only labels its class, unless the damage splits a word that decides what it
    is (NCCL, HtoD); any other user annotation is read only when named by --input-scope or --step-scope, where a
    name not found is an error."""
    if cat in ("cuda_runtime", "cuda_driver"):
        return True
    if cat in ("user_annotation", "gpu_user_annotation"):
        clean = "".join(ch for ch in name if not is_control(ch))
        return clean in KNOWN or clean.startswith(LOADER_PREFIX)
    if cat in GPU_NAME_CATS:
        clean = "".join(ch for ch in name if not is_control(ch)).lower()
        return any((w in clean) != (w in name.lower()) for w in NAME_WORDS)
    return False


def fingerprint(ev: dict[str, Any], ts: float, dur: float) -> int:
    """A 64-bit key of an event's name, track, start, duration and ids: equal events have equal keys."""
    args = ev.get("args") or {}  # ids too: two launches at one time and length are still two launches
    h = hash((ev["name"], ev.get("pid"), ev.get("tid"), ts, dur, args.get("correlation"), args.get("External id")))
    return h if -(1 << 63) <= h < (1 << 63) else h & ((1 << 63) - 1)


def repeated(keys: Iterable[int]) -> array:
    """The keys that occur more than once, each once, sorted; keys: all of them, in sorted order
    (spill.SortedRecords keeps them on disk when there are many)."""
    out, last, prev = array("q"), None, None
    for key in keys:
        if key == prev and key != last:
            out.append(key)
            last = key
        prev = key
    return out


class Skip:
    """The second copies of repeated keys, to be skipped: the first copy of each is kept."""

    def __init__(self, keys: array):
        self.keys, self.seen = keys, bytearray(len(keys))

    def __call__(self, key: int) -> bool:
        i = bisect.bisect_left(self.keys, key)
        if i == len(self.keys) or self.keys[i] != key:
            return False
        if self.seen[i]:
            return True
        self.seen[i] = 1
        return False


_ID_TYPES = frozenset((int, str, type(None)))  # what a pid or tid may be (check_complete)
_INF = float("inf")


def readable(
    events: Iterable[Any],
    damage: Damage,
    skip: "Skip | None" = None,
    keys: "SortedRecords | None" = None,
    other: "Callable[[dict[str, Any]], None] | None" = None,
) -> Iterator[tuple[int, dict[str, Any], float, float]]:
    """(index, event, start, duration) of each complete event that can be read, in file order.

    What cannot be read is counted in damage. The trace's time is fixed by the median start of its first
    ANCHOR_EVENTS readable complete events; an event farther than FAR_US from it is counted and skipped.
    keys (first pass) gathers each event's fingerprint; skip (second pass) drops the second copies.
    other: given every event that is an object but no complete event (the [memory] events are among them)."""
    pending, anchor = [], None
    for index, ev in enumerate(events):
        if type(ev) is not dict and not isinstance(ev, dict):
            damage.add("non_object", ev, False)
            continue
        if ev.get("ph") != "X":
            if other is not None:
                other(ev)
            continue
        ts, dur, name, args = ev.get("ts"), ev.get("dur"), ev.get("name"), ev.get("args")
        # the common event, plain numbers and names, needs none of check_complete's questions: the same answer
        if (
            type(ts) is float
            and type(dur) is float
            and -_INF < ts < _INF
            and 0.0 <= dur < _INF
            and type(name) is str
            and type(args) is dict
            and type(ev.get("pid")) in _ID_TYPES
            and type(ev.get("tid")) in _ID_TYPES
            and name.isprintable()
        ):
            found = ts, dur
        else:
            found = check_complete(ev, damage)
            if found is None:
                continue
            ts, dur = found
        if anchor is None:
            pending.append((index, ev, ts, dur))
            if len(pending) < ANCHOR_EVENTS:
                continue
            anchor = statistics.median(item[2] for item in pending)
            yield from _kept(pending, anchor, damage, skip, keys)
            pending = None
            continue
        if _keep(ev, ts, dur, anchor, damage, skip, keys):
            yield index, ev, ts, dur
    if pending:
        yield from _kept(pending, statistics.median(item[2] for item in pending), damage, skip, keys)


def _kept(items, anchor, damage, skip, keys):
    for index, ev, ts, dur in items:
        if _keep(ev, ts, dur, anchor, damage, skip, keys):
            yield index, ev, ts, dur


def _keep(ev, ts, dur, anchor, damage, skip, keys) -> bool:
    """Whether a readable complete event is kept: near the trace's time, and not the second copy of one."""
    if abs(ts - anchor) > FAR_US:
        damage.add("far_outside", ev, figure_cat(ev))
        return False
    key = fingerprint(ev, ts, dur)
    if keys is not None:
        keys.add(key)
    elif skip is not None and skip(key):
        damage.add("duplicate", ev, figure_cat(ev))
        return False
    return True
