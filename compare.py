"""Compare repeated bench runs: typical rate, spread, and whether a difference exceeds the noise.

    python compare.py --offline .polyaxon-offline --out results/local     # local offline runs
    python compare.py -p YOUR_PROJECT [-q 'tags:bench'] --out comparison  # runs of a Polyaxon project

Bench runs are grouped by the settings that differ between them (workers, batch size, data,
...; the repeat index and paths are ignored). Per group: n, median, min, max and spread
((max - min) / median). Each group is compared with the first (the baseline) by the ratio of
medians with a bootstrap 95% interval (10,000 resamples of each group, seed 0) and the min/max
bounds (worst and best case ratios). Profile runs are left out of the rates (profiler overhead is
no evidence about a loader setting) and named; where a profile run matches a group, its trace
evidence is shown beside the rate. Writes comparison.md, comparison.csv and comparison.png.
"""

import argparse
import csv
import io
import json
import os
import random
import statistics
import sys
import tempfile
import textwrap

IGNORED = {"repeat", "output_dir", "data_dir", "mode", "bench_steps", "trace_format", "warmup_steps", "profile_detail"}
ENVIRONMENT = ("gpu", "torch", "cuda", "cpu_budget")
EVIDENCE = ("gpu_idle_share", "input_gap_share", "profiled_step_ms")
BOOTSTRAP = 10_000


class CompareError(Exception):
    pass


# --------------------------------------------------------------------------- gathering

def record_from(uuid, name, created_at, status, inputs, outputs, run_json):
    """One run, the same shape whether it came from Polyaxon or from an offline folder."""
    run_json = run_json or {}
    settings = dict(run_json.get("settings") or inputs or {})
    env = run_json.get("environment") or {}
    budget = (run_json.get("cpu_budget") or {}).get("cpus")
    return {
        "uuid": uuid, "name": name, "created_at": str(created_at or ""), "status": status,
        "mode": settings.get("mode"), "settings": settings, "outputs": outputs or {},
        "samples_per_sec": (outputs or {}).get("samples_per_sec"),
        "environment": {"gpu": env.get("gpu"), "torch": env.get("torch"), "cuda": env.get("cuda"),
                        "cpu_budget": budget},
    }


def gather_offline(root):
    runs_dir = os.path.join(root, "runs")
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
                                   run.get("inputs"), run.get("outputs"), run_json))
    return records


def gather_polyaxon(project, query=None, limit=500):
    """Runs of a Polyaxon project through the client; run.json is downloaded for the environment."""
    from polyaxon.client import RunClient
    owner, _, name = project.rpartition("/")
    client = RunClient(owner=owner or None, project=name)
    runs = client.list(query=query, sort="created_at", limit=limit).results or []
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            run_json = None
            rc = RunClient(owner=client.owner, project=name, run_uuid=r.uuid)
            try:
                path = rc.download_artifact(path="outputs/run.json", path_to=os.path.join(tmp, r.uuid))
                with open(path) as f:
                    run_json = json.load(f)
            except Exception as e:  # a run without run.json (failed early) is still listed
                print(f"compare.py: note: {r.uuid}: no run.json ({type(e).__name__})", file=sys.stderr)
            status = getattr(r.status, "value", r.status)
            records.append(record_from(r.uuid, r.name, r.created_at, status, r.inputs, r.outputs, run_json))
    return records


# --------------------------------------------------------------------------- statistics

def describe(rates):
    median = statistics.median(rates)
    return {"n": len(rates), "median": median, "min": min(rates), "max": max(rates),
            "spread": (max(rates) - min(rates)) / median if median else None}


def bootstrap_ratio(base, other, resamples=BOOTSTRAP, seed=0):
    """95% percentile interval of median(other) / median(base), resampling each group."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(other, k=len(other))) /
                    statistics.median(rng.choices(base, k=len(base))) for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def label(key):
    """The group's settings; switched-off options (False, None, "off") are left out of the name."""
    shown = [f"{k}={v}" for k, v in key if not (v is False or v is None or v == "off")]  # 0 is shown
    return ", ".join(shown) or ("defaults" if key else "all runs")


def compare_records(records, baseline=None):
    """Split, group, describe and compare; pure, so it is tested on fabricated records.

    baseline: a group label such as "workers=4" to compare against (default: the first group).
    """
    left_out, bench = [], []
    for r in records:
        if r["mode"] != "bench":
            left_out.append((r, f"mode={r['mode']}: profiled runs are not throughput evidence"))
        elif r["status"] != "succeeded":
            left_out.append((r, f"status {r['status']}"))
        elif r["samples_per_sec"] is None:
            left_out.append((r, "no samples_per_sec output"))
        else:
            bench.append(r)
    if not bench:
        raise CompareError("no succeeded bench runs to compare (run train.py --mode bench first)")
    keys = sorted({k for r in bench for k in r["settings"]} - IGNORED)
    varying = [k for k in keys if len({json.dumps(r["settings"].get(k)) for r in bench}) > 1]
    groups = {}
    for r in sorted(bench, key=lambda r: r["created_at"]):
        key = tuple((k, r["settings"].get(k)) for k in varying)
        groups.setdefault(key, []).append(r)
    ordered = sorted(groups, key=lambda k: [json.dumps(v) if not isinstance(v, (int, float)) else f"{v:020.6f}"
                                            for _, v in k])
    if baseline is not None:
        labels = [label(k) for k in ordered]
        if baseline not in labels:
            raise CompareError(f"--baseline {baseline!r} is none of the groups: {', '.join(labels)}")
        ordered.insert(0, ordered.pop(labels.index(baseline)))
    warnings = []
    if len(varying) > 1:
        warnings.append(f"groups differ in more than one setting ({', '.join(varying)}): "
                        "a difference cannot be pinned on one of them")
    for env_key in ENVIRONMENT:
        values = {json.dumps(r["environment"].get(env_key)) for r in bench}
        if len(values) > 1:
            per_group = {label(k): sorted({str(r["environment"].get(env_key)) for r in groups[k]}) for k in ordered}
            warnings.append(f"runs differ in {env_key}, not only in the setting under study: {per_group}; "
                            "the result is conditional on the workload and the machine")
    rows = []
    base_rates = [r["samples_per_sec"] for r in groups[ordered[0]]]
    for key in ordered:
        rates = [r["samples_per_sec"] for r in groups[key]]
        row = {"group": label(key), "key": key, **describe(rates), "rates": rates,
               "uuids": [r["uuid"] for r in groups[key]],
               "environment": {e: sorted({str(r["environment"].get(e)) for r in groups[key]}) for e in ENVIRONMENT}}
        if key != ordered[0]:
            lo, hi = bootstrap_ratio(base_rates, rates)
            row.update(ratio=row["median"] / statistics.median(base_rates), ratio_ci95=(lo, hi),
                       ratio_bounds=(min(rates) / max(base_rates), max(rates) / min(base_rates)))
            row["verdict"] = ("exceeds the noise" if lo > 1 or hi < 1 else "within the noise")
            if row["ratio_bounds"][0] > 1 or row["ratio_bounds"][1] < 1:
                row["verdict"] += "; the ranges do not overlap"
        row["evidence"] = matching_evidence(records, groups[key][0]["settings"])
        row["gpu_limit"] = gpu_limit(groups[key])
        rows.append(row)
    return {"groups": rows, "varying": varying, "warnings": warnings,
            "left_out": [{"uuid": r["uuid"], "name": r["name"], "why": why} for r, why in left_out],
            "bench_runs": [{"uuid": r["uuid"], "created_at": r["created_at"], "samples_per_sec": r["samples_per_sec"],
                            "group": label(tuple((k, r["settings"].get(k)) for k in varying))}
                           for r in sorted(bench, key=lambda r: r["created_at"])]}


def gpu_limit(runs):
    """Where every run measured its kernel-time limit (train.py --cuda-graph): how close it ran to it."""
    shares = [r["outputs"].get("share_of_gpu_limit") for r in runs]
    ms = [r["outputs"].get("gpu_ms_per_step") for r in runs]
    rates = [r["outputs"].get("gpu_limit_samples_per_sec") for r in runs]
    if any(v is None for v in shares + ms + rates):
        return None
    return {"median_share": statistics.median(shares), "min_share": min(shares),
            "median_gpu_ms_per_step": statistics.median(ms), "median_limit_samples_per_sec": statistics.median(rates)}


def matching_evidence(records, settings):
    """Trace evidence of the latest succeeded profile run with the group's settings (all of them, not only
    those that vary between the bench groups: a profile run of another option must not stand in)."""
    def same(r):
        keys = (set(r["settings"]) | set(settings)) - IGNORED
        return all(r["settings"].get(k) == settings.get(k) for k in keys)
    matches = [r for r in records if r["mode"] == "profile" and r["status"] == "succeeded"
               and same(r) and r["outputs"].get("profiled_step_ms")]
    if not matches:
        return None
    r = sorted(matches, key=lambda r: r["created_at"])[-1]
    return {"uuid": r["uuid"], **{k: r["outputs"].get(k) for k in EVIDENCE}}


# --------------------------------------------------------------------------- writing

def fmt_rate(v):
    return f"{v / 1000:.2f}k" if v >= 1000 else f"{v:.1f}"


def fmt_share(v):
    return "n/a" if v is None else f"{v:.2f}"


def markdown(result):
    out = io.StringIO()
    out.write("| group | n | median samples/s | min | max | spread | ratio vs first | bootstrap 95% | min/max bounds | verdict |\n")
    out.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for g in result["groups"]:
        ratio = f"{g['ratio']:.2f}" if "ratio" in g else "baseline"
        ci = f"{g['ratio_ci95'][0]:.2f}-{g['ratio_ci95'][1]:.2f}" if "ratio" in g else ""
        bounds = f"{g['ratio_bounds'][0]:.2f}-{g['ratio_bounds'][1]:.2f}" if "ratio" in g else ""
        out.write(f"| {g['group']} | {g['n']} | {fmt_rate(g['median'])} | {fmt_rate(g['min'])} | "
                  f"{fmt_rate(g['max'])} | {g['spread']:.2f} | {ratio} | {ci} | {bounds} | {g.get('verdict', '')} |\n")
    limited = [g for g in result["groups"] if g.get("gpu_limit")]
    if limited:
        out.write("\nKernel-time limit (GPU time per step of back-to-back graph replays, CUDA events):\n\n")
        out.write("| group | GPU ms per step | limit samples/s | median share of the limit | lowest share |\n"
                  "|---|---|---|---|---|\n")
        for g in limited:
            lim = g["gpu_limit"]
            out.write(f"| {g['group']} | {lim['median_gpu_ms_per_step']:.3f} | "
                      f"{fmt_rate(lim['median_limit_samples_per_sec'])} | "
                      f"{lim['median_share']:.3f} | {lim['min_share']:.3f} |\n")
    evidence = [g for g in result["groups"] if g["evidence"]]
    if evidence:
        out.write("\nTrace evidence (profile runs of the same settings; profiled steps are slower than bench steps):\n\n")
        out.write("| group | GPU idle share | input gap share of idle | profiled step ms | median samples/s |\n|---|---|---|---|---|\n")
        for g in evidence:
            e = g["evidence"]
            out.write(f"| {g['group']} | {fmt_share(e['gpu_idle_share'])} | {fmt_share(e['input_gap_share'])} | "
                      f"{e['profiled_step_ms']:.1f} | {fmt_rate(g['median'])} |\n")
        first, last = result["groups"][0], max(result["groups"], key=lambda g: g["median"])
        if first["evidence"] and last["evidence"] and first is not last:
            a, b = first["evidence"], last["evidence"]
            out.write(f"\n{first['group']} -> {last['group']}: input gap share {fmt_share(a['input_gap_share'])} -> "
                      f"{fmt_share(b['input_gap_share'])}; GPU idle share {fmt_share(a['gpu_idle_share'])} -> "
                      f"{fmt_share(b['gpu_idle_share'])}; {fmt_rate(first['median'])} -> {fmt_rate(last['median'])} "
                      "samples/s (medians)\n")
    for w in result["warnings"]:
        out.write(f"\nWARNING: {w}\n")
    if result["left_out"]:
        out.write("\nLeft out of the rates: " + "; ".join(f"{r['uuid'][:8]} ({r['why']})" for r in result["left_out"]) + "\n")
    out.write("\nInterval: bootstrap percentile interval of the ratio of medians, 10,000 resamples per group, seed 0; "
              "bounds: min(group)/max(baseline) to max(group)/min(baseline).\n")
    return out.getvalue()


def csv_text(result):
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["group", "n", "median", "min", "max", "spread", "ratio", "ci95_low", "ci95_high",
                "bound_low", "bound_high", "gpu_idle_share", "input_gap_share", "profiled_step_ms", "rates"])
    for g in result["groups"]:
        e = g["evidence"] or {}
        w.writerow([g["group"], g["n"], g["median"], g["min"], g["max"], g["spread"], g.get("ratio", 1.0),
                    *(g.get("ratio_ci95") or ("", "")), *(g.get("ratio_bounds") or ("", "")),
                    e.get("gpu_idle_share", ""), e.get("input_gap_share", ""), e.get("profiled_step_ms", ""),
                    " ".join(f"{r:.1f}" for r in g["rates"])])
    return out.getvalue()


def plot(result, path):
    """Each run's rate as a point in run order, coloured by group, with each group's median."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    groups = [g["group"] for g in result["groups"]]
    colors = plt.get_cmap("tab10")
    for i, g in enumerate(result["groups"]):
        xs = [n for n, r in enumerate(result["bench_runs"], start=1) if r["group"] == g["group"]]
        ys = [r["samples_per_sec"] for r in result["bench_runs"] if r["group"] == g["group"]]
        name = textwrap.fill(f"{g['group']} (median {fmt_rate(g['median'])})", 100, subsequent_indent="  ")
        ax.scatter(xs, ys, color=colors(i % 10), label=name, zorder=3)
        ax.axhline(g["median"], color=colors(i % 10), linewidth=0.8, alpha=0.6)
    ax.set_xlabel("run order")
    ax.set_ylabel("samples/s (bench window)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    # Below the axes: group labels of many options are long and would cover the points.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.15), frameon=False)
    ax.set_title(f"{len(result['bench_runs'])} bench runs in {len(groups)} groups")
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), ".partial-" + os.path.basename(path))
    fig.savefig(tmp, format="png", bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_outputs(result, out_dir):
    from runinfo import write_atomic, write_json_atomic
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "markdown": write_atomic(os.path.join(out_dir, "comparison.md"), markdown(result)),
        "csv": write_atomic(os.path.join(out_dir, "comparison.csv"), csv_text(result)),
        "json": write_json_atomic(os.path.join(out_dir, "comparison.json"),
                                  {**result, "groups": [{k: v for k, v in g.items() if k != "key"}
                                                        for g in result["groups"]]}),
        "png": plot(result, os.path.join(out_dir, "comparison.png")),
    }
    return paths


def log_to_polyaxon(paths):
    """Inside a Polyaxon run: the picture as an image, the tables as artifacts."""
    from polyaxon import tracking
    from runinfo import managed_identity
    tracking.init(**managed_identity())
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
    p.add_argument("--baseline", default=None, help="group to compare against, e.g. workers=4 (default: the first)")
    p.add_argument("--out", default="comparison", help="folder for comparison.md/.csv/.json/.png (default: comparison)")
    args = p.parse_args(argv)
    try:
        records = gather_offline(args.offline) if args.offline else gather_polyaxon(args.project, args.query)
        result = compare_records(records, baseline=args.baseline)
    except CompareError as e:
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 1
    paths = write_outputs(result, args.out)
    sys.stdout.write(markdown(result))
    print(f"\nwritten: {', '.join(paths.values())}", file=sys.stderr)
    if os.environ.get("POLYAXON_RUN_INSTANCE"):
        log_to_polyaxon(paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
