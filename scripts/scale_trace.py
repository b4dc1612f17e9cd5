"""Make a big trace from a real one: its steps repeated with shifted timestamps, correlation ids and step numbers.

    python scripts/scale_trace.py IN.pt.trace.json.gz OUT.pt.trace.json.gz --copies 3
    python scripts/scale_trace.py IN.pt.trace.json.gz OUT.pt.trace.json.gz --target-bytes 1e9   # about 1 GB of JSON

Each copy is the whole original shifted by the original's time span (plus 1 ms) per copy; its
correlation ids, External ids, flow ids and ProfilerStep numbers are offset so that no two copies
share one, so every copy's steps read like the original's. Metadata events (ph M) are written once.
The profiler's capture span (cat Trace) is written once too, stretched over every copy: one capture, not several.
The output is written as a stream (gzipped when its name ends in .gz): memory holds the original only.
"""

import argparse
import gzip
import json
import os
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SystemExit(f"scale_trace.py: error: {path}: no traceEvents list: not a PyTorch profiler trace")
    return doc


def offsets(events):
    """The shifts that keep copies apart: time span, correlation ids, External ids, flow ids, step numbers."""
    times = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0) or 0))
        for e in events
        if isinstance(e.get("ts"), (int, float))
    ]
    if not times:
        raise SystemExit("scale_trace.py: error: the trace has no timed events")
    ids = lambda key: [
        e["args"][key] for e in events if isinstance(e.get("args"), dict) and isinstance(e["args"].get(key), int)
    ]
    steps = [
        int(e["name"].split("#", 1)[1])
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    if not steps:
        raise SystemExit("scale_trace.py: error: the trace has no ProfilerStep#N slices")
    flows = [e["id"] for e in events if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int)]
    return {
        "time": max(b for _, b in times) - min(a for a, _ in times) + 1000.0,
        "correlation": max(ids("correlation"), default=0) + 1,
        "External id": max(ids("External id"), default=0) + 1,
        "flow": max(flows, default=0) + 1,
        "step": max(steps) - min(steps) + 1,
    }


def shifted(ev, k, off):
    """Event ev as it would read in copy k (k = 0: unchanged)."""
    if k == 0:
        return ev
    out = dict(ev)
    if isinstance(out.get("ts"), (int, float)):
        out["ts"] = out["ts"] + k * off["time"]
    name = out.get("name")
    if out.get("ph") == "X" and isinstance(name, str) and name.startswith("ProfilerStep#"):
        out["name"] = f"ProfilerStep#{int(name.split('#', 1)[1]) + k * off['step']}"
    if isinstance(out.get("id"), int) and out.get("ph") in ("s", "f", "t"):
        out["id"] = out["id"] + k * off["flow"]
    args = out.get("args")
    if isinstance(args, dict) and ("correlation" in args or "External id" in args):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                args[key] = args[key] + k * off[key]
        out["args"] = args
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="scale_trace.py", description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a PyTorch profiler Chrome trace (.json or .json.gz)")
    p.add_argument("out", help="the scaled trace (.json or .json.gz)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--copies", type=int, help="how many copies of the original's steps (>= 1)")
    g.add_argument("--target-bytes", type=float, help="copies until the uncompressed JSON reaches this size")
    args = p.parse_args(argv)
    if args.copies is not None and args.copies < 1:
        p.error(f"--copies must be >= 1, got {args.copies}")
    doc = load(args.trace)
    events = doc["traceEvents"]
    off = offsets(events)
    one_copy = sum(len(json.dumps(e)) + 2 for e in events if e.get("ph") != "M")
    copies = args.copies or max(1, int(round(args.target_bytes / one_copy)))
    tmp = os.path.join(
        os.path.dirname(os.path.abspath(args.out)), f".partial-{os.getpid()}-{os.path.basename(args.out)}"
    )
    opener = gzip.open if args.out.endswith(".gz") else open
    written = 0
    try:
        with opener(tmp, "wt", encoding="utf-8") as f:
            head = {k: v for k, v in doc.items() if k != "traceEvents"}
            f.write(json.dumps(head)[:-1] + (', "traceEvents": [\n' if head else '"traceEvents": [\n'))
            first = True
            for k in range(copies):
                for ev in events:
                    if k and ev.get("ph") == "M":
                        continue
                    if ev.get("cat") == "Trace":  # one capture span over every copy, written with the last one
                        if k < copies - 1:
                            continue
                        text = json.dumps(dict(ev, dur=ev["dur"] + k * off["time"]))
                    else:
                        text = json.dumps(shifted(ev, k, off))
                    f.write(text if first else ",\n" + text)
                    written += len(text) + 2
                    first = False
            f.write("\n]}\n")
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(
        f"scale_trace.py: {copies} copies of {args.trace} -> {args.out} "
        f"({written / 1e6:.0f} MB of JSON, {os.path.getsize(args.out) / 1e6:.0f} MB on disk)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
