"""The comparison itself: runs grouped by settings and machine, paired with the baseline, tested, flagged."""

import json
import math
import statistics
from typing import Any

from steplens.evidence import roofline
from steplens.evidence.formatting import OFF_AT_ZERO
from steplens.project.runs import MACHINE, MACHINE_IDS, CompareError
from steplens.stats import ALPHA, pairs_needed, sign_test, significance
from steplens.trace.reader import TraceError

LOSS_TOLERANCE, LOSS_FLOOR = 0.10, 0.05  # worse: final loss > baseline + max(0.10 x baseline, 0.05)
# profile_phase and checkpoint_every leave the training window as it is: a bench run of any phase has its rate
IGNORED = {
    "repeat",
    "output_dir",
    "data_dir",
    "mode",
    "trace_format",
    "profile_detail",
    "profile_phase",
    "checkpoint_every",
    "unprofiled_steps",
}


# A profile run has no bench window: its evidence stands beside a group whatever the window's length.
EVIDENCE_IGNORED = IGNORED | {"bench_steps", "warmup_steps"}


EVIDENCE = (
    "gpu_idle_share",
    "input_gap_share",
    "profiled_step_ms",
    "unprofiled_step_ms",
    "profiler_distortion",
    "profiler_distortion_se",
)


NO_FLOPS = "these runs predate train.py's FLOP count (no model_tflops_per_sec output)"


LOSS_WORSE = "loss worse than baseline"


def describe(rates: list[float]) -> dict[str, Any]:
    median = statistics.median(rates)
    return {
        "n": len(rates),
        "median": median,
        "min": min(rates),
        "max": max(rates),
        "spread": (max(rates) - min(rates)) / median if median else None,
    }


def pair_runs(
    base_runs: list[dict[str, Any]], runs: list[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], str]:
    """[(baseline run, run)]: each run with the baseline run beside it in the alternating order, and how.

    Same repeat index where every run of both groups has one, each index once per group (and some
    index shared); else start order: walking both groups' runs by created_at, two neighbours of
    different groups form a pair, each run in one pair at most.
    """

    def repeat(r):
        return r["settings"].get("repeat")

    indices_a, indices_b = [repeat(r) for r in base_runs], [repeat(r) for r in runs]
    if (
        None not in indices_a + indices_b
        and len(set(indices_a)) == len(indices_a)
        and len(set(indices_b)) == len(indices_b)
        and set(indices_a) & set(indices_b)
    ):
        by_index = {repeat(r): r for r in base_runs}
        return [(by_index[repeat(b)], b) for b in runs if repeat(b) in by_index], "repeat index"
    merged = sorted(
        [(r["created_at"], 0, r) for r in base_runs] + [(r["created_at"], 1, r) for r in runs],
        key=lambda t: (t[0], t[1]),
    )
    pairs, i = [], 0
    while i + 1 < len(merged):
        (_, ga, ra), (_, gb, rb) = merged[i], merged[i + 1]
        if ga != gb:
            pairs.append((ra, rb) if ga == 0 else (rb, ra))
            i += 2
        else:
            i += 1
    return pairs, "start order"


def setting(r: dict[str, Any], k: str) -> Any:
    """A setting's value for grouping: switched off (False, "off", 0 where it means off, or absent in older
    runs) is one value."""
    v = r["settings"].get(k)
    return None if v is False or v == "off" or (k in OFF_AT_ZERO and v == 0) else v


def baseline_groups(baseline: str, groups: list[list[dict[str, Any]]]) -> list[int]:
    """The groups (lists of runs) whose every run has each setting of baseline ("k=v, k2=v2"): a label names
    only the settings that vary, so "batch_size=128" still finds its group when runs varying in another
    setting join and the label grows. A value "off" matches a switched-off option, and so does 0 for a
    setting where 0 means off (lr_warmup_steps=0). Their indices."""
    pairs = [part.strip().split("=", 1) for part in baseline.split(",")]
    if not all(len(p) == 2 and p[0] for p in pairs):
        return []
    wanted = [(k, None if v == "off" or (k in OFF_AT_ZERO and v == "0") else v) for k, v in pairs]
    shown = lambda v: None if v is None else str(v)  # noqa: E731
    return [i for i, runs in enumerate(groups) if all(shown(setting(r, k)) == v for r in runs for k, v in wanted)]


def label(key: tuple[tuple[str, Any], ...]) -> str:
    """The group's settings; switched-off options are left out of the name."""
    shown = [f"{k}={v}" for k, v in key if v is not None]  # 0 is shown
    return ", ".join(shown) or ("defaults" if key else "all runs")


def machine_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(r["machine"].get(k) for k in MACHINE)


def short_id(value: str | None) -> str:
    """The first 8 characters of an id ("GPU-" left off), or "not recorded" (runs recorded before the ids, or
    a machine without one)."""
    return "not recorded" if value is None else str(value).removeprefix("GPU-")[:8]


def machine_label(key: tuple[Any, ...]) -> str:
    m = dict(zip(MACHINE, key))
    if all(v is None for v in key):
        return "unknown machine (runs without recorded facts)"
    cpus = "CPU budget not recorded" if m["cpu_budget"] is None else f"{m['cpu_budget']:g} CPUs"
    driver = "" if m["gpu"] == "cpu" else f", driver {m['driver'] or 'not recorded'}"
    ids = f"machine id {short_id(m['machine_id'])}, boot id {short_id(m['boot_id'])}"
    if m["gpu"] != "cpu":
        ids += f", GPU {short_id(m['gpu_uuid'])}"
    return f"host {m['host']} ({ids}): {m['gpu']}{driver}, torch {m['torch']}, CUDA {m['cuda']}, {cpus}"


def mixed_machines(bench: list[dict[str, Any]]) -> str:
    """One line naming each machine fact that differs between runs, with its values."""
    parts = []
    for i, k in enumerate(MACHINE):
        values = sorted(
            {
                "not recorded" if machine_key(r)[i] is None and k in MACHINE_IDS else str(machine_key(r)[i])
                for r in bench
            }
        )
        if len(values) > 1:
            parts.append(f"{k}: {', '.join(values)}")
    return "; ".join(parts)


def left_out_reason(r: dict[str, Any]) -> str | None:
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


def compare_records(
    records: list[dict[str, Any]],
    baseline: str | None = None,
    per_host: bool = False,
    loss_tolerance: float = LOSS_TOLERANCE,
    loss_floor: float = LOSS_FLOOR,
) -> dict[str, Any]:
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
        raise CompareError(
            f"the runs come from different machines ({mixed_machines(bench)}): their rates cannot "
            "be pooled; compare within each machine with --per-host, or select one machine's runs"
        )
    warnings = []
    if len(varying) > 1:
        warnings.append(
            f"groups differ in more than one setting ({', '.join(varying)}): "
            "a difference cannot be pinned on one of them"
        )
    crossed = [r["uuid"][:8] for r in bench if r.get("window_restarts")]
    if crossed:
        warnings.append(
            f"the timed window of {', '.join(crossed)} crossed an epoch boundary: its rate includes a "
            "new shuffle and, with DataLoader workers that are not persistent, their restart"
        )
    tables = [
        compare_machine(machine, runs, varying, baseline, records, len(machines) > 1)
        for machine, runs in sorted(machines.items(), key=lambda kv: [str(v) for v in kv[0]])
    ]
    for t in tables:
        flag_losses(t["groups"], loss_tolerance, loss_floor)
    return {
        "tables": tables,
        "pooled": pooled_pairs(tables),
        "varying": varying,
        "warnings": warnings,
        "alpha": ALPHA,
        "pairs_needed": pairs_needed(),
        "left_out": [{"uuid": r["uuid"], "name": r["name"], "why": why} for r, why in left_out],
    }


# What makes two machines one kind, whose pairs may pool: every machine fact but the host and the ids.
POOLED_KIND = tuple(k for k in MACHINE if k != "host" and k not in MACHINE_IDS)


def pooled_pairs(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group's pairs from every machine whose table has the same baseline, in one sign test.

    A pair never crosses machines: both its runs ran on one machine, one beside the other. The sign test
    counts pairs, and pairs of different machines are independent, so they add up; the rates themselves are
    never pooled. Only machines of one kind are pooled: the same GPU, driver, torch, CUDA and CPU budget (a new
    start of a machine, another host of the same kind), never an H100 with an H200. Only groups paired on two
    machines or more; a group whose loss was worse on any machine keeps that mark."""
    found: dict[tuple[Any, ...], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for t in tables:
        base = t["groups"][0]["group"]
        kind = tuple(t["machine"].get(k) for k in POOLED_KIND)
        if t["machine"].get("gpu") is None or t["machine"].get("torch") is None:  # runs without machine facts
            continue  # are of no known kind: never pooled with others
        for g in t["groups"][1:]:
            if g["pairs"]:
                found.setdefault((kind, base, g["group"]), []).append((t, g))
    pooled = []
    for (_, base, group), rows in found.items():
        if len(rows) < 2:
            continue
        ratios = [p["ratio"] for _, g in rows for p in g["pairs"]]
        test = sign_test(ratios)
        worse = [t["machine_label"] for t, g in rows if g["loss"] is not None and g["loss"]["worse_than_baseline"]]
        verdict = significance(test) + (f"; {LOSS_WORSE}" if worse else "")
        pooled.append(
            {
                "group": group,
                "baseline": base,
                "machines": [{"machine_label": t["machine_label"], "pairs": len(g["pairs"])} for t, g in rows],
                "ratios": ratios,
                "paired": {
                    "n": len(ratios),
                    "median": statistics.median(ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                },
                "sign_test": test,
                "verdict": verdict,
                "loss_worse_on": worse,
            }
        )
    return pooled


def order_key(key: tuple[tuple[str, Any], ...]) -> list[str]:
    return [json.dumps(v) if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:020.6f}" for _, v in key]


def compare_machine(
    machine: tuple[Any, ...],
    bench: list[dict[str, Any]],
    varying: list[str],
    baseline: str | None,
    records: list[dict[str, Any]],
    several: bool,
) -> dict[str, Any]:
    groups = {}
    for r in sorted(bench, key=lambda r: r["created_at"]):
        groups.setdefault(tuple((k, setting(r, k)) for k in varying), []).append(r)
    ordered = sorted(groups, key=order_key)
    if baseline is not None:
        labels = [label(k) for k in ordered]
        found = (
            [labels.index(baseline)] if baseline in labels else baseline_groups(baseline, [groups[k] for k in ordered])
        )
        if len(found) != 1:
            where = f" on {machine_label(machine)}" if several else ""
            if found:
                what = (
                    f"matches {len(found)} groups (all their runs have {baseline}); name one by its label or "
                    f"add the setting that tells them apart, e.g. '{baseline}, {varying[0]}=...'"
                )
            elif "=" not in baseline:
                what = "is none of the groups (give a group's label or KEY=VALUE settings)"
            else:
                what = "is none of the groups"
            raise CompareError(f"--baseline {baseline!r} {what}{where}; the groups: {'; '.join(labels)}")
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
            row.update(
                ratio=row["median"] / statistics.median(base_rates),
                ratio_bounds=(min(rates) / max(base_rates), max(rates) / min(base_rates)),
                pairing=how,
                pairs=[{"baseline": a["uuid"], "run": b["uuid"], "ratio": q} for (a, b), q in zip(pairs, ratios)],
                paired=(
                    {"n": len(ratios), "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
                    if ratios
                    else {"n": 0}
                ),
                sign_test=test,
                verdict=significance(test),
            )
        row["evidence"] = matching_evidence(records, runs[0]["settings"], machine)
        row["gpu_bound"] = gpu_bound(runs)
        row["ceiling"] = hardware_ceiling(runs)
        row["rank_spread"] = rank_spread(runs)
        row["loss"] = final_loss(runs)
        row["memory"] = peak_memory(runs)
        row["host"] = host_side(runs)
        rows.append(row)
    return {
        "machine": dict(zip(MACHINE, machine)),
        "machine_label": machine_label(machine),
        "groups": rows,
        "bench_runs": [
            {
                "uuid": r["uuid"],
                "created_at": r["created_at"],
                "samples_per_sec": r["samples_per_sec"],
                "group": label(tuple((k, setting(r, k)) for k in varying)),
            }
            for r in sorted(bench, key=lambda r: r["created_at"])
        ],
    }


def gpu_bound(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """Where every run measured its step's GPU time (train.py --cuda-graph): the window's rate over the
    rate that GPU time allows. Near 1: GPU-bound; not a measure of how close the GPU is to its peak."""
    shares = [r["outputs"].get("gpu_bound_share") for r in runs]
    ms = [r["outputs"].get("gpu_ms_per_step") for r in runs]
    rates = [r["outputs"].get("gpu_time_samples_per_sec") for r in runs]
    if any(v is None for v in shares + ms + rates):
        return None
    return {
        "median_share": statistics.median(shares),
        "min_share": min(shares),
        "median_gpu_ms_per_step": statistics.median(ms),
        "median_gpu_time_samples_per_sec": statistics.median(rates),
    }


def peak_memory(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The median of the runs' window peaks of GPU memory (MB), allocated and reserved; None where a run has none
    (a CPU run, or one from before the peak was logged)."""
    allocated = [r["outputs"].get("peak_allocated_mb") for r in runs]
    reserved = [r["outputs"].get("peak_reserved_mb") for r in runs]
    if any(v is None for v in allocated + reserved):
        return None
    return {
        "median_allocated_mb": statistics.median(allocated),
        "max_allocated_mb": max(allocated),
        "median_reserved_mb": statistics.median(reserved),
    }


HOST_FIGURES = ("cpus_used", "cpu_throttled_share", "input_supply_per_sec", "pss_peak_mb", "shm_peak_mb")


def supply_per_sec(outputs: dict[str, Any]) -> float | None:
    """The batches per second the DataLoader workers could supply (input_supply_per_sec; in runs that logged only
    input_supply_ms, its inverse, as train.py computes it)."""
    if outputs.get("input_supply_per_sec") is not None:
        return outputs["input_supply_per_sec"]
    ms = outputs.get("input_supply_ms")
    return round(1e3 / ms, 2) if ms else None


def host_side(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The bench window's host side, each the median over the group's runs: CPUs used, the throttled share, the
    workers' supply (batches/s), peak PSS of the main process and workers together, and /dev/shm's peak (MB).
    A figure is None unless every run logged it (runs from before it was logged, --gpu-input runs with no
    DataLoader), never 0."""
    out = {}
    for k in HOST_FIGURES:
        values = [supply_per_sec(r["outputs"]) if k == "input_supply_per_sec" else r["outputs"].get(k) for r in runs]
        out[k] = None if not values or any(v is None for v in values) else statistics.median(values)
    # samples/s of a DDP job counts every rank; one step of the job takes batch_size samples on each of them
    batch = {r["settings"].get("batch_size", 0) * (r["settings"].get("world_size") or 1) for r in runs}
    out["batch_size"] = batch.pop() if len(batch) == 1 else None
    return out


def final_loss(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The group's final loss: the median of its runs' loss_final, a diverged run (loss_diverged_step)
    counting as worse than any; None where a run carries neither (runs from before the loss was logged)."""
    finals = [
        math.inf if r["outputs"].get("loss_diverged_step") is not None else r["outputs"].get("loss_final") for r in runs
    ]
    if any(v is None for v in finals):
        return None
    median = statistics.median(finals)
    return {
        "final": None if math.isinf(median) else median,
        "diverged_runs": sum(map(math.isinf, finals)),
        "finals": [None if math.isinf(v) else v for v in finals],
        "worse_than_baseline": False,
    }


def flag_losses(rows: list[dict[str, Any]], tolerance: float, floor: float) -> None:
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


def rank_spread(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """DDP runs: the spread of the ranks' own rates ((max - min) / median within each run), over the group's runs."""
    spreads = [r["outputs"].get("rank_rate_spread") for r in runs]
    if any(v is None for v in spreads):
        return None
    return {"world_size": runs[0]["settings"]["world_size"], "median": statistics.median(spreads), "max": max(spreads)}


def hardware_ceiling(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Model TFLOP/s and MFU where every run counted its FLOPs; else None, said in the tables."""
    tflops = [r["outputs"].get("model_tflops_per_sec") for r in runs]
    if any(v is None for v in tflops):
        return None
    mfus = [r["outputs"].get("mfu") for r in runs]
    peaks = sorted({(r["outputs"].get("peak_tflops"), r["outputs"].get("peak_precision")) for r in runs}, key=str)
    per_sample = [r["outputs"].get("flops_per_sample") for r in runs]
    out = {
        "flops_per_sample": None if None in per_sample else statistics.median(per_sample),
        "median_tflops": statistics.median(tflops),
        "median_mfu": None,
        "peaks": peaks,
        "mfu_note": None,
    }
    if all(m is not None for m in mfus):
        out["median_mfu"] = statistics.median(mfus)
    else:
        from steplens.evidence.flops import PEAKS

        gpus = sorted({str(r["machine"].get("gpu")) for r in runs if r["outputs"].get("mfu") is None})
        out["mfu_note"] = "; ".join(
            "CPU run: no GPU peak"
            if g == "cpu"
            else (f"no dense peak known for {g}" if g not in PEAKS else f"{g}: MFU not logged")
            for g in gpus
        )
    return out


def matching_evidence(
    records: list[dict[str, Any]], settings: dict[str, Any], machine: tuple[Any, ...]
) -> dict[str, Any] | None:
    """Trace evidence of the latest succeeded profile run with the group's settings (all of them, not only
    those that vary between the bench groups: a profile run of another option must not stand in) on
    the same machine."""

    def same(r):
        keys = (set(r["settings"]) | set(settings)) - EVIDENCE_IGNORED
        return all(setting(r, k) == setting({"settings": settings}, k) for k in keys) and machine_key(r) == machine

    matches = [
        r
        for r in records
        if r["mode"] == "profile"
        and r["status"] == "succeeded"
        and same(r)
        and r["outputs"].get("profiled_step_ms")
        and r["settings"].get("profile_phase", "train") == "train"  # a validation or save capture: not the step's
    ]
    if not matches:
        return None
    r = sorted(matches, key=lambda r: r["created_at"])[-1]
    return {
        "uuid": r["uuid"],
        "profile_detail": r["settings"].get("profile_detail") or "full",
        **{k: r["outputs"].get(k) for k in EVIDENCE},
        "verdict": r["outputs"].get("verdict"),
        "pictures": r.get("pictures") or [],
        "verdict_stage": r["outputs"].get("verdict_stage"),
        "gpu_top_classes": r.get("gpu_top_classes"),
        "traces": r.get("traces") or [],
        "traces_recorded": r.get("traces_recorded") or 0,
    }


def group_roofline(evidence: dict[str, Any], builder: Any = None) -> dict[str, Any]:
    """The roofline by kernel class (roofline.roofline_section) of a group's profile run: its first trace found on
    this machine; builder: the model's (MODULE:FUNCTION, loaded) for CUDA-graph steps. Where there is none, or
    the trace or the model's batch size cannot be read, a roofline with no classes and the reason."""
    if not evidence["traces"]:
        why = (
            f"the run's traces are not on this machine ({evidence['traces_recorded']} listed in its run.json)"
            if evidence["traces_recorded"]
            else "no trace of the run here (its run.json lists none, or was not read: -p reads no trace)"
        )
        return roofline.absent(None, f"no roofline: {why}")
    path = evidence["traces"][0]
    try:
        model = roofline.model_for(path, builder, None, None) if builder else None
        return roofline.roofline_section(path, model=model)
    except (TraceError, ValueError) as e:
        return roofline.absent(path, f"no roofline: {e}")


def add_rooflines(result: dict[str, Any], builder: Any = None) -> None:
    """Each group's evidence, where a profile run stands beside the group, gets its "roofline" (group_roofline)."""
    for table in result["tables"]:
        for g in table["groups"]:
            if g["evidence"]:
                g["evidence"]["roofline"] = group_roofline(g["evidence"], builder)
