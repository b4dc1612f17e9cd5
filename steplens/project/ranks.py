"""steplens ranks: the evidence across a DDP run's ranks, aligned on step numbers, and the rank holding the others back.

    steplens ranks OUTPUTS/traces              # every rank's traces under the folder (traces/rank{R}/...)
    steplens ranks A.pt.trace.json.gz B.pt.trace.json.gz --json

The figures: docs/DDP.md#evidence-across-ranks."""

import argparse
import functools
import glob
import gzip
import json
import os
import re
import statistics
import sys
from array import array
from collections.abc import Iterable
from typing import Any

from steplens.evidence import attribution, picture, summarize
from steplens.scopes import NEXT_BATCH, SCOPES
from steplens.stats import ALPHA, sign_test_p, steps_needed
from steplens.text import say, write
from steplens.trace import intervals, reader, spill
from steplens.trace.intervals import minus
from steplens.trace.timeline import Tap

NCCL = "nccl"


CPU_COMM = ("c10d::", "gloo:", "nccl:", "record_param_comms", "allreduce", "all_reduce")


TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


RUNS_AHEAD = "the CPU runs ahead of the GPU: GPU communication cannot be clipped to the CPU's steps"


NO_COMM = (
    "no communication events in the trace (no NCCL kernels, no gloo/c10d operators): "
    "not a distributed run, or a world of one"
)


# With more ranks than this, a line on stderr after every this many ranks read.
PROGRESS_EVERY = 16


class RanksError(Exception):
    pass


def _head(path: str, head_bytes: int) -> tuple[str | None, str | None]:
    """The trace's first characters (distributedInfo precedes traceEvents), or None and why they cannot be read."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            return f.read(head_bytes), None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        return None, f"{path}: not a readable trace ({type(e).__name__}: {e})"


def trace_identity(path: str, head_bytes: int = 1 << 18) -> dict[str, Any]:
    """{"rank", "world_size", "unreadable"}: distributedInfo from the trace's head, else the rank{R} folder for the
    rank (world_size None). A head that cannot be read leaves the rank to the folder (None without one) and says
    why in "unreadable"."""
    head, unreadable = _head(path, head_bytes)
    found, world = None, None
    at = head.find('"distributedInfo"') if head else -1
    if at >= 0:
        try:
            info, _ = json.JSONDecoder().raw_decode(head, head.index("{", at))
            found = int(info["rank"])
            world = int(info["world_size"]) if info.get("world_size") is not None else None
        except (ValueError, KeyError, TypeError):
            found = None
    folder = re.fullmatch(r"rank(\d+)", os.path.basename(os.path.dirname(os.path.abspath(path))))
    if found is not None and folder and int(folder.group(1)) != found:
        raise RanksError(f"{path}: the trace says rank {found} but lies in folder rank{folder.group(1)}")
    if found is None and folder:
        found = int(folder.group(1))
    if found is None and not unreadable:
        raise RanksError(f"{path}: no distributedInfo.rank in the trace and no rank{{R}} folder: which rank is it?")
    return {"rank": found, "world_size": world, "unreadable": unreadable}


def trace_rank(path: str, head_bytes: int = 1 << 18) -> int:
    """distributedInfo.rank from the trace's head (it precedes traceEvents), else the rank{R} folder."""
    found = trace_identity(path, head_bytes)
    if found["rank"] is None:
        raise RanksError(found["unreadable"])
    return found["rank"]


def _trace_files(paths: list[str]) -> list[str]:
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += [f for f in glob.glob(os.path.join(p, "**", "*"), recursive=True) if f.endswith(TRACE_SUFFIXES)]
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise RanksError(f"{p}: no such file or folder")
    if not files:
        raise RanksError(f"no PyTorch profiler traces (*.pt.trace.json[.gz]) in {', '.join(paths)}")
    return sorted(files)


def locate(paths: list[str]) -> dict[str, Any]:
    """The ranks' traces in files and folders (searched recursively): {"by_rank": {rank: [paths]}, "left_out":
    {what: why}}. Left out: a rank that the traces' distributedInfo.world_size counts and no trace was found of,
    and a trace whose head cannot be read and whose folder names no rank."""
    by_rank, worlds, left_out = {}, set(), {}
    for f in _trace_files(paths):
        found = trace_identity(f)
        if found["rank"] is None:
            left_out[f] = found["unreadable"]
            continue
        by_rank.setdefault(found["rank"], []).append(f)
        worlds.add(found["world_size"])
    world = max((w for w in worlds if w is not None), default=0)
    for r in range(world):
        if r not in by_rank:
            left_out[f"rank {r}"] = f"no trace found (the traces say world size {world})"
    return {"by_rank": by_rank, "left_out": left_out}


def find_traces(paths: list[str]) -> dict[int, list[str]]:
    """{rank: [trace paths]} from trace files and folders (searched recursively); see locate() for missing ranks."""
    return locate(paths)["by_rank"]


@functools.lru_cache(maxsize=1 << 13)  # a trace names a few thousand operators, each many times
def _is_cpu_comm(name):
    low = name.lower()
    return any(k in low for k in CPU_COMM)


def _add(kept: array, s: float, e: float) -> None:
    """Keep [s, e) in kept (starts and ends in turn): joined to the last interval where it starts inside it (at or
    after its start, at or before its end: union() merges those two, whatever else it is given), else added. So
    union() of what is kept is union() of every interval given: the same pieces, each the same floats."""
    n = len(kept)
    if n and kept[n - 2] <= s <= kept[n - 1]:
        if e > kept[n - 1]:
            kept[n - 1] = e
    else:
        kept.append(s)
        kept.append(e)


def _pairs(kept: array) -> list[list[float]]:
    """The intervals kept by _add, as [start, end] lists."""
    return [[kept[i], kept[i + 1]] for i in range(0, len(kept), 2)]


class Timelines:
    """Steps, the scopes, and the communication and compute intervals of one trace, kept one complete event at
    a time: from summarize's own pass (keep is a timeline.read tap), so that a rank's trace is read once."""

    def __init__(self):
        self.steps, self.scopes = [], {n: [] for n in SCOPES}
        # intervals kept as start, end in turn, each joined to the one before where union() would merge them
        # (_add): a thread's nested operators take the room of the outermost, not one entry each
        self.nccl, self.kernels, self.cpu_comm = array("d"), array("d"), {}
        self.cpu_ops: dict[tuple[Any, Any], array] = {}  # each thread's operators
        self.last = (None, None, None)  # (pid, tid, its cpu_ops array) of the last operator kept there

    def restart(self) -> Tap:
        """A fresh start (a second pass drops events written twice); returns keep."""
        self.__init__()
        return self.keep

    def keep(self, cat: Any, name: str, pid: Any, tid: Any, args: dict[str, Any], s: float, dur: float) -> None:
        """One complete event that starts at s and lasts dur µs (a timeline.Tap)."""
        e = s + dur
        if cat == "cpu_op":
            if _is_cpu_comm(name):
                self.cpu_comm.setdefault((pid, tid), []).append([s, e])
                return
            last_pid, last_tid, ops = self.last
            if tid != last_tid or pid != last_pid or ops is None:  # (as a dict's key compares)
                ops = self.cpu_ops.get((pid, tid))
                if ops is None:
                    ops = self.cpu_ops[(pid, tid)] = array("d")
                self.last = (pid, tid, ops)
            _add(ops, s, e)
            return
        if not isinstance(cat, str):  # the damage pass counts such an event
            return
        thread = (pid, tid)
        if cat == "user_annotation":
            if name.startswith("ProfilerStep#"):
                number = name.split("#", 1)[1]
                if number.isdigit():  # a damaged step name is the damage pass's to count
                    self.steps.append((int(number), s, e))
            elif name in self.scopes:
                self.scopes[name].append([s, e])
            elif _is_cpu_comm(name):
                self.cpu_comm.setdefault(thread, []).append([s, e])
        elif cat == "kernel":
            _add(self.nccl if NCCL in name.lower() else self.kernels, s, e)

    keep.cats = ("user_annotation", "kernel", "cpu_op")  # the reader gives it no other event (timeline.tap_cats)

    def result(self) -> dict[str, Any]:
        """{"steps", "scopes", "source", "comm", "compute"} (see timelines)."""
        cpu_comm = self.cpu_comm
        if self.nccl:
            source, comm, compute = (
                "nccl kernels",
                intervals.union(_pairs(self.nccl)),
                intervals.union(_pairs(self.kernels)),
            )
        elif cpu_comm:
            source = "cpu (gloo/c10d operators)"
            comm = intervals.union([iv for ivs in cpu_comm.values() for iv in ivs])
            # An operator that encloses a collective (autograd's evaluate_function around DDP's hook, say)
            # is not compute while the collective runs: per thread, compute is operators less collectives.
            compute = intervals.union(
                [
                    iv
                    for thread, ops in self.cpu_ops.items()
                    for iv in minus(
                        intervals.union(_pairs(ops)),
                        intervals.union(cpu_comm.get(thread, [])),
                    )
                ]
            )
        else:
            source, comm, compute = None, [], []
        return {
            "steps": sorted(set(self.steps)),  # an exact duplicate of a step is one step
            "scopes": {n: intervals.union(v) for n, v in self.scopes.items()},
            "source": source,
            "comm": comm,
            "compute": compute,
        }


def timelines(events: Iterable[dict]) -> dict[str, Any]:
    """Steps, the scopes, and the communication and compute intervals of one trace's events (a list or a stream:
    every complete event whose ts and dur read as numbers, dur 0 where it is missing)."""
    found = Timelines()
    for ev in events:
        if ev.get("ph") != "X":
            continue
        try:
            s = float(ev["ts"])
            dur = float(ev.get("dur", 0))
        except (KeyError, TypeError, ValueError):
            continue
        name = ev.get("name", "")
        if isinstance(name, str):  # (the reader's taps are given only events with a name)
            found.keep(ev.get("cat", ""), name, ev.get("pid"), ev.get("tid"), ev.get("args") or {}, s, dur)
    return found.result()


def step_figures(
    t: dict[str, Any], number: int, a: float, b: float, evidence_step: dict[str, Any], runs_ahead: bool = False
) -> dict[str, Any]:
    """runs_ahead: steplens summarize found the trace's CPU running ahead of its GPU (GPU comm figures go)."""
    wall = b - a
    out = {
        "step": number,
        "wall_us": wall,
        "gpu_idle_us": evidence_step.get("gpu_idle_us"),
        "input_gap_us": evidence_step.get("input_gap_us"),
        "scopes_cpu_us": {n: intervals.total(intervals.clip(t["scopes"][n], a, b)) for n in SCOPES},
    }
    out["next_batch_cpu_us"] = out["scopes_cpu_us"][NEXT_BATCH]
    out["comm_null_reason"] = None
    if t["source"] is None:
        out.update(comm_us=None, exposed_comm_us=None, work_us=None, scopes_less_wait_us=None, comm_null_reason=NO_COMM)
        return out
    if runs_ahead and not t["source"].startswith("cpu"):
        out.update(
            comm_us=None,
            exposed_comm_us=None,
            work_us=None,
            comm_null_reason=RUNS_AHEAD,
            scopes_less_wait_us=dict(out["scopes_cpu_us"]),
        )  # a GPU wait is no CPU scope time
        return out
    comm = intervals.clip(t["comm"], a, b)
    exposed = minus(comm, t["compute"])
    out["comm_us"] = intervals.total(comm)
    out["exposed_comm_us"] = intervals.total(exposed)
    out["work_us"] = wall - out["exposed_comm_us"]
    if t["source"].startswith("cpu"):
        # The CPU waits inside the scope that called the collective: take the wait out of it.
        out["scopes_less_wait_us"] = {
            n: out["scopes_cpu_us"][n]
            - intervals.total(intervals.intersect(intervals.clip(t["scopes"][n], a, b), exposed))
            for n in SCOPES
        }
    else:
        out["scopes_less_wait_us"] = dict(out["scopes_cpu_us"])
    return out


# What a damaged trace raises while it is read: the reader's TraceError (a file cut short, not JSON) and this
# module's RanksError (a step in two traces, say). A malformed event does not raise: the reader's damage pass
# counts it, and a rank whose damage touches its figures is left out (DamagedRank). Any other exception is a bug
# of this code, and it is not passed off as a damaged trace.
class DamagedRank(RanksError):
    pass


DAMAGE = (reader.TraceError, RanksError)


def rank_figures(
    paths: list[str], rank: int | None = None, input_scope: str | None = None, lanes: bool = True
) -> dict[str, Any]:
    """One rank's per-step figures over its traces (cycles are pooled by step number). Each trace is read as a
    stream, one at a time: what is kept per rank is its steps' figures (and, with lanes, the rows of its picture).

    A trace that cannot be read leaves the whole rank out: {"rank", "traces", "left_out": why}, no figures; across()
    names it and compares the others.
    """
    try:
        return _read_rank(paths, rank, input_scope, lanes)
    except DAMAGE as e:
        if isinstance(e, spill.SpillError):  # the machine's fault (a full disk), not the trace's: the command stops
            raise RanksError(str(e)) from e
        if rank is None:
            rank = next((r for r in (trace_identity(p)["rank"] for p in paths) if r is not None), None)
        why = f"damaged: {e}" if isinstance(e, DamagedRank) else f"unreadable: {e}"
        return {"rank": rank, "traces": list(paths), "left_out": why, "steps": [], "drawn": []}


def _read_rank(paths, rank, input_scope, lanes):
    steps, sources, ahead, drawn = {}, set(), [], []
    for path in paths:
        if rank is None:
            rank = trace_rank(path)
        kept = Timelines()  # from summarize's own pass: each trace is read once (more where that pass gives up)
        evidence = summarize.summarize_file(path, lanes=lanes, input_scope=input_scope, tap=kept.restart)
        if evidence.get("damage_withheld"):
            raise DamagedRank(f"{path}: {evidence['damage_withheld']}")
        if evidence.get("window_only"):  # ranks are compared step by step: a trace without steps cannot be
            raise reader.TraceError(f"{path}: no ProfilerStep#N slices: ranks are compared step by step")
        t = kept.result()
        sources.add(t["source"])
        runs_ahead = bool(evidence.get("cpu_runs_ahead"))
        if runs_ahead and t["source"] and not t["source"].startswith("cpu"):
            ahead.append(path)
        if lanes:
            drawn.append(
                {
                    "rows": picture.lanes_of(evidence),
                    "has_gpu": evidence["has_gpu"],
                    "gpu_slots": evidence.get("idle_basis") == "gpu_timeline",
                }
            )
        by_number = {s["step"]: s for s in evidence["steps"]}
        for number, a, b in t["steps"]:
            if number not in by_number:  # a step summarize left out (its length in ns): no figure to compare
                continue
            if number in steps:
                raise RanksError(f"rank {rank}: ProfilerStep#{number} appears in two traces ({', '.join(paths)})")
            steps[number] = step_figures(t, number, a, b, by_number.get(number, {}), runs_ahead)
    if len(sources) > 1:
        raise RanksError(f"rank {rank}: traces disagree on their communication ({sources})")
    source = sources.pop() if sources else None
    reason = NO_COMM if not source else (f"{RUNS_AHEAD} ({len(ahead)} of {len(paths)} traces)" if ahead else None)
    return {
        "rank": rank,
        "traces": list(paths),
        "comm_source": source,
        "comm_null_reason": reason,
        "steps": [steps[k] for k in sorted(steps)],
        "drawn": drawn,
    }


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _mean(values):
    """Mean per step, or None where a step lacks the figure (a CPU trace has no GPU idle)."""
    values = list(values)
    return None if not values or None in values else sum(values) / len(values)


def _by_rank(per_rank, left_out):
    """The ranks' figures by rank number; two or more ranks, each once, besides those left out."""
    by_rank = {}
    for fig in per_rank:
        if fig["rank"] in by_rank:
            raise RanksError(f"rank {fig['rank']} appears twice")
        by_rank[fig["rank"]] = fig
    if len(by_rank) < 2:
        besides = f" besides {len(left_out)} left out ({_left_out_text(left_out)})" if left_out else ""
        raise RanksError(
            f"{len(by_rank)} rank(s) only{besides}: evidence across ranks needs two or more "
            "(steplens summarize reads one trace)"
        )
    return by_rank


def _left_out_text(left_out):
    return "; ".join(f"{what}: {why}" for what, why in left_out.items())


def _aligned_steps(ranks, table, common, key):
    """Per aligned step: every rank's figures, the spread across ranks, and the slowest rank by key (None where
    two or more ranks tie for it: no rank is the slowest there)."""
    steps = []
    for n in common:
        row = {r: table[r][n] for r in ranks}
        spread = {
            k: (max(row[r][k] for r in ranks) - min(row[r][k] for r in ranks))
            if all(row[r][k] is not None for r in ranks)
            else None
            for k in ("wall_us", "work_us", "exposed_comm_us", "next_batch_cpu_us", "gpu_idle_us")
        }
        top = max(row[r][key] for r in ranks)
        at_top = [r for r in ranks if row[r][key] == top]
        slowest = at_top[0] if len(at_top) == 1 else None
        steps.append({"step": n, "ranks": {str(r): row[r] for r in ranks}, "spread": spread, "slowest_rank": slowest})
    return steps


RANK_MEANS = ("wall_us", "work_us", "comm_us", "exposed_comm_us", "gpu_idle_us", "input_gap_us", "next_batch_cpu_us")


def _rank_means(by_rank, ranks, table, common, scope_key):
    """Each rank's figures as means per aligned step, its scopes' time among them."""
    summary = {}
    for r in ranks:
        rows = [table[r][n] for n in common]
        summary[str(r)] = {
            **{k: _mean(x[k] for x in rows) for k in RANK_MEANS},
            "scopes_us": {n: _mean(x[scope_key][n] for x in rows) for n in SCOPES},
            "comm_source": by_rank[r]["comm_source"],
        }
    return summary


def _slow_stage(table, candidate, others, common, scope_key, named):
    """The candidate rank's slow stage: the scope that takes longer than on the other ranks in enough steps."""
    # Per step, the candidate's scope time over the other ranks' median in that step.
    per_step_excess = {
        n: [
            table[candidate][s][scope_key][n] - statistics.median(table[r][s][scope_key][n] for r in others)
            for s in common
        ]
        for n in SCOPES
    }
    excess = {n: sum(v) / len(v) for n, v in per_step_excess.items()}
    stages = {
        n: {"more_in": sum(x > 0 for x in v), "steps": len(v), "p": sign_test_p(len(v), sum(x > 0 for x in v))}
        for n, v in per_step_excess.items()
    }
    stage, stage_reason = None, None
    consistent = [n for n in SCOPES if stages[n]["p"] < ALPHA and excess[n] > 0]
    if not named:
        stage_reason = "no consistent straggler"
    elif consistent:
        stage = max(consistent, key=excess.get)
    else:
        stage_reason = (
            f"no scope of rank {candidate} takes longer than on the other ranks in enough steps "
            f"(one-sided sign test, p < {ALPHA:g})"
        )
    return stage, stage_reason, excess, stages


def across(per_rank: list[dict[str, Any]], left_out: dict[str, str] | None = None) -> dict[str, Any]:
    """Align the ranks' steps by number, the spread per step, the slowest rank and its slow stage.

    Args:
        per_rank: rank_figures of each rank; a rank whose traces could not be read is left out and named.
        left_out: what locate() left out ({"rank R" or a path: why}), named beside them.
    """
    # 1) the ranks that can be compared, and the steps they share
    left_out = {**(left_out or {}), **{f"rank {f['rank']}": f["left_out"] for f in per_rank if f.get("left_out")}}
    by_rank = _by_rank([f for f in per_rank if not f.get("left_out")], left_out)
    numbers = [{s["step"] for s in f["steps"]} for f in by_rank.values()]
    common = sorted(set.intersection(*numbers))
    if not common:
        raise RanksError("the ranks' traces share no ProfilerStep number: they were not profiled on the same steps")
    missing = {r: sorted(set().union(*numbers) - {s["step"] for s in f["steps"]}) for r, f in by_rank.items()}
    has_comm = all(f["comm_source"] for f in by_rank.values())
    ranks = sorted(by_rank)
    table = {r: {s["step"]: s for s in by_rank[r]["steps"]} for r in ranks}
    unavailable = {
        str(r): sorted({table[r][n]["comm_null_reason"] for n in common if table[r][n]["work_us"] is None})
        for r in ranks
    }
    unavailable = {r: "; ".join(v) for r, v in unavailable.items() if v}
    # 2) the figure that ranks them: work (wall less exposed communication) where every rank has it
    key = "work_us" if has_comm and not unavailable else "wall_us"
    steps = _aligned_steps(ranks, table, common, key)
    scope_key = "scopes_less_wait_us" if has_comm else "scopes_cpu_us"
    summary = _rank_means(by_rank, ranks, table, common, scope_key)
    # 3) the straggler, and its slow stage
    test = straggler_test(ranks, steps, summary, key)
    candidate = test["candidate"]
    named = test["p"] < ALPHA
    others = [r for r in ranks if r != candidate]
    stage, stage_reason, excess, stages = _slow_stage(table, candidate, others, common, scope_key, named)
    result = {
        "ranks": ranks,
        "steps_aligned": common,
        "steps_missing": {str(r): m for r, m in missing.items() if m},
        "comm_source": {str(r): by_rank[r]["comm_source"] for r in ranks},
        "comm_null_reason": None if has_comm else NO_COMM,
        "figures_unavailable": {r: f"comm, exposed_comm and work: {why}" for r, why in unavailable.items()},
        "slowest_by": key,
        "straggler_test": test,
        "slowest_rank": candidate if named else None,
        "straggler_reason": None if named else test["reason"],
        "slow_stage": stage,
        "slow_stage_reason": stage_reason,
        "candidate_rank": candidate,
        "stage_excess_us": excess,
        "stage_test": stages,
        "stage_figure": scope_key,
        "per_rank": summary,
        "per_step": steps,
        "spread_median_us": {k: _median(s["spread"][k] for s in steps) for k in steps[0]["spread"]},
        "traces": {str(r): by_rank[r]["traces"] for r in ranks},
        "ranks_left_out": left_out,
    }
    result["verdict"] = straggler_verdict(result)
    return result


def straggler_test(
    ranks: list[int], steps: list[dict[str, Any]], summary: dict[str, dict[str, Any]], key: str
) -> dict[str, Any]:
    """The exact sign test of "no straggler" over the aligned steps: is one rank the slowest in nearly every step?
    A step where ranks tie for the slowest (identical traces, say) is left out, as a sign test leaves out ties."""
    counts = {r: sum(s["slowest_rank"] == r for s in steps) for r in ranks}
    # The rank slowest in the most steps; between equal counts, the most `key` per step.
    candidate = max(ranks, key=lambda r: (counts[r], summary[str(r)][key]))
    ties = sum(s["slowest_rank"] is None for s in steps)
    n, k, chance = len(steps) - ties, counts[candidate], 1 / len(ranks)
    test = {
        "candidate": candidate,
        "steps": n,
        "tied_steps": ties,
        "slowest_in": k,
        "chance": chance,
        "candidates": len(ranks),
        "p": sign_test_p(n, k, chance, len(ranks)),
        "smallest_p": sign_test_p(n, n, chance, len(ranks)),
        "steps_needed": steps_needed(len(ranks), chance),
        "alpha": ALPHA,
    }
    if not n:
        test["reason"] = f"the ranks tie for the slowest in every aligned step ({ties}): no rank is slower"
    elif test["smallest_p"] >= ALPHA:
        test["reason"] = (
            f"too few aligned steps for a verdict (n={n}, need {test['steps_needed']} with "
            f"{len(ranks)} ranks); rank {candidate} was the slowest in {k} of {n}"
        )
    elif test["p"] >= ALPHA:
        test["reason"] = (
            f"rank {candidate} was the slowest in {k} of {n} aligned steps only (sign test "
            f"p={test['p']:.2g}, a verdict needs p < {ALPHA:g}): within the step-to-step noise"
        )
    else:
        test["reason"] = None
    return test


def _compared(result):
    """What the ranks were compared on, in words."""
    if result["slowest_by"] == "work_us":
        return "work (wall less exposed communication)"
    if result["comm_null_reason"]:
        return "wall time (no communication in the trace)"
    return "wall time (work unavailable on rank " + ", rank ".join(result["figures_unavailable"]) + f": {RUNS_AHEAD})"


def straggler_verdict(result: dict[str, Any]) -> str:
    """The verdict in one sentence, ending with what was left out of it."""
    left = result.get("ranks_left_out") or {}
    tail = f" ({len(left)} left out of the verdict: {', '.join(left)})" if left else ""
    return _verdict(result) + tail


def _verdict(result):
    key, what = result["slowest_by"], _compared(result)
    if result["slowest_rank"] is None:
        return (
            f"no consistent straggler by {what}: {result['straggler_reason']}; "
            "the per-step table shows each step's slowest rank"
        )
    slow, test = result["slowest_rank"], result["straggler_test"]
    s = result["per_rank"][str(slow)]
    others = statistics.median(result["per_rank"][str(r)][key] for r in result["ranks"] if r != slow)
    text = (
        f"slowest rank {slow}: the slowest in {test['slowest_in']} of {test['steps']} aligned steps"
        + (f" ({test['tied_steps']} more tied)" if test.get("tied_steps") else "")
        + " (sign test "
        f"p={test['p']:.2g}); {what} {s[key] / 1e3:.1f} ms per step against {others / 1e3:.1f} ms "
        f"(median) on the other ranks"
    )
    if result["slow_stage"]:
        st = result["slow_stage"]
        text += (
            f"; its {st} takes {result['stage_excess_us'][st] / 1e3:.1f} ms "
            f"more per step than the other ranks' median (more in {result['stage_test'][st]['more_in']} "
            f"of {test['steps']} steps)"
        )
    else:
        text += f"; {result['slow_stage_reason']}"
    if key == "work_us":
        waits = [result["per_rank"][str(r)]["exposed_comm_us"] for r in result["ranks"] if r != slow]
        text += f"; the other ranks wait {statistics.median(waits) / 1e3:.1f} ms per step in communication"
    return text


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures logged as Polyaxon outputs."""
    slow = result["slowest_rank"]
    exposed = [result["per_rank"][str(r)]["exposed_comm_us"] for r in result["ranks"]]
    walls = [result["per_rank"][str(r)]["wall_us"] for r in result["ranks"]]
    return {
        "slowest_rank": slow,
        "straggler_p": result["straggler_test"]["p"],
        "slow_stage": result["slow_stage"],
        "slow_stage_excess_ms": (
            result["stage_excess_us"][result["slow_stage"]] / 1e3 if result["slow_stage"] else None
        ),
        "rank_step_wall_spread_ms": result["spread_median_us"]["wall_us"] / 1e3,
        "rank_work_spread_ms": (
            result["spread_median_us"]["work_us"] / 1e3 if result["spread_median_us"]["work_us"] is not None else None
        ),
        "max_exposed_comm_share": (
            max(e / w for e, w in zip(exposed, walls)) if None not in exposed and all(walls) else None
        ),
        "ranks_left_out": len(result.get("ranks_left_out") or {}),
        "verdict": result["verdict"],
    }


def _ms(v, fmt="{:.1f}"):
    return "n/a" if v is None else fmt.format(v / 1e3)


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_text(result: dict[str, Any]) -> str:
    ranks = result["ranks"]
    cols = [f"rank {r}" for r in ranks]
    lines = [
        f"verdict: {result['verdict']}",
        f"evidence across {len(ranks)} ranks, steps {result['steps_aligned']} aligned by ProfilerStep number",
        f"communication: {', '.join(f'rank {r}: {s}' for r, s in result['comm_source'].items())}",
    ]
    for what, why in (result.get("ranks_left_out") or {}).items():
        lines.append(f"left out: {what}: {why}")
    if result["comm_null_reason"]:
        lines.append(f"communication figures: n/a ({result['comm_null_reason']})")
    for r, why in result["figures_unavailable"].items():
        lines.append(f"rank {r}: n/a: {why}")
    rows = [
        ("step wall ms", "wall_us"),
        ("work ms (wall - exposed comm)", "work_us"),
        ("comm ms", "comm_us"),
        ("exposed comm ms", "exposed_comm_us"),
        ("gpu idle ms", "gpu_idle_us"),
        ("input gap ms", "input_gap_us"),
        ("cpu input/next_batch ms", "next_batch_cpu_us"),
    ]
    table = [["mean per step"] + cols]
    for label, k in rows:
        table.append([label] + [_ms(result["per_rank"][str(r)][k]) for r in ranks])
    for n in SCOPES:
        table.append(
            [f"{n} ms ({'less wait' if result['stage_figure'] == 'scopes_less_wait_us' else 'cpu'})"]
            + [_ms(result["per_rank"][str(r)]["scopes_us"][n]) for r in ranks]
        )
    lines.append(_table(table[0], table[1:]))
    lines.append("")
    per_step = [
        ["step", "slowest"]
        + [f"{c} wall" for c in cols]
        + [f"{c} exposed comm" for c in cols]
        + ["wall spread", "work spread"]
    ]
    for s in result["per_step"]:
        per_step.append(
            [f"#{s['step']}", "tie" if s["slowest_rank"] is None else str(s["slowest_rank"])]
            + [_ms(s["ranks"][str(r)]["wall_us"]) for r in ranks]
            + [_ms(s["ranks"][str(r)]["exposed_comm_us"]) for r in ranks]
            + [_ms(s["spread"]["wall_us"]), _ms(s["spread"]["work_us"])]
        )
    lines.append(_table(per_step[0], per_step[1:]))
    lines.append("")
    test = result["straggler_test"]
    lines.append(
        f"straggler test: rank {test['candidate']} the slowest in {test['slowest_in']} of {test['steps']} "
        f"aligned steps{f' ({t} tied, left out)' if (t := test.get('tied_steps')) else ''}; p={test['p']:.2g} "
        f"(exact sign test, chance 1/{test['candidates']} a step, "
        f"{test['candidates']} candidates; a verdict needs p < {test['alpha']:g}, from "
        f"{test['steps_needed']} steps on)"
    )
    lines.append(
        f"excess of rank {result['candidate_rank']} over the others' median (ms/step, steps more): "
        + ", ".join(
            f"{n} {v / 1e3:+.1f} ({result['stage_test'][n]['more_in']}/{test['steps']})"
            for n, v in result["stage_excess_us"].items()
        )
    )
    if result["steps_missing"]:
        lines.append(f"steps missing on some ranks (left out): {result['steps_missing']}")
    lines.append(f"note: {attribution.CAVEAT}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens ranks", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="per-rank traces, or folders holding them (e.g. OUTPUTS/traces)")
    p.add_argument("--json", action="store_true", help="print the evidence as one JSON object")
    summarize.add_reading_options(p)
    args = p.parse_args(argv)
    if args.step_scope:
        p.error("--step-scope is not read here: ranks are aligned on their ProfilerStep#N steps")
    try:
        found = locate(args.paths)
        per_rank = []
        for k, (rank, paths) in enumerate(sorted(found["by_rank"].items()), start=1):
            per_rank.append(rank_figures(paths, rank, args.input_scope, lanes=False))  # the command draws nothing
            if len(found["by_rank"]) > PROGRESS_EVERY and k % PROGRESS_EVERY == 0:
                print(f"steplens ranks: read {k} of {len(found['by_rank'])} ranks", file=sys.stderr)
        result = across(per_rank, found["left_out"])
    except RanksError as e:
        say(f"steplens ranks: error: {e}", sys.stderr)
        return 1
    for what, why in result["ranks_left_out"].items():
        say(f"steplens ranks: {what} left out of the verdict: {why}", sys.stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        write(format_text(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
