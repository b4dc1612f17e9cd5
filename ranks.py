"""Evidence across ranks: per-rank DDP traces aligned on ProfilerStep numbers, and the rank holding the others back.

    python ranks.py OUTPUTS/traces            # every rank's traces under the folder (traces/rank{R}/...)
    python ranks.py A.pt.trace.json.gz B.pt.trace.json.gz --json

Its own command (summarize.py sits below it and cannot call it). A trace's rank is its
distributedInfo.rank (what torch.profiler writes once a process group exists), else the
rank{R} folder it lies in. Traces of different ranks are aligned on the step numbers
(ProfilerStep#N), never on their clocks, which are different machines' clocks.

Per rank and step (microseconds):
- wall: the ProfilerStep#N slice; input/next_batch CPU time; gpu_idle and input_gap as summarize.py
  computes them (GPU traces only).
- comm: time with communication running, clipped to the step. GPU traces: kernels whose name holds
  "nccl". CPU traces (gloo): the collectives' CPU events (gloo:all_reduce on gloo's threads,
  c10d::allreduce_ at the launch, ...).
- exposed_comm: comm time not overlapped by compute: by kernels on any stream (GPU), by CPU
  operators on any thread (CPU). It is time the rank waits for the others, plus the collective's own
  cost; work = wall - exposed_comm.
- scopes less wait: each scope's CPU time less the exposed communication inside it. DDP's allreduce
  runs inside loss.backward(), i.e. inside train/forward_backward, and on the CPU its wait blocks
  there; on a GPU the wait is a stream wait and the CPU scopes do not hold it.
Per rank, figures are means per step over the aligned steps. A GPU-bound rank's CPU can run ahead
of its GPU (summarize.py's cpu_runs_ahead): its NCCL kernels then run during later CPU steps, or
after the window, so clipping them to the CPU's steps measures nothing. That rank's comm,
exposed_comm and work are then null with the reason; its CPU figures (wall, scopes, input) stay.
A step's slowest rank has the most work in that step (the others wait for it); where some rank's
work is unavailable, the most wall time, and the result says which figures were unavailable.

A straggler is named only when one rank is the slowest in nearly every aligned step: an exact
one-sided sign test across the aligned steps. With R ranks and no straggler, each rank is the
slowest in a step with probability 1/R. The candidate is the rank slowest in the most steps, k of n;
p = R x P(X >= k) for X ~ Binomial(n, 1/R), at most 1: the factor R because the candidate is picked
after looking (with two ranks it is compare.py's two-sided sign test). A straggler is named where
p < 0.05. The smallest p that n steps can give is R^(1-n): two ranks need 6 aligned steps, slowest in
all 6, which is what the default profile (two cycles of three steps, 2-4 and 7-9) gives. Four ranks
need 4 steps, eight ranks 3. Fewer steps, or a rank slowest in fewer of them: "no consistent
straggler", with the reason, and the per-step table still shown.
A named straggler's stage: of the scopes whose CPU time (less wait) exceeds the other ranks' median
in enough steps for the one-sided sign test (p < 0.05, chance 1/2 a step), the one with the largest
excess per step. It describes a straggler already established; no scope, no stage, and it says why.

Inside a DDP run, train.py gathers the ranks' results here: bench_results (the global rate over
the longest rank window) and profile_evidence (this evidence, written and logged by rank 0).
"""

import argparse
import glob
import gzip
import json
import math
import os
import platform
import re
import statistics
import sys

import stepview
import summarize
from runinfo import write_atomic, write_json_atomic
from scopes import NEXT_BATCH, SCOPES

NCCL = "nccl"
CPU_COMM = ("c10d::", "gloo:", "nccl:", "record_param_comms", "allreduce", "all_reduce")
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
RUNS_AHEAD = "the CPU runs ahead of the GPU: GPU communication cannot be clipped to the CPU's steps"
NO_COMM = ("no communication events in the trace (no NCCL kernels, no gloo/c10d operators): "
           "not a distributed run, or a world of one")


ALPHA = 0.05


class RanksError(Exception):
    pass


# --------------------------------------------------------------------------- the exact sign test

def sign_test_p(n, k, chance=0.5, candidates=1):
    """Exact sign test: candidates x P(X >= k) for X ~ Binomial(n, chance), at most 1.

    One candidate: the one-sided test of a side fixed beforehand. Several: the side (or rank) was picked
    after looking, and each could have reached k (two candidates at chance 1/2: the two-sided test)."""
    tail = sum(math.comb(n, i) * chance ** i * (1 - chance) ** (n - i) for i in range(max(k, 0), n + 1))
    return min(1.0, candidates * tail)


def steps_needed(candidates, chance, alpha=ALPHA):
    """The fewest trials with which p < alpha is reachable at all (every trial on the candidate's side)."""
    n = 0
    while sign_test_p(n, n, chance, candidates) >= alpha:
        n += 1
    return n


# --------------------------------------------------------------------------- finding traces and ranks

def trace_rank(path, head_bytes=1 << 18):
    """distributedInfo.rank from the trace's head (it precedes traceEvents), else the rank{R} folder."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            head = f.read(head_bytes)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise RanksError(f"{path}: not a readable trace ({type(e).__name__}: {e})") from e
    found = None
    at = head.find('"distributedInfo"')
    if at >= 0:
        try:
            info, _ = json.JSONDecoder().raw_decode(head, head.index("{", at))
            found = int(info["rank"])
        except (ValueError, KeyError, TypeError):
            found = None
    folder = re.fullmatch(r"rank(\d+)", os.path.basename(os.path.dirname(os.path.abspath(path))))
    if found is not None and folder and int(folder.group(1)) != found:
        raise RanksError(f"{path}: the trace says rank {found} but lies in folder rank{folder.group(1)}")
    if found is None and folder:
        found = int(folder.group(1))
    if found is None:
        raise RanksError(f"{path}: no distributedInfo.rank in the trace and no rank{{R}} folder: which rank is it?")
    return found


def find_traces(paths):
    """{rank: [trace paths]} from trace files and folders (searched recursively)."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += [f for f in glob.glob(os.path.join(p, "**", "*"), recursive=True) if f.endswith(TRACE_SUFFIXES)]
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise RanksError(f"{p}: no such file or folder")
    by_rank = {}
    for f in sorted(files):
        by_rank.setdefault(trace_rank(f), []).append(f)
    if not by_rank:
        raise RanksError(f"no PyTorch profiler traces (*.pt.trace.json[.gz]) in {', '.join(paths)}")
    return by_rank


# --------------------------------------------------------------------------- one rank

def minus(a, b):
    """The parts of merged intervals a outside merged intervals b."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in summarize.clip(b, s, e):
            if bs > cur:
                out.append([cur, bs])
            cur = max(cur, be)
        if cur < e:
            out.append([cur, e])
    return out


def _is_cpu_comm(name):
    low = name.lower()
    return any(k in low for k in CPU_COMM)


def timelines(events):
    """Steps, the scopes, and the communication and compute intervals of one trace."""
    steps, scopes = [], {n: [] for n in SCOPES}
    nccl, kernels, cpu_comm, cpu_ops = [], [], {}, {}
    for ev in events:
        if ev.get("ph") != "X":
            continue
        try:
            s = float(ev["ts"])
            e = s + float(ev.get("dur", 0))
        except (KeyError, TypeError, ValueError):
            continue
        cat, name, thread = ev.get("cat", ""), ev.get("name", ""), (ev.get("pid"), ev.get("tid"))
        if cat == "user_annotation":
            if name.startswith("ProfilerStep#"):
                steps.append((int(name.split("#", 1)[1]), s, e))
            elif name in scopes:
                scopes[name].append([s, e])
            elif _is_cpu_comm(name):
                cpu_comm.setdefault(thread, []).append([s, e])
        elif cat == "kernel":
            (nccl if NCCL in name.lower() else kernels).append([s, e])
        elif cat == "cpu_op":
            (cpu_comm if _is_cpu_comm(name) else cpu_ops).setdefault(thread, []).append([s, e])
    if nccl:
        source, comm, compute = "nccl kernels", summarize.union(nccl), summarize.union(kernels)
    elif cpu_comm:
        source = "cpu (gloo/c10d operators)"
        comm = summarize.union([iv for ivs in cpu_comm.values() for iv in ivs])
        # An operator that encloses a collective (autograd's evaluate_function around DDP's hook, say)
        # is not compute while the collective runs: per thread, compute is operators less collectives.
        compute = summarize.union([iv for thread, ops in cpu_ops.items()
                                   for iv in minus(summarize.union(ops), summarize.union(cpu_comm.get(thread, [])))])
    else:
        source, comm, compute = None, [], []
    return {"steps": sorted(steps), "scopes": {n: summarize.union(v) for n, v in scopes.items()},
            "source": source, "comm": comm, "compute": compute}


def step_figures(t, number, a, b, evidence_step, runs_ahead=False):
    """runs_ahead: summarize.py found the trace's CPU running ahead of its GPU (GPU comm figures go)."""
    wall = b - a
    out = {"step": number, "wall_us": wall,
           "gpu_idle_us": evidence_step.get("gpu_idle_us"), "input_gap_us": evidence_step.get("input_gap_us"),
           "scopes_cpu_us": {n: summarize.total(summarize.clip(t["scopes"][n], a, b)) for n in SCOPES}}
    out["next_batch_cpu_us"] = out["scopes_cpu_us"][NEXT_BATCH]
    out["comm_null_reason"] = None
    if t["source"] is None:
        out.update(comm_us=None, exposed_comm_us=None, work_us=None, scopes_less_wait_us=None,
                   comm_null_reason=NO_COMM)
        return out
    if runs_ahead and not t["source"].startswith("cpu"):
        out.update(comm_us=None, exposed_comm_us=None, work_us=None, comm_null_reason=RUNS_AHEAD,
                   scopes_less_wait_us=dict(out["scopes_cpu_us"]))  # a GPU wait is no CPU scope time
        return out
    comm = summarize.clip(t["comm"], a, b)
    exposed = minus(comm, t["compute"])
    out["comm_us"] = summarize.total(comm)
    out["exposed_comm_us"] = summarize.total(exposed)
    out["work_us"] = wall - out["exposed_comm_us"]
    if t["source"].startswith("cpu"):
        # The CPU waits inside the scope that called the collective: take the wait out of it.
        out["scopes_less_wait_us"] = {n: out["scopes_cpu_us"][n] - summarize.total(summarize.intersect(
            summarize.clip(t["scopes"][n], a, b), exposed)) for n in SCOPES}
    else:
        out["scopes_less_wait_us"] = dict(out["scopes_cpu_us"])
    return out


def rank_figures(paths, rank=None):
    """One rank's per-step figures over its traces (cycles are pooled by step number)."""
    steps, sources, ahead, drawn = {}, set(), [], []
    for path in paths:
        if rank is None:
            rank = trace_rank(path)
        try:
            evidence = summarize.summarize_file(path, lanes=True)
            t = timelines(summarize.load_events(path))
        except summarize.TraceError as e:
            raise RanksError(str(e)) from e
        sources.add(t["source"])
        runs_ahead = bool(evidence.get("cpu_runs_ahead"))
        if runs_ahead and t["source"] and not t["source"].startswith("cpu"):
            ahead.append(path)
        drawn.append({"rows": stepview.lanes_of(evidence), "has_gpu": evidence["has_gpu"],
                      "gpu_slots": evidence.get("idle_basis") == "gpu_timeline"})
        by_number = {s["step"]: s for s in evidence["steps"]}
        for number, a, b in t["steps"]:
            if number in steps:
                raise RanksError(f"rank {rank}: ProfilerStep#{number} appears in two traces ({', '.join(paths)})")
            steps[number] = step_figures(t, number, a, b, by_number.get(number, {}), runs_ahead)
    if len(sources) > 1:
        raise RanksError(f"rank {rank}: traces disagree on their communication ({sources})")
    source = sources.pop() if sources else None
    reason = NO_COMM if not source else (f"{RUNS_AHEAD} ({len(ahead)} of {len(paths)} traces)" if ahead else None)
    return {"rank": rank, "traces": list(paths), "comm_source": source, "comm_null_reason": reason,
            "steps": [steps[k] for k in sorted(steps)], "drawn": drawn}


# --------------------------------------------------------------------------- across ranks

def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _mean(values):
    """Mean per step, or None where a step lacks the figure (a CPU trace has no GPU idle)."""
    values = list(values)
    return None if not values or None in values else sum(values) / len(values)


def across(per_rank):
    """Align the ranks' steps by number, the spread per step, the slowest rank and its slow stage."""
    by_rank = {}
    for fig in per_rank:
        if fig["rank"] in by_rank:
            raise RanksError(f"rank {fig['rank']} appears twice")
        by_rank[fig["rank"]] = fig
    if len(by_rank) < 2:
        raise RanksError(f"{len(by_rank)} rank(s) only: evidence across ranks needs two or more "
                         "(summarize.py reads one trace)")
    numbers = [{s["step"] for s in f["steps"]} for f in by_rank.values()]
    common = sorted(set.intersection(*numbers))
    if not common:
        raise RanksError("the ranks' traces share no ProfilerStep number: they were not profiled on the same steps")
    missing = {r: sorted(set().union(*numbers) - {s["step"] for s in f["steps"]}) for r, f in by_rank.items()}
    has_comm = all(f["comm_source"] for f in by_rank.values())
    ranks = sorted(by_rank)
    table = {r: {s["step"]: s for s in by_rank[r]["steps"]} for r in ranks}
    unavailable = {str(r): sorted({table[r][n]["comm_null_reason"] for n in common if table[r][n]["work_us"] is None})
                   for r in ranks}
    unavailable = {r: "; ".join(v) for r, v in unavailable.items() if v}
    key = "work_us" if has_comm and not unavailable else "wall_us"

    steps = []
    for n in common:
        row = {r: table[r][n] for r in ranks}
        spread = {k: (max(row[r][k] for r in ranks) - min(row[r][k] for r in ranks))
                  if all(row[r][k] is not None for r in ranks) else None
                  for k in ("wall_us", "work_us", "exposed_comm_us", "next_batch_cpu_us", "gpu_idle_us")}
        steps.append({"step": n, "ranks": {str(r): row[r] for r in ranks}, "spread": spread,
                      "slowest_rank": max(ranks, key=lambda r: row[r][key])})

    scope_key = "scopes_less_wait_us" if has_comm else "scopes_cpu_us"
    summary = {}
    for r in ranks:
        rows = [table[r][n] for n in common]
        summary[str(r)] = {
            **{k: _mean(x[k] for x in rows) for k in ("wall_us", "work_us", "comm_us", "exposed_comm_us",
                                                      "gpu_idle_us", "input_gap_us", "next_batch_cpu_us")},
            "scopes_us": {n: _mean(x[scope_key][n] for x in rows) for n in SCOPES},
            "comm_source": by_rank[r]["comm_source"]}
    test = straggler_test(ranks, steps, summary, key)
    candidate = test["candidate"]
    others = [r for r in ranks if r != candidate]
    # Per step, the candidate's scope time over the other ranks' median in that step.
    per_step_excess = {n: [table[candidate][s][scope_key][n] - statistics.median(table[r][s][scope_key][n]
                                                                                   for r in others) for s in common]
                       for n in SCOPES}
    excess = {n: sum(v) / len(v) for n, v in per_step_excess.items()}
    stages = {n: {"more_in": sum(x > 0 for x in v), "steps": len(v),
                  "p": sign_test_p(len(v), sum(x > 0 for x in v))} for n, v in per_step_excess.items()}
    named = test["p"] < ALPHA
    stage, stage_reason = None, None
    consistent = [n for n in SCOPES if stages[n]["p"] < ALPHA and excess[n] > 0]
    if not named:
        stage_reason = "no consistent straggler"
    elif consistent:
        stage = max(consistent, key=excess.get)
    else:
        stage_reason = (f"no scope of rank {candidate} takes longer than on the other ranks in enough steps "
                        f"(one-sided sign test, p < {ALPHA:g})")
    result = {
        "ranks": ranks, "steps_aligned": common, "steps_missing": {str(r): m for r, m in missing.items() if m},
        "comm_source": {str(r): by_rank[r]["comm_source"] for r in ranks},
        "comm_null_reason": None if has_comm else NO_COMM,
        "figures_unavailable": {r: f"comm, exposed_comm and work: {why}" for r, why in unavailable.items()},
        "slowest_by": key, "straggler_test": test, "slowest_rank": candidate if named else None,
        "straggler_reason": None if named else test["reason"],
        "slow_stage": stage, "slow_stage_reason": stage_reason,
        "candidate_rank": candidate, "stage_excess_us": excess, "stage_test": stages, "stage_figure": scope_key,
        "per_rank": summary, "per_step": steps,
        "spread_median_us": {k: _median(s["spread"][k] for s in steps) for k in steps[0]["spread"]},
        "traces": {str(r): by_rank[r]["traces"] for r in ranks},
    }
    result["verdict"] = verdict(result)
    return result


def straggler_test(ranks, steps, summary, key):
    """The exact sign test of "no straggler" over the aligned steps: is one rank the slowest in nearly every step?"""
    counts = {r: sum(s["slowest_rank"] == r for s in steps) for r in ranks}
    # The rank slowest in the most steps; between equal counts, the most `key` per step.
    candidate = max(ranks, key=lambda r: (counts[r], summary[str(r)][key]))
    n, k, chance = len(steps), counts[candidate], 1 / len(ranks)
    test = {"candidate": candidate, "steps": n, "slowest_in": k, "chance": chance, "candidates": len(ranks),
            "p": sign_test_p(n, k, chance, len(ranks)), "smallest_p": sign_test_p(n, n, chance, len(ranks)),
            "steps_needed": steps_needed(len(ranks), chance), "alpha": ALPHA}
    if test["smallest_p"] >= ALPHA:
        test["reason"] = (f"too few aligned steps for a verdict (n={n}, need {test['steps_needed']} with "
                          f"{len(ranks)} ranks); rank {candidate} was the slowest in {k} of {n}")
    elif test["p"] >= ALPHA:
        test["reason"] = (f"rank {candidate} was the slowest in {k} of {n} aligned steps only (sign test "
                          f"p={test['p']:.2g}, a verdict needs p < {ALPHA:g}): within the step-to-step noise")
    else:
        test["reason"] = None
    return test


def _compared(result):
    """What the ranks were compared on, in words."""
    if result["slowest_by"] == "work_us":
        return "work (wall less exposed communication)"
    if result["comm_null_reason"]:
        return "wall time (no communication in the trace)"
    return ("wall time (work unavailable on rank " + ", rank ".join(result["figures_unavailable"])
            + f": {RUNS_AHEAD})")


def verdict(result):
    key, what = result["slowest_by"], _compared(result)
    if result["slowest_rank"] is None:
        return f"no consistent straggler by {what}: {result['straggler_reason']}; the per-step table shows each step's slowest rank"
    slow, test = result["slowest_rank"], result["straggler_test"]
    s = result["per_rank"][str(slow)]
    others = statistics.median(result["per_rank"][str(r)][key] for r in result["ranks"] if r != slow)
    text = (f"slowest rank {slow}: the slowest in {test['slowest_in']} of {test['steps']} aligned steps (sign test "
            f"p={test['p']:.2g}); {what} {s[key] / 1e3:.1f} ms per step against {others / 1e3:.1f} ms "
            f"(median) on the other ranks")
    if result["slow_stage"]:
        st = result["slow_stage"]
        text += (f"; its {st} takes {result['stage_excess_us'][st] / 1e3:.1f} ms "
                 f"more per step than the other ranks' median (more in {result['stage_test'][st]['more_in']} "
                 f"of {test['steps']} steps)")
    else:
        text += f"; {result['slow_stage_reason']}"
    if key == "work_us":
        waits = [result["per_rank"][str(r)]["exposed_comm_us"] for r in result["ranks"] if r != slow]
        text += f"; the other ranks wait {statistics.median(waits) / 1e3:.1f} ms per step in communication"
    return text


def headline(result):
    """The figures logged as Polyaxon outputs."""
    slow = result["slowest_rank"]
    exposed = [result["per_rank"][str(r)]["exposed_comm_us"] for r in result["ranks"]]
    walls = [result["per_rank"][str(r)]["wall_us"] for r in result["ranks"]]
    return {
        "slowest_rank": slow,
        "straggler_p": result["straggler_test"]["p"],
        "slow_stage": result["slow_stage"],
        "slow_stage_excess_ms": (result["stage_excess_us"][result["slow_stage"]] / 1e3
                                 if result["slow_stage"] else None),
        "rank_step_wall_spread_ms": result["spread_median_us"]["wall_us"] / 1e3,
        "rank_work_spread_ms": (result["spread_median_us"]["work_us"] / 1e3
                                if result["spread_median_us"]["work_us"] is not None else None),
        "max_exposed_comm_share": (max(e / w for e, w in zip(exposed, walls))
                                   if None not in exposed and all(walls) else None),
        "verdict": result["verdict"],
    }


# --------------------------------------------------------------------------- printing

def _ms(v, fmt="{:.1f}"):
    return "n/a" if v is None else fmt.format(v / 1e3)


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_text(result):
    ranks = result["ranks"]
    cols = [f"rank {r}" for r in ranks]
    lines = [f"verdict: {result['verdict']}",
             f"evidence across {len(ranks)} ranks, steps {result['steps_aligned']} aligned by ProfilerStep number",
             f"communication: {', '.join(f'rank {r}: {s}' for r, s in result['comm_source'].items())}"]
    if result["comm_null_reason"]:
        lines.append(f"communication figures: n/a ({result['comm_null_reason']})")
    for r, why in result["figures_unavailable"].items():
        lines.append(f"rank {r}: n/a: {why}")
    rows = [("step wall ms", "wall_us"), ("work ms (wall - exposed comm)", "work_us"), ("comm ms", "comm_us"),
            ("exposed comm ms", "exposed_comm_us"), ("gpu idle ms", "gpu_idle_us"), ("input gap ms", "input_gap_us"),
            ("cpu input/next_batch ms", "next_batch_cpu_us")]
    table = [["mean per step"] + cols]
    for label, k in rows:
        table.append([label] + [_ms(result["per_rank"][str(r)][k]) for r in ranks])
    for n in SCOPES:
        table.append([f"{n} ms ({'less wait' if result['stage_figure'] == 'scopes_less_wait_us' else 'cpu'})"]
                     + [_ms(result["per_rank"][str(r)]["scopes_us"][n]) for r in ranks])
    lines.append(_table(table[0], table[1:]))
    lines.append("")
    per_step = [["step", "slowest"] + [f"{c} wall" for c in cols] + [f"{c} exposed comm" for c in cols]
                + ["wall spread", "work spread"]]
    for s in result["per_step"]:
        per_step.append([f"#{s['step']}", str(s["slowest_rank"])]
                        + [_ms(s["ranks"][str(r)]["wall_us"]) for r in ranks]
                        + [_ms(s["ranks"][str(r)]["exposed_comm_us"]) for r in ranks]
                        + [_ms(s["spread"]["wall_us"]), _ms(s["spread"]["work_us"])])
    lines.append(_table(per_step[0], per_step[1:]))
    lines.append("")
    test = result["straggler_test"]
    lines.append(f"straggler test: rank {test['candidate']} the slowest in {test['slowest_in']} of {test['steps']} "
                 f"aligned steps; p={test['p']:.2g} (exact sign test, chance 1/{test['candidates']} a step, "
                 f"{test['candidates']} candidates; a verdict needs p < {test['alpha']:g}, from "
                 f"{test['steps_needed']} steps on)")
    lines.append(f"excess of rank {result['candidate_rank']} over the others' median (ms/step, steps more): " +
                 ", ".join(f"{n} {v / 1e3:+.1f} ({result['stage_test'][n]['more_in']}/{test['steps']})"
                           for n, v in result["stage_excess_us"].items()))
    if result["steps_missing"]:
        lines.append(f"steps missing on some ranks (left out): {result['steps_missing']}")
    lines.append(f"note: {summarize.CAVEAT}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- a DDP run's results across ranks

BENCH_OUTPUTS = ("world_size", "rank_samples_per_sec", "longest_window_rank", "rank_rate_spread")


def bench_results(world, results):
    """The global rate: world_size x window samples / the longest window of any rank; each rank's own beside it.
    world: a distributed.World; in a world of one, results as they are."""
    if not world.active:
        return results
    mine = {"rank": world.rank, "samples_per_sec": results["samples_per_sec"],
            "window_seconds": results["window_seconds"], "window_samples": results["window_samples"],
            "host": platform.node(), "device": str(world.device)}
    every = world.all_gather(mine)
    # In DDP every rank waits for the slowest at each allreduce: the windows end up nearly equal,
    # and the longest one (often not the straggler's) sets the job's rate. The traces name the straggler.
    slowest = max(every, key=lambda r: r["window_seconds"])
    rates = [r["samples_per_sec"] for r in every]
    total = sum(r["window_samples"] for r in every)
    return {**results,
            "samples_per_sec": total / slowest["window_seconds"],
            "rank_samples_per_sec": results["samples_per_sec"],
            "world_size": world.world_size, "global_window_samples": total,
            "global_window_seconds": slowest["window_seconds"], "longest_window_rank": slowest["rank"],
            "rank_rate_spread": (max(rates) - min(rates)) / statistics.median(rates),
            "rank_window_spread_seconds": slowest["window_seconds"] - min(r["window_seconds"] for r in every),
            "ranks": every}


def describe_bench(results):
    """The bench line's DDP part: how the global rate was made; empty in a world of one."""
    if "ranks" not in results:
        return ""
    own = ", ".join(f"{r['samples_per_sec']:.1f}" for r in results["ranks"])
    return (f"; {results['world_size']} ranks: global rate over the longest window "
            f"({results['global_window_seconds']:.3f}s, rank {results['longest_window_rank']}); "
            f"the ranks' own rates {own} samples/s")


def profile_evidence(world, record, results):
    """Each rank's per-step figures, gathered on rank 0, which writes and logs the evidence across ranks."""
    if not world.active:
        return {}
    every = world.all_gather(rank_figures([c["trace"] for c in results["cycles"]], rank=world.rank))
    if not world.is_leader:
        return {}
    try:
        result = across(every)
    except RanksError as e:  # a world of one, say: the traces stand, the comparison is absent
        results["across_ranks"] = {"error": str(e)}
        print(f"ranks: no evidence across ranks ({e})", file=sys.stderr)
        return {}
    base = os.path.join(record.out_dir, "traces", "ranks")
    record.log_file(write_json_atomic(base + ".evidence.json", result), "evidence-ranks")
    record.log_file(write_atomic(base + ".evidence.txt", format_text(result)), "evidence-ranks-table")
    results["across_ranks"] = top = headline(result)
    print(f"ranks: {top['verdict']}", file=sys.stderr)
    top["pictures"] = draw_ranks(every, record, top["verdict"])
    return {k: v for k, v in top.items() if v is not None and k not in ("verdict", "pictures")}


def draw_ranks(every, record, said):
    """One picture per cycle with every rank's steps, a lane pair per step (stepview.py), saved and logged by rank 0;
    the pictures' paths (none, and one line saying why, without matplotlib)."""
    by_rank = sorted(every, key=lambda f: f["rank"])
    paths = []
    for k in range(min(len(f["drawn"]) for f in by_rank)):
        cycle = [f["drawn"][k] for f in by_rank]
        path = os.path.join(record.out_dir, "traces", f"picture-ranks-cycle{k + 1}.png")
        try:
            stepview.draw_groups([(f"rank {f['rank']} ", c["rows"]) for f, c in zip(by_rank, cycle)], path,
                                 f"cycle {k + 1}, every rank", said, all(c["has_gpu"] for c in cycle),
                                 any(c["gpu_slots"] for c in cycle))
        except stepview.NoPicture as e:
            print(f"ranks: {e}", file=sys.stderr)
            return []
        record.log_image(path, f"steps-ranks-cycle{k + 1}")
        paths.append(path)
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="ranks.py", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="per-rank traces, or folders holding them (e.g. OUTPUTS/traces)")
    p.add_argument("--json", action="store_true", help="print the evidence as one JSON object")
    args = p.parse_args(argv)
    try:
        result = across([rank_figures(paths, rank) for rank, paths in sorted(find_traces(args.paths).items())])
    except RanksError as e:
        print(f"ranks.py: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        sys.stdout.write(format_text(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
