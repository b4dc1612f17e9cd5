"""What a change did to the step, from two traces or two profile runs (steplens diff BEFORE AFTER).

    steplens diff BEFORE AFTER [-p PROJECT] [--json] [--picture OUT.png] [--input-scope NAME]

BEFORE and AFTER are trace files (.json or .json.gz) or folders (every *.pt.trace.json[.gz] under them: a profile
run's outputs, pooled); with -p, profile runs' uuids in that Polyaxon project, their traces downloaded first.
Per step on average: the delays side by side with their change; the verdict before and after; the GPU time by
kernel class; the kernels and CPU operators added, removed, faster or slower, matched by name; the host's figures
where both sides recorded them."""

import argparse
import glob
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from steplens.evidence import delays
from steplens.evidence.attribution import pooled_classes
from steplens.evidence.diagnosis import verdict
from steplens.evidence.summarize import add_reading_options, summarize_file
from steplens.project.runs import CompareError, fetch_traces, is_run_uuid
from steplens.text import safe_text
from steplens.trace.reader import TraceError
from steplens.trace.timeline import Tap

TOP = 5  # rows per list of kernels or operators
CHANGED_AT = 0.05  # a matched name's time per call must move by this share (and MIN_US) to count as faster or slower
MIN_US = 0.5
SHARE_ROSE = 0.10  # a delay whose share of the step rose by this much is named as where the step went


class DiffError(Exception):
    pass


def traces_of(path: str) -> list[str]:
    """The traces a side names: the file itself, or every profiler trace under the folder, sorted."""
    if os.path.isfile(path):
        return [path]
    if os.path.isdir(path):
        found = sorted(
            glob.glob(os.path.join(path, "**", "*.pt.trace.json"), recursive=True)
            + glob.glob(os.path.join(path, "**", "*.pt.trace.json.gz"), recursive=True)
        )
        if not found:
            raise DiffError(f"{path}: no *.pt.trace.json[.gz] under this folder")
        return found
    raise DiffError(f"{path}: no such file or folder")


# torch.compile's Triton kernels end in a number that changes between compilations: triton_poi_fused_add_3
_TRITON_NUMBER = re.compile(r"^(triton_[a-z]+_\w*?)_\d+$")


def loose_name(name: str) -> str:
    """A name with what changes between runs taken out: template arguments, parameter lists, Triton numbers."""
    name = _TRITON_NUMBER.sub(r"\1", name)
    out, depth = [], 0
    for ch in name:  # keep the brackets, drop what is inside them (nested <...> and (...))
        if ch in "<(":
            if depth == 0:
                out.append(ch)
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class NameTables:
    """{"kernels": {name: [count, µs]}, "operators": {...}} over traces' GPU events and CPU operators, kept from
    the pass that summarizes each trace (summarize_file's tap): each trace is read once."""

    def __init__(self):
        self.tables: dict[str, dict[str, list[float]]] = {"kernels": {}, "operators": {}}

    def tap(self) -> Callable[[], Tap]:
        """The tap for the next trace: each pass over it (a second one drops events written twice) starts from the
        tables as they stood before the trace."""
        before = {which: {n: list(row) for n, row in rows.items()} for which, rows in self.tables.items()}

        def restart() -> Tap:
            self.tables = {which: {n: list(row) for n, row in rows.items()} for which, rows in before.items()}
            kernels, operators = self.tables["kernels"], self.tables["operators"]

            def keep(cat: Any, name: str, pid: Any, tid: Any, args: dict[str, Any], start: float, dur: float) -> None:
                table = kernels if cat in GPU_CATS else operators if cat == "cpu_op" else None
                if table is not None:
                    row = table.setdefault(name, [0, 0.0])
                    row[0] += 1
                    row[1] += dur

            keep.cats = GPU_CATS + ("cpu_op",)  # the reader gives it no other event (timeline.tap_cats)
            return keep

        return restart


def read_side(
    path: str, input_scope: str | None = None, lanes: bool = False, step_scope: str | None = None
) -> dict[str, Any]:
    """One side of a diff: its traces' evidence, pooled per step, and its name tables."""
    paths = traces_of(path)
    names = NameTables()
    evidences = [
        summarize_file(p, lanes=lanes, input_scope=input_scope, step_scope=step_scope, tap=names.tap()) for p in paths
    ]
    windows = [ev["window"] for ev in evidences]
    steps = sum(w["steps"] for w in windows)
    v = verdict(evidences)
    pace = [w.get("pace_us") for w in windows]
    step_ms = sum(pace) / steps / 1e3 if None not in pace and steps else None
    shares = v.get("delays")
    return {
        "path": path,
        "traces": paths,
        "evidences": evidences,
        "steps": steps,
        "step_ms": step_ms,
        "cpu_step_ms": sum(w["wall_us"] for w in windows) / steps / 1e3 if steps else None,
        "verdict": {k: v.get(k) for k in ("stage", "part", "share", "sentence")},
        "delays_ms": {c: s * step_ms for c, s in shares.items()} if shares and step_ms else None,
        "delay_shares": shares,
        "classes": pooled_classes(windows, steps)["kernel_classes"],
        "names": names.tables,
        "host": host_figures(paths),
    }


def read_sides(
    paths: list[str],
    project: str | None = None,
    input_scope: str | None = None,
    lanes: bool = False,
    step_scope: str | None = None,
) -> list[dict[str, Any]]:
    """Each side read as read_side reads it. With project, a side that is a run uuid and no file or folder here is
    that project's profile run: its traces are downloaded into a temporary folder, every run checked first
    (steplens.project.runs.fetch_traces); the side is then named by its run, its traces by their server paths."""
    runs = [p for p in paths if not os.path.exists(p) and is_run_uuid(p)]
    if runs and not project:
        raise DiffError(f"{runs[0]}: no such file or folder; a run's uuid needs -p PROJECT")
    with tempfile.TemporaryDirectory(prefix="steplens-runs-") as folder:
        fetched = fetch_traces(project, runs, folder) if runs else {}
        sides = []
        for p in paths:
            side = read_side(os.path.join(folder, p) if p in fetched else p, input_scope, lanes, step_scope)
            if p in fetched:
                side.update(path=f"run {p} of project {project}", traces=fetched[p])
            sides.append(side)
    return sides


def host_figures(paths: list[str]) -> dict[str, float] | None:
    """The CPU use and host memory profile mode recorded beside its traces (TRACE.evidence.json's cpu and
    host_memory), averaged over the traces that have them; None when none has."""
    found = []
    for p in paths:
        side = p.rsplit(".pt.trace.", 1)[0] + ".evidence.json"
        try:
            with open(side) as f:
                ev = json.load(f)
        except (OSError, ValueError):
            continue
        cpu, memory = ev.get("cpu") or {}, ev.get("host_memory") or {}
        row = {
            "cpus_used": cpu.get("cpus_used"),
            "budget_cpus": cpu.get("budget_cpus"),
            "throttled_share": cpu.get("throttled_share"),
            "pss_peak_mb": memory.get("pss_peak_mb"),
            "shm_peak_mb": memory.get("shm_peak_mb"),
        }
        if any(v is not None for v in row.values()):
            found.append(row)
    if not found:
        return None
    return {
        k: sum(r[k] for r in found) / len(found) if all(r[k] is not None for r in found) else None for k in found[0]
    }


def match(before: dict[str, list[float]], after: dict[str, list[float]]) -> tuple[list[tuple], list[str], list[str]]:
    """Names matched exactly, then by loose_name among the rest (several of one loose name pooled): the matched
    pairs (label, before row, after row), and the names left only before and only after."""
    pairs = [(n, before[n], after[n]) for n in before if n in after]
    rest_b = {n: r for n, r in before.items() if n not in after}
    rest_a = {n: r for n, r in after.items() if n not in before}

    def pooled(rows):
        out = {}
        for n, (count, us) in rows.items():
            row = out.setdefault(loose_name(n), [0, 0.0])
            row[0] += count
            row[1] += us
        return out

    loose_b, loose_a = pooled(rest_b), pooled(rest_a)
    for n in loose_b:
        if n in loose_a:
            pairs.append((n, loose_b[n], loose_a[n]))
    only_b = [n for n in rest_b if loose_name(n) not in loose_a]
    only_a = [n for n in rest_a if loose_name(n) not in loose_b]
    return pairs, only_b, only_a


def name_changes(b: dict[str, Any], a: dict[str, Any], which: str) -> dict[str, Any]:
    """Added, removed, faster and slower names of one table (kernels or operators), per step, largest first."""
    nb, na = max(1, b["steps"]), max(1, a["steps"])
    tb, ta = b["names"][which], a["names"][which]
    pairs, only_b, only_a = match(tb, ta)

    def row(name, rb, ra):
        out = {"name": name}
        if rb:
            out.update(
                before_per_step=rb[0] / nb, before_us_per_call=rb[1] / rb[0], before_ms_per_step=rb[1] / nb / 1e3
            )
        if ra:
            out.update(after_per_step=ra[0] / na, after_us_per_call=ra[1] / ra[0], after_ms_per_step=ra[1] / na / 1e3)
        out["change_ms_per_step"] = (ra[1] / na if ra else 0.0) / 1e3 - (rb[1] / nb if rb else 0.0) / 1e3
        return out

    matched = [row(n, rb, ra) for n, rb, ra in pairs]

    def recount(r, sign):  # called more or less often a step, by more than CHANGED_AT
        d = r["after_per_step"] - r["before_per_step"]
        return sign * d > CHANGED_AT * r["before_per_step"]

    def moved(r, sign):  # called as often, each call faster or slower
        d = r["after_us_per_call"] - r["before_us_per_call"]
        return not recount(r, 1) and not recount(r, -1) and sign * d > max(MIN_US, CHANGED_AT * r["before_us_per_call"])

    by_size = lambda rows: sorted(rows, key=lambda r: -abs(r["change_ms_per_step"]))[:TOP]
    return {
        "added": by_size([row(n, None, ta[n]) for n in only_a]),
        "removed": by_size([row(n, tb[n], None) for n in only_b]),
        "fewer calls": by_size([r for r in matched if recount(r, -1)]),
        "more calls": by_size([r for r in matched if recount(r, 1)]),
        "faster": by_size([r for r in matched if moved(r, -1)]),
        "slower": by_size([r for r in matched if moved(r, 1)]),
        "matched": len(matched),
        "only_before": len(only_b),
        "only_after": len(only_a),
    }


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The change from before to after (read_side's), per step."""
    out = {
        "before": {k: before[k] for k in ("path", "traces", "steps", "step_ms", "cpu_step_ms", "verdict", "host")},
        "after": {k: after[k] for k in ("path", "traces", "steps", "step_ms", "cpu_step_ms", "verdict", "host")},
        "delays": None,
        "classes": None,
        "kernels": name_changes(before, after, "kernels"),
        "operators": name_changes(before, after, "operators"),
    }
    if before["step_ms"] is not None and after["step_ms"] is not None:
        out["step_change_ms"] = after["step_ms"] - before["step_ms"]
    if before["delays_ms"] and after["delays_ms"]:
        db, da = before["delays_ms"], after["delays_ms"]
        sb, sa = before["delay_shares"], after["delay_shares"]
        out["delays"] = {
            c: {
                "before_ms": db[c],
                "after_ms": da[c],
                "change_ms": da[c] - db[c],
                "before_share": sb[c],
                "after_share": sa[c],
            }
            for c in delays.CLASSES
        }
        out["summary"] = summary(out["delays"], out.get("step_change_ms"))
    if before["classes"] or after["classes"]:
        cb, ca = before["classes"] or {}, after["classes"] or {}
        out["classes"] = {
            c: {
                "before_ms": (cb.get(c) or {}).get("ms_per_step", 0.0),
                "after_ms": (ca.get(c) or {}).get("ms_per_step", 0.0),
            }
            for c in dict.fromkeys([*cb, *ca])
        }
    return out


def summary(d: dict[str, dict[str, float]], step_change: float | None) -> str:
    """Which delay shrank most, which grew most, and where the step went, in a sentence."""
    shrank = min(d, key=lambda c: d[c]["change_ms"])
    grew = max(d, key=lambda c: d[c]["change_ms"])
    parts = []
    if d[shrank]["change_ms"] < 0:
        parts.append(f"{delays.NAMES[shrank]} shrank by {-d[shrank]['change_ms']:.2f} ms a step")
    if d[grew]["change_ms"] > 0:
        parts.append(f"{delays.NAMES[grew]} grew by {d[grew]['change_ms']:.2f} ms a step")
    if step_change is not None and abs(step_change) < 0.005:
        parts.append("the step kept its length")
    elif step_change is not None:
        parts.append(f"the step {'shortened' if step_change < 0 else 'lengthened'} by {abs(step_change):.2f} ms")
    rose = sorted(
        (c for c in d if d[c]["after_share"] - d[c]["before_share"] >= SHARE_ROSE), key=lambda c: -d[c]["after_share"]
    )
    if rose:
        parts.append(
            "the step now goes to "
            + " and ".join(
                f"{delays.NAMES[c]} {d[c]['after_share']:.0%} (was {d[c]['before_share']:.0%})" for c in rose
            )
        )
    return "; ".join(parts) + "." if parts else "No delay moved."


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _names_block(title: str, ch: dict[str, Any]) -> list[str]:
    lines = [
        f"{title}: {ch['matched']} matched by name, {ch['only_before']} only before, {ch['only_after']} only after "
        f"(template arguments and torch.compile's numbers ignored when matching)"
    ]
    for what in ("added", "removed", "fewer calls", "more calls", "faster", "slower"):
        for r in ch[what]:
            name = safe_text(r["name"])
            name = name if len(name) <= 70 else name[:67] + "..."
            if what == "added":
                said = f"{r['after_per_step']:.1f}/step, {r['after_us_per_call']:.1f} µs each"
            elif what == "removed":
                said = f"{r['before_per_step']:.1f}/step, {r['before_us_per_call']:.1f} µs each"
            else:
                said = (
                    f"{r['before_per_step']:.1f} -> {r['after_per_step']:.1f}/step, "
                    f"{r['before_us_per_call']:.1f} -> {r['after_us_per_call']:.1f} µs each"
                )
            lines.append(f"  {what:<11} {r['change_ms_per_step']:+8.3f} ms/step  {name}  ({said})")
    return lines


def format_diff(d: dict[str, Any]) -> str:
    b, a = d["before"], d["after"]
    lines = [
        f"before: {safe_text(b['path'])} ({len(b['traces'])} trace(s), {b['steps']} steps)",
        f"after:  {safe_text(a['path'])} ({len(a['traces'])} trace(s), {a['steps']} steps)",
        f"verdict before: {b['verdict']['sentence']}",
        f"verdict after:  {a['verdict']['sentence']}",
    ]
    if d.get("summary"):
        lines.append(f"change: {d['summary']}")
    if d["delays"]:
        lines.append(f"{'per step':<28}{'before ms':>10}{'share':>7}{'after ms':>10}{'share':>7}{'change ms':>11}")
        lines.append(
            f"{'step (pace)':<28}{_ms(b['step_ms']):>10}{'':>7}{_ms(a['step_ms']):>10}{'':>7}"
            f"{d.get('step_change_ms', 0.0):>+11.2f}"
        )
        for c, r in d["delays"].items():
            if r["before_ms"] == 0 and r["after_ms"] == 0:
                continue
            lines.append(
                f"{delays.NAMES[c]:<28}{r['before_ms']:>10.2f}{r['before_share']:>7.0%}{r['after_ms']:>10.2f}"
                f"{r['after_share']:>7.0%}{r['change_ms']:>+11.2f}"
            )
    else:
        lines.append("delays: n/a (a side has no GPU figures: a CPU-only trace, or GPU records lost)")
    if d["classes"]:
        lines.append(
            "GPU time by kernel class (ms per step): "
            + ", ".join(f"{c} {r['before_ms']:.2f} -> {r['after_ms']:.2f}" for c, r in d["classes"].items())
        )
    lines += _names_block("kernels", d["kernels"])
    lines += _names_block("CPU operators", d["operators"])
    if b["host"] and a["host"]:
        hb, ha = b["host"], a["host"]
        lines.append(
            "host (profiled cycles): CPUs used "
            f"{_ms(hb['cpus_used'])} -> {_ms(ha['cpus_used'])} of {_ms(ha['budget_cpus'])}; throttled "
            f"{_ms(hb['throttled_share'])} -> {_ms(ha['throttled_share'])} of the time; PSS "
            f"{_ms(hb['pss_peak_mb'])} -> {_ms(ha['pss_peak_mb'])} MB; /dev/shm {_ms(hb['shm_peak_mb'])} -> "
            f"{_ms(ha['shm_peak_mb'])} MB"
        )
    else:
        lines.append(
            "host: n/a (no CPU use or host memory beside these traces: train.py's profile mode writes them in each "
            "trace's .evidence.json; other tools' traces and runs recorded before it did lack them)"
        )
    lines.append(
        "note: both traces carry the profiler's own cost; time the change without it (bench runs: steplens compare; "
        "the outcome: steplens decide)"
    )
    return "\n".join(lines) + "\n"


def draw(before: dict[str, Any], after: dict[str, Any], path: str) -> None:
    """Each side's median step, one above the other on one time scale, coloured as the step picture."""
    from steplens.evidence import picture

    groups = []
    for label, side in (("before ", before), ("after ", after)):
        rows = picture.lanes_of(side["evidences"][0])
        rows = sorted(rows, key=lambda r: r["cpu_ms"])
        groups.append((label, [rows[len(rows) // 2]]))
    said = f"before: {before['verdict']['stage'] or 'no verdict'}; after: {after['verdict']['stage'] or 'no verdict'}"
    has_gpu = all(side["evidences"][0]["has_gpu"] for side in (before, after))
    picture.draw_groups(groups, path, "steplens diff: the median step before and after", said, has_gpu, False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens diff", description=__doc__.split("\n")[0])
    p.add_argument("before", help="a trace, a folder of traces (a profile run's outputs), or with -p a run's uuid")
    p.add_argument("after", help="a trace, or a folder of traces, of the changed loop; or with -p a run's uuid")
    p.add_argument("--json", action="store_true", help="print the diff as one JSON object")
    p.add_argument("--picture", metavar="PNG", help="draw both sides' median step on one time scale (needs matplotlib)")
    p.add_argument("-p", "--project", help="a Polyaxon project ([owner/]name): BEFORE and AFTER may be its runs' uuids")
    add_reading_options(p)
    args = p.parse_args(argv)
    if args.picture and not os.path.isdir(os.path.dirname(os.path.abspath(args.picture))):
        print(f"steplens diff: error: no folder for {args.picture}", file=sys.stderr)
        return 2
    try:
        before, after = read_sides(
            [args.before, args.after], args.project, args.input_scope, bool(args.picture), args.step_scope
        )
    except (DiffError, TraceError, CompareError) as e:
        print(f"steplens diff: error: {e}", file=sys.stderr)
        return 1
    d = diff(before, after)
    if args.json:
        print(json.dumps(d, sort_keys=True))
    else:
        sys.stdout.write(format_diff(d))
    if args.picture:
        from steplens.evidence.picture import NoPicture

        try:
            draw(before, after, args.picture)
            print(f"picture: {args.picture}", file=sys.stderr)
        except (NoPicture, ValueError) as e:  # matplotlib missing, or a side without lanes: the diff stands
            print(f"steplens diff: no picture: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
