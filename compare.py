"""Compare repeated bench runs: alternating whole-job repeats, paired, with an exact sign test.

    python compare.py --offline .polyaxon-offline --out results/local --baseline workers=4
    python compare.py -p YOUR_PROJECT [-q 'tags:study1'] --out comparison --baseline workers=4
    python compare.py --offline ROOT --per-host ...   # runs of several machines: one table per machine

The tutorial's design: the baseline A and each option B run as whole jobs in alternating order
(A B A B ..., or A B C A B C ... for several options), so that a slow drift of the machine hits both
alike. Each run of B is paired with the run of A beside it in that order: the same --repeat index
where every run of both has one, else by start time (created_at), each run used once.

Per group, unpaired: n, median, min, max, spread ((max - min) / median), the ratio of medians to the
baseline and its min/max bounds (min(B)/max(A) to max(B)/min(A): the worst and best case ratios).
Per pair: the ratio B/A; the table gives the pairs' median ratio and range.

The test of "no difference": an exact two-sided sign test on the paired ratios. If the option changes
nothing, the two runs of a pair are exchangeable, so each ratio falls above or below 1 with probability
1/2 whatever the machine's noise: with k of n ratios above 1, p = min(1, 2 P(X <= min(k, n - k))) for
X ~ Binomial(n, 1/2), computed exactly. It is preferred here to the exact permutation test on log
ratios because one disturbed window (a stray process, a clock change) counts as one sign, not as a
large magnitude. Both share a floor: the smallest p that n pairs can give is 2 / 2^n, so p < 0.05
needs 6 pairs. Ties (a ratio of exactly 1) count for neither side and are dropped. Below the floor
the table says "too few repeats for a verdict (n=..., need ...)"; from it on, "faster" or "slower"
where p < 0.05, else "within the noise" (no difference shown with these pairs, which is not proof
that there is none).

Faster, and still learning: bench runs record their window's loss (train.py's loss_final, the mean loss
of the window's last 10 steps). Each group's final loss is the median over its runs; a group whose final
loss exceeds the baseline's by more than the tolerance (default: baseline + max(0.10 x baseline, 0.05);
--loss-tolerance and --loss-floor) is marked "loss worse than baseline", beside its rate and in its
verdict. A run whose loss diverged (not finite) counts as worse than any. A group whose runs carry no
loss (older runs) shows "-" and gets no mark; without a baseline loss, no group is marked.

Groups: runs whose recorded settings (run.json's settings, else the Polyaxon inputs) all agree, plus
world_size and nproc_per_node (1 for runs without DDP), except repeat, output_dir, data_dir, mode,
trace_format and profile_detail, which never split groups. Every other setting does, whether or not
it changes what is measured: --force-workers, --seed, --device, --lr, --momentum, --weight-decay and
the DDP flags split groups as much as --workers, --batch-size, --data, --bench-steps, --warmup-steps
and each option. A switched-off setting (False, "off", or absent in older runs) is one value. Runs of different
machines (host, GPU, driver, torch, CUDA, CPU budget) are never pooled: compare.py refuses and names
what differs, or with --per-host makes one table per machine. Per group, where the runs carry them:
model TFLOP/s and MFU (train.py's FLOP count; older runs lack it and the table says so), the
GPU-bound share of --cuda-graph runs, and the trace evidence of a matching profile run, with its verdict
and, for offline runs, the paths of its step pictures (profile runs never enter the rates). Writes comparison.md, .csv, .json and .png together, all or none; without
matplotlib, the tables alone and a one-line note.
"""

import argparse
import csv
import io
import json
import math
import os
import statistics
import sys
import tempfile
import textwrap
from datetime import datetime, timezone

from ranks import sign_test_p
from runinfo import recorded_file

IGNORED = {"repeat", "output_dir", "data_dir", "mode", "trace_format", "profile_detail"}
# A profile run has no bench window: its evidence stands beside a group whatever the window's length.
EVIDENCE_IGNORED = IGNORED | {"bench_steps", "warmup_steps"}
# The ids tell apart machines that share a hostname; runs recorded before them have None, a value of its own.
MACHINE_IDS = ("machine_id", "boot_id", "gpu_uuid")
MACHINE = ("host", "gpu", "driver", "torch", "cuda", "cpu_budget") + MACHINE_IDS
EVIDENCE = ("gpu_idle_share", "input_gap_share", "profiled_step_ms", "unprofiled_step_ms", "profiler_distortion",
            "profiler_distortion_se")
ALPHA = 0.05
# Outputs of older train.py runs under their former names ("kernel-time limit"), read where the new ones are missing.
OLD_NAMES = {"gpu_bound_share": "share_of_gpu_limit", "gpu_time_samples_per_sec": "gpu_limit_samples_per_sec"}
NO_FLOPS = "these runs predate train.py's FLOP count (no model_tflops_per_sec output)"
LOSS_TOLERANCE, LOSS_FLOOR = 0.10, 0.05  # worse: final loss > baseline + max(0.10 x baseline, 0.05)
LOSS_WORSE = "loss worse than baseline"


class CompareError(Exception):
    pass


# --------------------------------------------------------------------------- gathering

def moment(value):
    """A start time as an ISO string in UTC, so that runs from either source sort in start order."""
    if value in (None, ""):
        return ""
    try:
        d = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).isoformat()


def failure_of(conditions):
    """reason: message of the last failed status condition, if any."""
    for c in reversed(conditions or []):
        c = c if isinstance(c, dict) else c.to_dict()
        if c.get("type") == "failed":
            return ": ".join(str(v) for v in (c.get("reason"), c.get("message")) if v) or None
    return None


def record_from(uuid, name, created_at, status, inputs, outputs, run_json, conditions=None, base=None):
    """One run, the same shape whether it came from Polyaxon or from an offline folder.

    The machine facts come from the run's outputs (env_*, logged by train.py) where present, else from
    its run.json (older runs). base: an offline run's folder, where the step pictures recorded on another
    machine are found.
    """
    run_json = run_json or {}
    outputs = dict(outputs or {})
    for new, old in OLD_NAMES.items():
        if outputs.get(new) is None and outputs.get(old) is not None:
            outputs[new] = outputs[old]
    settings = run_json.get("settings") or inputs or None
    if settings is not None:
        settings = {**settings, **world_settings(run_json, outputs)}
    if "env_host" in outputs:
        machine = {k: outputs.get(f"env_{k}") for k in MACHINE}
        facts = "outputs"
    else:
        env = run_json.get("environment") or {}
        machine = {"host": env.get("hostname"), "gpu": env.get("gpu"), "driver": env.get("driver"),
                   "torch": env.get("torch"), "cuda": env.get("cuda"),
                   "cpu_budget": (run_json.get("cpu_budget") or {}).get("cpus"),
                   "machine_id": env.get("machine_id"), "boot_id": env.get("boot_id"), "gpu_uuid": env.get("gpu_uuid")}
        facts = "run.json" if env else None
    return {
        "uuid": uuid, "name": name, "created_at": moment(created_at), "status": status,
        "logged_inputs": settings is not None, "settings": dict(settings or {}),
        "mode": (settings or {}).get("mode"), "outputs": outputs, "samples_per_sec": outputs.get("samples_per_sec"),
        "machine": machine, "facts_from": facts, "error": run_json.get("error") or failure_of(conditions),
        "window_restarts": outputs.get("epoch_restarts_in_window",
                                       (run_json.get("results") or {}).get("epoch_restarts_in_window")),
        "pictures": [p for p in (recorded_file(c["picture"], base) for c in (run_json.get("results") or {})
                                 .get("cycles") or [] if c.get("picture")) if p],
        # GPU time by kernel class (summarize.headline), recorded in run.json by profile runs that have it
        "gpu_top_classes": outputs.get("gpu_top_classes")
        or ((run_json.get("results") or {}).get("evidence") or {}).get("gpu_top_classes"),
    }


def gather_offline(root):
    runs_dir = os.path.join(root, "runs")
    if not os.path.isdir(root):
        raise CompareError(f"{root} does not exist or is not a folder: give the folder POLYAXON_OFFLINE_ROOT "
                           "pointed at when train.py ran")
    if not os.path.isdir(runs_dir):
        raise CompareError(f"{root} holds no offline runs (no runs/ folder): run train.py first, "
                           "or give the folder POLYAXON_OFFLINE_ROOT pointed at")
    records = []
    for uuid in sorted(os.listdir(runs_dir)):
        base = os.path.join(runs_dir, uuid)
        try:
            with open(os.path.join(base, "run.plx.json")) as f:
                run = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue  # not a finished offline run
        run_json = None
        try:
            with open(os.path.join(base, "outputs", "run.json")) as f:
                run_json = json.load(f)
        except (OSError, json.JSONDecodeError):
            pass
        records.append(record_from(uuid, run.get("name"), run.get("created_at"), run.get("status"),
                                   run.get("inputs"), run.get("outputs"), run_json, run.get("status_conditions"),
                                   base))
    return records


def gather_polyaxon(project, query=None, limit=500):
    """Runs of a Polyaxon project from one listing of their inputs and outputs.

    The listing (what RunClient.get_runs_io flattens, without the start times and states that pairing
    needs) carries train.py's machine facts as env_* outputs; run.json is downloaded only for runs
    that lack them (older ones).
    """
    from polyaxon.client import RunClient
    owner, _, name = project.rpartition("/")
    client = RunClient(owner=owner or None, project=name)
    runs = client.list(query=query, sort="created_at", limit=limit).results or []
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            run_json = None
            if "env_host" not in (r.outputs or {}):
                rc = RunClient(owner=client.owner, project=name, run_uuid=r.uuid)
                try:
                    path = rc.download_artifact(path="outputs/run.json", path_to=os.path.join(tmp, r.uuid))
                    with open(path) as f:
                        run_json = json.load(f)
                except Exception as e:  # a run without run.json (failed early) is still listed
                    print(f"compare.py: note: {r.uuid}: no machine facts in its outputs and no run.json "
                          f"({type(e).__name__})", file=sys.stderr)
            status = getattr(r.status, "value", r.status)
            records.append(record_from(r.uuid, r.name, r.created_at, status, r.inputs, r.outputs, run_json,
                                       r.status_conditions))
    return records


# --------------------------------------------------------------------------- statistics

def describe(rates):
    median = statistics.median(rates)
    return {"n": len(rates), "median": median, "min": min(rates), "max": max(rates),
            "spread": (max(rates) - min(rates)) / median if median else None}


def smallest_p(n):
    """The smallest two-sided p the exact sign test (or the exact paired permutation test) can give with n pairs."""
    return sign_test_p(n, n, candidates=2)


def pairs_needed(alpha=ALPHA):
    """The fewest pairs with which p < alpha is reachable at all."""
    n = 0
    while smallest_p(n) >= alpha:
        n += 1
    return n


def sign_test(ratios):
    """Exact two-sided sign test of "no difference" on paired ratios B/A; ties (exactly 1) are dropped."""
    untied = [r for r in ratios if r != 1]
    n, above = len(untied), sum(r > 1 for r in untied)
    # Two candidates (faster or slower), the side picked by the data: the two-sided test.
    return {"pairs": len(ratios), "untied": n, "above_1": above, "below_1": n - above,
            "p": sign_test_p(n, max(above, n - above), candidates=2), "smallest_p": smallest_p(n),
            "needed": pairs_needed()}


def verdict(test, alpha=ALPHA):
    if test["smallest_p"] >= alpha:
        untied = f", {test['untied']} untied" if test["untied"] != test["pairs"] else ""
        return f"too few repeats for a verdict (n={test['pairs']} pairs{untied}, need {test['needed']})"
    if test["p"] < alpha:
        return "faster" if test["above_1"] > test["below_1"] else "slower"
    return "within the noise"


def pair_runs(base_runs, runs):
    """[(baseline run, run)]: each run with the baseline run beside it in the alternating order, and how.

    Same repeat index where every run of both groups has one, each index once per group (and some
    index shared); else start order: walking both groups' runs by created_at, two neighbours of
    different groups form a pair, each run in one pair at most.
    """
    def repeat(r):
        return r["settings"].get("repeat")
    indices_a, indices_b = [repeat(r) for r in base_runs], [repeat(r) for r in runs]
    if None not in indices_a + indices_b and len(set(indices_a)) == len(indices_a) \
            and len(set(indices_b)) == len(indices_b) and set(indices_a) & set(indices_b):
        by_index = {repeat(r): r for r in base_runs}
        return [(by_index[repeat(b)], b) for b in runs if repeat(b) in by_index], "repeat index"
    merged = sorted([(r["created_at"], 0, r) for r in base_runs] + [(r["created_at"], 1, r) for r in runs],
                    key=lambda t: (t[0], t[1]))
    pairs, i = [], 0
    while i + 1 < len(merged):
        (_, ga, ra), (_, gb, rb) = merged[i], merged[i + 1]
        if ga != gb:
            pairs.append((ra, rb) if ga == 0 else (rb, ra))
            i += 2
        else:
            i += 1
    return pairs, "start order"


# --------------------------------------------------------------------------- grouping

OFF_AT_ZERO = {"lr_warmup_steps"}  # 0 means no ramp, as in older runs that lack the setting


def setting(r, k):
    """A setting's value for grouping: switched off (False, "off", 0 where it means off, or absent in older
    runs) is one value."""
    v = r["settings"].get(k)
    return None if v is False or v == "off" or (k in OFF_AT_ZERO and v == 0) else v


def baseline_groups(baseline, groups):
    """The groups (lists of runs) whose every run has each setting of baseline ("k=v, k2=v2"): a label names
    only the settings that vary, so "batch_size=128" still finds its group when runs varying in another
    setting join and the label grows. A value "off" matches a switched-off option, and so does 0 for a
    setting where 0 means off (lr_warmup_steps=0). Their indices."""
    pairs = [part.strip().split("=", 1) for part in baseline.split(",")]
    if not all(len(p) == 2 and p[0] for p in pairs):
        return []
    wanted = [(k, None if v == "off" or (k in OFF_AT_ZERO and v == "0") else v) for k, v in pairs]
    shown = lambda v: None if v is None else str(v)  # noqa: E731
    return [i for i, runs in enumerate(groups)
            if all(shown(setting(r, k)) == v for r in runs for k, v in wanted)]


def label(key):
    """The group's settings; switched-off options are left out of the name."""
    shown = [f"{k}={v}" for k, v in key if v is not None]  # 0 is shown
    return ", ".join(shown) or ("defaults" if key else "all runs")


def machine_key(r):
    return tuple(r["machine"].get(k) for k in MACHINE)


def short_id(value):
    """The first 8 characters of an id ("GPU-" left off), or "not recorded" (runs recorded before the ids, or
    a machine without one)."""
    return "not recorded" if value is None else str(value).removeprefix("GPU-")[:8]


def machine_label(key):
    m = dict(zip(MACHINE, key))
    if all(v is None for v in key):
        return "unknown machine (runs without recorded facts)"
    cpus = "CPU budget not recorded" if m["cpu_budget"] is None else f"{m['cpu_budget']:g} CPUs"
    driver = "" if m["gpu"] == "cpu" else f", driver {m['driver'] or 'not recorded'}"
    ids = f"machine id {short_id(m['machine_id'])}, boot id {short_id(m['boot_id'])}"
    if m["gpu"] != "cpu":
        ids += f", GPU {short_id(m['gpu_uuid'])}"
    return f"host {m['host']} ({ids}): {m['gpu']}{driver}, torch {m['torch']}, CUDA {m['cuda']}, {cpus}"


def mixed_machines(bench):
    """One line naming each machine fact that differs between runs, with its values."""
    parts = []
    for i, k in enumerate(MACHINE):
        values = sorted({"not recorded" if machine_key(r)[i] is None and k in MACHINE_IDS else str(machine_key(r)[i])
                         for r in bench})
        if len(values) > 1:
            parts.append(f"{k}: {', '.join(values)}")
    return "; ".join(parts)


def left_out_reason(r):
    if not r["logged_inputs"]:
        why = f"never logged its inputs (status {r['status']}"
        return why + (f": {r['error']})" if r["error"] else ")")
    if r["mode"] == "profile":
        return "profile run: profiled steps are not throughput evidence"
    if r["mode"] != "bench":
        return f"mode={r['mode']}: not a bench run"
    if r["status"] != "succeeded":
        return f"status {r['status']}" + (f": {r['error']}" if r["error"] else "")
    if r["samples_per_sec"] is None:
        return "no samples_per_sec output"
    return None


def compare_records(records, baseline=None, per_host=False, loss_tolerance=LOSS_TOLERANCE, loss_floor=LOSS_FLOOR):
    """Split, group, describe, pair and test; pure, so it is tested on fabricated records.

    baseline: a group label such as "workers=4" to compare against (default: the first group), or settings
    that only one group has (baseline_groups).
    per_host: one table per machine instead of refusing runs of several machines.
    loss_tolerance, loss_floor: a group's final loss is worse than the baseline's above
    baseline + max(loss_tolerance x baseline, loss_floor).
    """
    left_out, bench = [], []
    for r in records:
        why = left_out_reason(r)
        if why:
            left_out.append((r, why))
        else:
            bench.append(r)
    if not bench:
        raise CompareError("no succeeded bench runs to compare (run train.py --mode bench first)")
    keys = sorted({k for r in bench for k in r["settings"]} - IGNORED)
    varying = [k for k in keys if len({json.dumps(setting(r, k)) for r in bench}) > 1]
    machines = {}
    for r in bench:
        machines.setdefault(machine_key(r), []).append(r)
    if len(machines) > 1 and not per_host:
        raise CompareError(f"the runs come from different machines ({mixed_machines(bench)}): their rates cannot "
                           "be pooled; compare within each machine with --per-host, or select one machine's runs")
    warnings = []
    if len(varying) > 1:
        warnings.append(f"groups differ in more than one setting ({', '.join(varying)}): "
                        "a difference cannot be pinned on one of them")
    crossed = [r["uuid"][:8] for r in bench if r.get("window_restarts")]
    if crossed:
        warnings.append(f"the timed window of {', '.join(crossed)} crossed an epoch boundary: its rate includes a "
                        "new shuffle and, with DataLoader workers that are not persistent, their restart")
    tables = [compare_machine(machine, runs, varying, baseline, records, len(machines) > 1)
              for machine, runs in sorted(machines.items(), key=lambda kv: [str(v) for v in kv[0]])]
    for t in tables:
        flag_losses(t["groups"], loss_tolerance, loss_floor)
    return {"tables": tables, "varying": varying, "warnings": warnings, "alpha": ALPHA,
            "pairs_needed": pairs_needed(),
            "left_out": [{"uuid": r["uuid"], "name": r["name"], "why": why} for r, why in left_out]}


def order_key(key):
    return [json.dumps(v) if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:020.6f}"
            for _, v in key]


def compare_machine(machine, bench, varying, baseline, records, several):
    groups = {}
    for r in sorted(bench, key=lambda r: r["created_at"]):
        groups.setdefault(tuple((k, setting(r, k)) for k in varying), []).append(r)
    ordered = sorted(groups, key=order_key)
    if baseline is not None:
        labels = [label(k) for k in ordered]
        found = ([labels.index(baseline)] if baseline in labels
                 else baseline_groups(baseline, [groups[k] for k in ordered]))
        if len(found) != 1:
            where = f" on {machine_label(machine)}" if several else ""
            if found:
                what = (f"matches {len(found)} groups (all their runs have {baseline}); name one by its label or "
                        f"add the setting that tells them apart, e.g. '{baseline}, {varying[0]}=...'")
            elif "=" not in baseline:
                what = "is none of the groups (give a group's label or KEY=VALUE settings)"
            else:
                what = "is none of the groups"
            raise CompareError(f"--baseline {baseline!r} {what}{where}: {'; '.join(labels)}")
        ordered.insert(0, ordered.pop(found[0]))
    base = groups[ordered[0]]
    base_rates = [r["samples_per_sec"] for r in base]
    rows = []
    for key in ordered:
        runs = groups[key]
        rates = [r["samples_per_sec"] for r in runs]
        row = {"group": label(key), "key": key, **describe(rates), "rates": rates, "uuids": [r["uuid"] for r in runs]}
        if key == ordered[0]:
            row["verdict"] = "baseline"
        else:
            pairs, how = pair_runs(base, runs)
            ratios = [b["samples_per_sec"] / a["samples_per_sec"] for a, b in pairs]
            test = sign_test(ratios)
            row.update(ratio=row["median"] / statistics.median(base_rates),
                       ratio_bounds=(min(rates) / max(base_rates), max(rates) / min(base_rates)),
                       pairing=how, pairs=[{"baseline": a["uuid"], "run": b["uuid"], "ratio": q}
                                           for (a, b), q in zip(pairs, ratios)],
                       paired=({"n": len(ratios), "median": statistics.median(ratios), "min": min(ratios),
                                "max": max(ratios)} if ratios else {"n": 0}),
                       sign_test=test, verdict=verdict(test))
        row["evidence"] = matching_evidence(records, runs[0]["settings"], machine)
        row["gpu_bound"] = gpu_bound(runs)
        row["ceiling"] = hardware_ceiling(runs)
        row["rank_spread"] = rank_spread(runs)
        row["loss"] = final_loss(runs)
        rows.append(row)
    return {"machine": dict(zip(MACHINE, machine)), "machine_label": machine_label(machine), "groups": rows,
            "bench_runs": [{"uuid": r["uuid"], "created_at": r["created_at"], "samples_per_sec": r["samples_per_sec"],
                            "group": label(tuple((k, setting(r, k)) for k in varying))}
                           for r in sorted(bench, key=lambda r: r["created_at"])]}


def gpu_bound(runs):
    """Where every run measured its step's GPU time (train.py --cuda-graph): the window's rate over the
    rate that GPU time allows. Near 1: GPU-bound; not a measure of how close the GPU is to its peak."""
    shares = [r["outputs"].get("gpu_bound_share") for r in runs]
    ms = [r["outputs"].get("gpu_ms_per_step") for r in runs]
    rates = [r["outputs"].get("gpu_time_samples_per_sec") for r in runs]
    if any(v is None for v in shares + ms + rates):
        return None
    return {"median_share": statistics.median(shares), "min_share": min(shares),
            "median_gpu_ms_per_step": statistics.median(ms),
            "median_gpu_time_samples_per_sec": statistics.median(rates)}


def final_loss(runs):
    """The group's final loss: the median of its runs' loss_final, a diverged run (loss_diverged_step)
    counting as worse than any; None where a run carries neither (runs from before the loss was logged)."""
    finals = [math.inf if r["outputs"].get("loss_diverged_step") is not None else r["outputs"].get("loss_final")
              for r in runs]
    if any(v is None for v in finals):
        return None
    median = statistics.median(finals)
    return {"final": None if math.isinf(median) else median, "diverged_runs": sum(map(math.isinf, finals)),
            "finals": [None if math.isinf(v) else v for v in finals], "worse_than_baseline": False}


def flag_losses(rows, tolerance, floor):
    """Mark each group whose final loss exceeds the baseline's (rows[0]) by more than the tolerance."""
    base = rows[0]["loss"]
    if base is None or base["final"] is None:
        return
    limit = base["final"] + max(tolerance * base["final"], floor)
    for row in rows[1:]:
        loss = row["loss"]
        if loss is not None and (loss["final"] is None or loss["final"] > limit):
            loss["worse_than_baseline"] = True
            row["verdict"] = f"{row['verdict']}; {LOSS_WORSE}"
    for row in rows:
        if row["loss"] is not None:
            row["loss"].update(limit=limit, tolerance=tolerance, floor=floor)


def fmt_loss(loss):
    """The final-loss cell: '-' for runs without a loss, the median, and the mark when it is worse."""
    if loss is None:
        return "-"
    shown = "diverged" if loss["final"] is None else f"{loss['final']:.3f}"
    return f"{shown} ({LOSS_WORSE})" if loss["worse_than_baseline"] else shown


def world_settings(run_json, outputs):
    """world_size and nproc_per_node as settings, so that grouping never pools runs of different world sizes
    (a run without them, from before DDP, was one process)."""
    world = run_json.get("distributed") or {}
    return {"world_size": world.get("world_size", (outputs or {}).get("world_size", 1)),
            "nproc_per_node": world.get("local_world_size", 1)}


def rank_spread(runs):
    """DDP runs: the spread of the ranks' own rates ((max - min) / median within each run), over the group's runs."""
    spreads = [r["outputs"].get("rank_rate_spread") for r in runs]
    if any(v is None for v in spreads):
        return None
    return {"world_size": runs[0]["settings"]["world_size"], "median": statistics.median(spreads),
            "max": max(spreads)}


def hardware_ceiling(runs):
    """Model TFLOP/s and MFU where every run counted its FLOPs; else None, said in the tables."""
    tflops = [r["outputs"].get("model_tflops_per_sec") for r in runs]
    if any(v is None for v in tflops):
        return None
    mfus = [r["outputs"].get("mfu") for r in runs]
    peaks = sorted({(r["outputs"].get("peak_tflops"), r["outputs"].get("peak_precision")) for r in runs}, key=str)
    per_sample = [r["outputs"].get("flops_per_sample") for r in runs]
    out = {"flops_per_sample": None if None in per_sample else statistics.median(per_sample),
           "median_tflops": statistics.median(tflops), "median_mfu": None, "peaks": peaks, "mfu_note": None}
    if all(m is not None for m in mfus):
        out["median_mfu"] = statistics.median(mfus)
    else:
        from flops import PEAKS
        gpus = sorted({str(r["machine"].get("gpu")) for r in runs if r["outputs"].get("mfu") is None})
        out["mfu_note"] = "; ".join("CPU run: no GPU peak" if g == "cpu" else
                                    (f"no dense peak known for {g}" if g not in PEAKS else f"{g}: MFU not logged")
                                    for g in gpus)
    return out


def matching_evidence(records, settings, machine):
    """Trace evidence of the latest succeeded profile run with the group's settings (all of them, not only
    those that vary between the bench groups: a profile run of another option must not stand in) on
    the same machine."""
    def same(r):
        keys = (set(r["settings"]) | set(settings)) - EVIDENCE_IGNORED
        return all(setting(r, k) == setting({"settings": settings}, k) for k in keys) and machine_key(r) == machine
    matches = [r for r in records if r["mode"] == "profile" and r["status"] == "succeeded"
               and same(r) and r["outputs"].get("profiled_step_ms")]
    if not matches:
        return None
    r = sorted(matches, key=lambda r: r["created_at"])[-1]
    return {"uuid": r["uuid"], "profile_detail": r["settings"].get("profile_detail") or "full",
            **{k: r["outputs"].get(k) for k in EVIDENCE}, "verdict": r["outputs"].get("verdict"),
            "pictures": r.get("pictures") or [], "verdict_stage": r["outputs"].get("verdict_stage"),
            "gpu_top_classes": r.get("gpu_top_classes")}


# --------------------------------------------------------------------------- writing

def fmt_opt(v, fmt):
    return "n/a" if v is None else fmt.format(v)


def fmt_rate(v):
    return f"{v / 1000:.2f}k" if v >= 1000 else f"{v:.1f}"


def fmt_share(v):
    return "n/a" if v is None else f"{v:.2f}"


def fmt_p(p):
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def kernel_class_lines(groups):
    """What the GPU does in the GPU-bound groups (a --cuda-graph bench, or a profile verdict of GPU compute):
    the three largest kernel classes and their shares of the GPU work, from the matching profile run."""
    bound = [g for g in groups if g.get("gpu_bound") or g["evidence"].get("verdict_stage") == "GPU compute"]
    if not bound:
        return ""
    lines = [f"- {g['group']}: {g['evidence'].get('gpu_top_classes') or 'n/a (the profile run predates kernel classes)'}"
             for g in bound]
    return ("\nGPU time by kernel class in the GPU-bound groups (largest three, share of the GPU work a step "
            "launches; kernels.py):\n\n" + "\n".join(lines) + "\n")


def markdown_table(table, links_from=None):
    out = io.StringIO()
    out.write("| group | n | median samples/s | final loss | min | max | spread | ratio of medians | min/max bounds "
              "| pairs | paired ratio: median (range) | sign test p | verdict |\n" + "|---" * 13 + "|\n")
    for g in table["groups"]:
        cells = ["baseline", "", "", "", ""]
        if "ratio" in g:
            paired = g["paired"]
            cells = [f"{g['ratio']:.2f}", f"{g['ratio_bounds'][0]:.2f}-{g['ratio_bounds'][1]:.2f}", str(paired["n"]),
                     (f"{paired['median']:.3f} ({paired['min']:.3f}-{paired['max']:.3f})" if paired["n"] else ""),
                     fmt_p(g["sign_test"]["p"])]
        shown = "" if g["verdict"] == "baseline" else g["verdict"]
        out.write(f"| {g['group']} | {g['n']} | {fmt_rate(g['median'])} | {fmt_loss(g['loss'])} | {fmt_rate(g['min'])} "
                  f"| {fmt_rate(g['max'])} "
                  f"| {g['spread']:.2f} | {' | '.join(cells)} | {shown} |\n")
    compared = [g for g in table["groups"] if "ratio" in g and g["pairs"]]
    if compared:
        out.write("\nPairs (each run over the baseline run beside it in the alternating order):\n\n")
        for g in compared:
            ratios = " ".join(f"{p['ratio']:.3f}" for p in g["pairs"])
            out.write(f"- {g['group']} (by {g['pairing']}): {ratios}\n")

    with_flops = [g for g in table["groups"] if g["ceiling"]]
    without = [g["group"] for g in table["groups"] if not g["ceiling"]]
    out.write("\nModel FLOPs (train.py's count, forward and backward convolutions and matmuls) and MFU "
              "(achieved over the GPU's dense peak for the precision used):\n\n")
    if with_flops:
        out.write("| group | GFLOP per sample | median TFLOP/s | median MFU | peak TFLOP/s (precision) |\n"
                  "|---|---|---|---|---|\n")
        for g in with_flops:
            c = g["ceiling"]
            mfu = f"{c['median_mfu']:.3f}" if c["median_mfu"] is not None else f"n/a ({c['mfu_note']})"
            peaks = ", ".join(f"{p:g} ({q})" if p is not None else "n/a" for p, q in c["peaks"])
            per_sample = "n/a" if c["flops_per_sample"] is None else f"{c['flops_per_sample'] / 1e9:.3f}"
            out.write(f"| {g['group']} | {per_sample} | {c['median_tflops']:.2f} | {mfu} | "
                      f"{peaks} |\n")
    if without and not with_flops:
        out.write(f"TFLOP/s and MFU absent for every group: {NO_FLOPS}.\n")
    elif without:
        out.write(f"\nTFLOP/s and MFU absent for {'; '.join(without)}: {NO_FLOPS}.\n")

    bound = [g for g in table["groups"] if g["gpu_bound"]]
    if bound:
        out.write("\nGPU-bound share (--cuda-graph runs): the window's rate over the rate the step's own GPU time "
                  "allows (back-to-back graph replays, CUDA events). Near 1 the step is GPU-bound; it does not say "
                  "how close the GPU runs to its arithmetic peak (that is MFU):\n\n")
        out.write("| group | GPU ms per step | samples/s the GPU time allows | median GPU-bound share | lowest |\n"
                  "|---|---|---|---|---|\n")
        for g in bound:
            b = g["gpu_bound"]
            out.write(f"| {g['group']} | {b['median_gpu_ms_per_step']:.3f} | "
                      f"{fmt_rate(b['median_gpu_time_samples_per_sec'])} | {b['median_share']:.3f} | "
                      f"{b['min_share']:.3f} |\n")

    distributed = [g for g in table["groups"] if g.get("rank_spread")]
    if distributed:
        out.write("\nDistributed runs (samples/s is the global rate, set by the longest rank window):\n\n")
        out.write("| group | world size | median global samples/s | per-rank spread (median) "
                  "| per-rank spread (max) |\n|---|---|---|---|---|\n")
        for g in distributed:
            sp = g["rank_spread"]
            out.write(f"| {g['group']} | {sp['world_size']} | {fmt_rate(g['median'])} | {sp['median']:.1%} | "
                      f"{sp['max']:.1%} |\n")

    evidence = [g for g in table["groups"] if g["evidence"]]
    if evidence:
        out.write("\nTrace evidence (profile runs of the same settings; profiler distortion = profiled step over "
                  "unprofiled steps timed before and after the capture in the same run, +/- one standard error; below 1 "
                  "only when queued batches served the profiled steps or the host's pace changed):\n\n")
        out.write("| group | capture | GPU idle share | input gap share of idle | profiled step ms "
                  "| unprofiled step ms | profiler distortion | median samples/s |\n|---|---|---|---|---|---|---|---|\n")
        for g in evidence:
            e = g["evidence"]
            se, digits = e.get("profiler_distortion_se"), 2
            if se is not None and se < 0.005:
                digits = 3  # graph replays: a steady pace, an error below what two decimals show
            se = "" if se is None else f" +/- {se:.{digits}f}"
            out.write(f"| {g['group']} | {e['profile_detail']} | {fmt_share(e['gpu_idle_share'])} | "
                      f"{fmt_share(e['input_gap_share'])} | {e['profiled_step_ms']:.1f} | "
                      f"{fmt_opt(e.get('unprofiled_step_ms'), '{:.1f}')} | "
                      f"{fmt_opt(e.get('profiler_distortion'), '{:.' + str(digits) + 'f}x')}{se} | "
                      f"{fmt_rate(g['median'])} |\n")
        without = [g["group"] for g in table["groups"] if not g["evidence"]]
        if without:
            out.write(f"\nNo profile run of the same settings on this machine: {'; '.join(without)}.\n")
        for g in evidence:
            e = g["evidence"]
            if e.get("verdict") or e.get("pictures"):
                shown = ", ".join(f"[{os.path.basename(p)}]({os.path.relpath(p, links_from or os.curdir)})"
                                  for p in e["pictures"])
                out.write(f"\n- {g['group']}: {e.get('verdict') or 'no verdict recorded'}"
                          + (f" Step pictures: {shown}" if shown else "") + "\n")
        out.write(kernel_class_lines(evidence))
        first, last = table["groups"][0], max(table["groups"], key=lambda g: g["median"])
        if first["evidence"] and last["evidence"] and first is not last:
            a, b = first["evidence"], last["evidence"]
            out.write(f"\n{first['group']} -> {last['group']}: input gap share {fmt_share(a['input_gap_share'])} -> "
                      f"{fmt_share(b['input_gap_share'])}; GPU idle share {fmt_share(a['gpu_idle_share'])} -> "
                      f"{fmt_share(b['gpu_idle_share'])}; {fmt_rate(first['median'])} -> {fmt_rate(last['median'])} "
                      "samples/s (medians)\n")
    return out.getvalue()


def markdown(result, links_from=None):
    """The tables as Markdown; links_from: the folder the file will lie in, which links are relative to
    (default: the current folder)."""
    out = io.StringIO()
    for i, table in enumerate(result["tables"]):
        out.write(f"{'' if i == 0 else chr(10)}Machine: {table['machine_label']}\n\n")
        out.write(markdown_table(table, links_from))
    for w in result["warnings"]:
        out.write(f"\nWARNING: {w}\n")
    if result["left_out"]:
        out.write("\nLeft out of the rates: " + "; ".join(f"{r['uuid'][:8]} ({r['why']})" for r in result["left_out"])
                  + "\n")
    need = result["pairs_needed"]
    out.write(f"\nMethod: whole-job repeats in alternating order; each run is paired with the baseline run beside it "
              f"(same repeat index, else start time). Test: exact two-sided sign test on the paired ratios, "
              f"p = 2 P(Binomial(n, 1/2) <= min(k, n - k)) with k ratios above 1 of n; with n pairs the smallest "
              f"possible p is 2/2^n, so a verdict at p < {result['alpha']} needs n >= {need}. \"within the noise\": "
              f"no difference shown with these pairs. Min/max bounds: min(group)/max(baseline) to "
              f"max(group)/min(baseline).\n")
    return out.getvalue()


CSV_COLUMNS = ["machine", "group", "n", "median", "min", "max", "spread", "ratio", "bound_low", "bound_high",
               "pairing", "pairs", "paired_median", "paired_min", "paired_max", "sign_test_p", "verdict",
               "final_loss", "loss_worse_than_baseline",
               "flops_per_sample", "median_tflops", "median_mfu", "gpu_bound_share", "gpu_idle_share",
               "input_gap_share", "profiled_step_ms", "unprofiled_step_ms", "profiler_distortion", "profile_detail",
               "rates"]


def loss_cells(loss):
    """The CSV's final_loss and loss_worse_than_baseline: empty for runs without a loss."""
    if loss is None:
        return "", ""
    return ("diverged" if loss["final"] is None else loss["final"]), loss["worse_than_baseline"]


def csv_text(result):
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(CSV_COLUMNS)
    for table in result["tables"]:
        for g in table["groups"]:
            e, c, b = g["evidence"] or {}, g["ceiling"] or {}, g["gpu_bound"] or {}
            paired = g.get("paired") or {}
            w.writerow([table["machine_label"], g["group"], g["n"], g["median"], g["min"], g["max"], g["spread"],
                        g.get("ratio", 1.0), *(g.get("ratio_bounds") or ("", "")), g.get("pairing", ""),
                        paired.get("n", ""), paired.get("median", ""), paired.get("min", ""), paired.get("max", ""),
                        (g.get("sign_test") or {}).get("p", ""), g["verdict"],
                        *loss_cells(g["loss"]), c.get("flops_per_sample") or "",
                        c.get("median_tflops", ""), "" if c.get("median_mfu") is None else c["median_mfu"],
                        b.get("median_share", ""), e.get("gpu_idle_share", ""), e.get("input_gap_share", ""),
                        e.get("profiled_step_ms", ""), "" if e.get("unprofiled_step_ms") is None else e["unprofiled_step_ms"],
                        "" if e.get("profiler_distortion") is None else e["profiler_distortion"],
                        e.get("profile_detail", ""), " ".join(f"{r:.1f}" for r in g["rates"])])
    return out.getvalue()


def json_text(result):
    tables = [{**t, "groups": [{k: v for k, v in g.items() if k != "key"} for g in t["groups"]]}
              for t in result["tables"]]
    return json.dumps({**result, "tables": tables}, indent=2, sort_keys=True, default=str) + "\n"


def plot(result, path):
    """Each run's rate as a point in run order, coloured by group, with each group's median; one panel per machine."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tables = result["tables"]
    fig, axes = plt.subplots(len(tables), 1, figsize=(8, 4.5 * len(tables)), dpi=120, squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, table in zip(axes[:, 0], tables):
        for i, g in enumerate(table["groups"]):
            xs = [n for n, r in enumerate(table["bench_runs"], start=1) if r["group"] == g["group"]]
            ys = [r["samples_per_sec"] for r in table["bench_runs"] if r["group"] == g["group"]]
            name = textwrap.fill(f"{g['group']} (median {fmt_rate(g['median'])})", 100, subsequent_indent="  ")
            ax.scatter(xs, ys, color=colors(i % 10), label=name, zorder=3)
            ax.axhline(g["median"], color=colors(i % 10), linewidth=0.8, alpha=0.6)
        ax.set_xlabel("run order")
        ax.set_ylabel("samples/s (bench window)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        # Below the axes: group labels of many options are long and would cover the points.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.15), frameon=False)
        title = f"{len(table['bench_runs'])} bench runs in {len(table['groups'])} groups"
        ax.set_title(textwrap.fill(title + (f"; {table['machine_label']}" if len(tables) > 1 else ""), 90), fontsize=9)
    fig.savefig(path, format="png", bbox_inches="tight")
    plt.close(fig)
    return path


def matplotlib_missing():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


def write_outputs(result, out_dir):
    """comparison.md, .csv, .json and .png, all or none: each is written to a temp file first and the
    temp files are renamed only once every one of them is complete. Without matplotlib there is no
    picture, and an older comparison.png is removed (it would not match the new tables).

    Returns the written paths and a note (None, or why the picture is missing).
    """
    os.makedirs(out_dir, exist_ok=True)
    texts = {"markdown": ("comparison.md", markdown(result, out_dir)), "csv": ("comparison.csv", csv_text(result)),
             "json": ("comparison.json", json_text(result))}
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
            note = ("comparison.png not drawn: the plot needs matplotlib (pip install matplotlib); "
                    "the tables are written")
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


def log_to_polyaxon(paths):
    """Inside a Polyaxon run: the picture as an image, the tables as artifacts."""
    from polyaxon import tracking
    from runinfo import managed_identity
    tracking.init(**managed_identity())
    if "png" in paths:
        tracking.log_image(data=paths["png"], name="comparison")
    for kind in ("markdown", "csv", "json"):
        tracking.log_artifact(path=paths[kind], name=f"comparison-{kind}")
    tracking.end()


def main(argv=None):
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--offline", metavar="PATH", help="a folder of offline runs (POLYAXON_OFFLINE_ROOT)")
    src.add_argument("-p", "--project", help="a Polyaxon project ([owner/]name)")
    p.add_argument("-q", "--query", default=None, help="Polyaxon query to select runs, e.g. 'tags:study1'")
    p.add_argument("--baseline", default=None,
                   help="group to compare against, by its label or by settings only it has, e.g. workers=4 "
                        "(default: the first)")
    p.add_argument("--per-host", action="store_true",
                   help="runs of several machines (host, GPU, driver, torch, CUDA, CPU budget): one table per "
                        "machine (default: refuse to pool them)")
    p.add_argument("--loss-tolerance", type=float, default=LOSS_TOLERANCE,
                   help="a group's final loss is worse than the baseline's above baseline x (1 + this), "
                        f"or above baseline + --loss-floor when that is larger (default: {LOSS_TOLERANCE})")
    p.add_argument("--loss-floor", type=float, default=LOSS_FLOOR,
                   help="the smallest excess over the baseline's final loss that counts as worse, for losses "
                        f"near zero (default: {LOSS_FLOOR})")
    p.add_argument("--out", default="comparison", help="folder for comparison.md/.csv/.json/.png (default: comparison)")
    args = p.parse_args(argv)
    for name in ("loss_tolerance", "loss_floor"):
        if not (getattr(args, name) >= 0 and math.isfinite(getattr(args, name))):
            p.error(f"--{name.replace('_', '-')} must be a finite number >= 0, got {getattr(args, name)}")
    try:
        records = gather_offline(args.offline) if args.offline else gather_polyaxon(args.project, args.query)
        result = compare_records(records, baseline=args.baseline, per_host=args.per_host,
                                 loss_tolerance=args.loss_tolerance, loss_floor=args.loss_floor)
    except CompareError as e:
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 1
    paths, note = write_outputs(result, args.out)
    sys.stdout.write(markdown(result))
    if note:
        print(f"compare.py: note: {note}", file=sys.stderr)
    print(f"\nwritten: {', '.join(paths.values())}", file=sys.stderr)
    if os.environ.get("POLYAXON_RUN_INSTANCE"):
        log_to_polyaxon(paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
