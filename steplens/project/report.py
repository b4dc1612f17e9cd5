"""What `make run` prints at the end: the bench rates and the trace evidence of offline runs.

    steplens report .polyaxon-offline                     # every run under the root
    steplens report .polyaxon-offline UUID [UUID ...]     # these runs
    steplens report .polyaxon-offline --since 2026-12-02T17:00:00+00:00

Reads <root>/runs/<uuid>/run.plx.json (name, status, inputs, outputs, created_at) and, where it
exists, <root>/runs/<uuid>/outputs/run.json (settings, device, results). It opens on the answer: each
profile run's verdict (which stage holds the step) and the bench rate of each workers setting against
workers=0, with what one job per setting can and cannot show. Then the bench rates, one row per job; the
profile runs' figures (GPU idle share, input gap share of the idle time, profiled step ms, the profiler's
slow-down); the step pictures and the traces to open in Perfetto. Failed or unfinished runs are listed
with their error. Standard library only; steplens compare judges repeats.
"""

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from steplens.atomic import recorded_file
from steplens.evidence.formatting import configuration

EVIDENCE = (
    ("gpu_idle_share", "GPU idle share", "{:.2f}"),
    ("input_gap_share", "input gap share of idle", "{:.2f}"),
    ("profiled_step_ms", "profiled step ms", "{:.1f}"),
    ("unprofiled_step_ms", "unprofiled step ms", "{:.1f}"),
    ("profiler_distortion", "profiler slow-down", "{:.2f}x"),
)
GPU_FIGURES = {"gpu_idle_share", "input_gap_share"}
PERFETTO = "https://ui.perfetto.dev (profile mode's traces nest: any version shows every slice)"


class ReportError(Exception):
    pass


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def parse_time(text: str) -> datetime:
    t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def expand_id(uuid: str, present: Sequence[str]) -> str:
    """A run's full uuid from the short id the report prints (a unique prefix); else the id as given."""
    matches = [p for p in present if p.startswith(uuid)]
    return matches[0] if len(matches) == 1 else uuid


def load_runs(root: str, uuids: Sequence[str] = (), since: datetime | None = None) -> list[dict[str, Any]]:
    """The runs under root (those in uuids, or created at or after since), oldest first."""
    runs_dir = os.path.join(root, "runs")
    if not os.path.isdir(runs_dir):
        raise ReportError(f"{root} holds no offline runs (no runs/ folder)")
    present = sorted(os.listdir(runs_dir))
    wanted = [expand_id(u, present) for u in uuids] or present
    runs = []
    for uuid in wanted:
        base = os.path.join(runs_dir, uuid)
        plx = read_json(os.path.join(base, "run.plx.json"))
        if plx is None:
            if uuids:  # asked for by name: say it is missing rather than skip it
                runs.append({"uuid": uuid, "base": base, "plx": {"status": "no run.plx.json"}, "run": None})
            continue
        if since is not None and (not plx.get("created_at") or parse_time(plx["created_at"]) < since):
            continue
        runs.append(
            {"uuid": uuid, "base": base, "plx": plx, "run": read_json(os.path.join(base, "outputs", "run.json"))}
        )
    return sorted(runs, key=lambda r: str(r["plx"].get("created_at") or ""))


def settings_of(r: dict[str, Any]) -> dict[str, Any]:
    return (r["run"] or {}).get("settings") or r["plx"].get("inputs") or {}


def device_of(r: dict[str, Any]) -> str:
    run = r["run"] or {}
    gpu = (run.get("environment") or {}).get("gpu")
    return gpu or run.get("device") or settings_of(r).get("device") or "?"


def cpu_only(r: dict[str, Any]) -> bool:
    run = r["run"] or {}
    return run.get("device") == "cpu" or (run.get("results") or {}).get("gpu_tracks") is False


def figure(r: dict[str, Any], key: str, fmt: str) -> str:
    outputs = r["plx"].get("outputs") or {}
    evidence = ((r["run"] or {}).get("results") or {}).get("evidence") or {}
    value = outputs.get(key, evidence.get(key))
    if key == "profiler_distortion" and value is not None:
        se = outputs.get("profiler_distortion_se", evidence.get("profiler_distortion_se"))
        low, high = (outputs.get(k, evidence.get(k)) for k in ("distortion_low", "distortion_high"))
        said = fmt.format(value) + ("" if se is None else f" +/- {se:.2f}")
        if low is not None:
            drift = evidence.get("unprofiled_drift")
            said += f" (95%: {low:.2f} to {high:.2f}" + ("" if drift is None else f", after/before {drift:.2f}") + ")"
        return said + (" uncertain" if evidence.get("distortion_uncertain") else "")
    if value is None:
        if cpu_only(r) and key in GPU_FIGURES:
            return "n/a (CPU-only trace)"
        reasons = (((r["run"] or {}).get("results") or {}).get("evidence") or {}).get("null_reasons") or {}
        return "n/a (refilled queues)" if key in GPU_FIGURES and "input_wait" in reasons else "n/a"
    return fmt.format(value)


def local_path(r: dict[str, Any], path: str) -> str:
    """A file the run recorded (steplens.atomic.recorded_file), or its path marked missing."""
    return recorded_file(path, r["base"]) or f"{path} (missing)"


def trace_paths(r: dict[str, Any]) -> list[str]:
    """The traces of a profile run."""
    return [
        local_path(r, c["trace"]) for c in ((r["run"] or {}).get("results") or {}).get("cycles") or [] if c.get("trace")
    ]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def rate_of(r: dict[str, Any]) -> float | None:
    res = r["run"].get("results") or {}
    return (r["plx"].get("outputs") or {}).get("samples_per_sec") or res.get("samples_per_sec")


def workers_ratios(bench: list[dict[str, Any]], profile: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The median rate of each workers setting against workers=0's, per configuration and device, as
    sentences: one job per setting is a first look; fewer CPUs than workers + 1 is said where it applies."""

    def key(r):
        s = dict(settings_of(r))
        for k in (
            "workers",
            "repeat",
            "output_dir",
            "force_workers",
            "mode",
            "profile_detail",
            "unprofiled_steps",
            "bench_steps",
            "trace_format",
        ):
            s.pop(k, None)
        return json.dumps(s, sort_keys=True, default=str), device_of(r)

    profiles = [
        {
            "key": key(r),
            "workers": settings_of(r).get("workers") or 0,
            "evidence": (r["run"].get("results") or {}).get("evidence") or {},
        }
        for r in profile
    ]
    groups = {}
    for r in bench:
        if rate_of(r):
            groups.setdefault((key(r), settings_of(r).get("workers") or 0), []).append(r)
    out = []
    for (k, w), runs in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1])):
        zero = groups.get((k, 0))
        if not w or not zero:
            continue
        rate, ref = statistics.median(map(rate_of, runs)), statistics.median(map(rate_of, zero))
        many = len(runs) > 1 or len(zero) > 1
        line = (
            f"bench: workers={w} ran at {rate / ref:.2f}x the samples/s of workers=0 ({rate:,.1f} vs "
            f"{ref:,.1f}{', medians of ' + str(len(runs)) + ' and ' + str(len(zero)) + ' jobs' if many else ''}) "
            f"on {k[1]}"
        )
        line += (
            ". Only steplens compare's paired test over alternating repeats gives a verdict: make compare"
            if many
            else ". One job per setting is a first look, not a verdict: run make bench-alternating (6 pairs), "
            "then make compare"
        )
        cpus = (runs[0]["run"].get("cpu_budget") or {}).get("cpus")
        if cpus is not None and cpus < w + 1:
            line += (
                f". The job has {cpus} CPUs, fewer than {w} workers plus the training process: the workers "
                "take CPU time from the training step, so more workers can gain little or be slower"
            )
        share = next(
            (
                p["evidence"]["input_cpu_share"]
                for p in profiles
                if p["key"] == k and p["workers"] == 0 and p["evidence"].get("input_cpu_share") is not None
            ),
            None,
        )
        if share is not None:
            line += (
                f". At workers=0 the profiled step spent {share:.0%} of its time fetching input (the profiler "
                "inflates it): more workers can save about that much at most"
            )
        out.append(line + ".")
    return out


def verdict_of(r: dict[str, Any]) -> str | None:
    evidence = ((r["run"] or {}).get("results") or {}).get("evidence") or {}
    v = evidence.get("verdict") or {}
    return v.get("sentence") or (r["plx"].get("outputs") or {}).get("verdict")


def input_of(r: dict[str, Any]) -> str | None:
    """Whether the DataLoader workers kept up with the step over a bench window, in a sentence (or None)."""
    said = ((r["run"] or {}).get("results") or {}).get("input") or {}
    outputs = r["plx"].get("outputs") or {}
    verdict = said.get("verdict") or outputs.get("input_verdict")
    cpu = (said.get("cpu") or {}).get("cpu_sentence") or outputs.get("cpu_sentence")
    return f"{verdict}; {cpu}" if verdict and cpu else verdict


def answer_lines(profile: list[dict[str, Any]], bench: list[dict[str, Any]]) -> list[str]:
    """The report's answer: each profile's verdict, the workers' rates against workers=0, and each bench window's
    input verdict (whether the DataLoader workers kept up, docs/INPUT.md#the-dataloader-workers)."""
    return (
        [
            f"profile {r['uuid'][:8]} {configuration(settings_of(r))} on {device_of(r)}{cycles_of(r)}: {verdict_of(r)}"
            for r in profile
            if verdict_of(r)
        ]
        + workers_ratios(bench, profile)
        + [
            f"bench {r['uuid'][:8]} {configuration(settings_of(r))} on {device_of(r)}: input: {input_of(r)}"
            for r in bench
            if input_of(r)
        ]
    )


def cycles_of(r: dict[str, Any]) -> str:
    chosen = (((r["run"] or {}).get("results") or {}).get("evidence") or {}).get("headline_cycles")
    return f" (cycle{'s' if len(chosen) > 1 else ''} {' and '.join(map(str, chosen))})" if chosen else ""


def pictures_of(r: dict[str, Any]) -> list[str]:
    return [
        local_path(r, c["picture"])
        for c in ((r["run"] or {}).get("results") or {}).get("cycles") or []
        if c.get("picture")
    ]


def report(runs: list[dict[str, Any]]) -> str:
    """The text make run ends with; pure, so it can be tested on fabricated run folders."""
    ok = [r for r in runs if r["plx"].get("status") == "succeeded" and r["run"] is not None]
    bench = [r for r in ok if settings_of(r).get("mode") == "bench"]
    profile = [r for r in ok if settings_of(r).get("mode") == "profile"]
    others = [r for r in runs if r not in ok]
    out = []
    answer = answer_lines(profile, bench)
    if answer:
        out += ["the answer", *[f"  {line}" for line in answer], ""]
    if bench:
        rows = []
        for r in bench:
            res = r["run"].get("results") or {}
            rate = rate_of(r)
            window = (
                f"{res['window_steps']} batches in {res['window_seconds']:.2f} s"
                if res.get("window_steps") and res.get("window_seconds")
                else ""
            )
            share = res.get("gpu_bound_share", res.get("share_of_gpu_limit"))  # the older runs' name
            if share is not None:  # --cuda-graph runs measure how GPU-bound the step is
                window += f", GPU-bound share {share:.1%}"
            rows.append(
                [
                    r["uuid"][:8],
                    configuration(settings_of(r)),
                    device_of(r),
                    f"{rate:,.1f}" if rate is not None else "n/a",
                    window,
                ]
            )
        out += [
            "bench: samples/s over the unprofiled window, one job per row",
            table(["run", "configuration", "device", "samples/s", "window"], rows),
            "(one job per setting is a first look: make bench-alternating, then make compare)",
            "",
        ]
    if profile:
        rows = [
            [r["uuid"][:8], configuration(settings_of(r)), settings_of(r).get("profile_detail") or "full", device_of(r)]
            + [figure(r, key, fmt) for key, _, fmt in EVIDENCE]
            for r in profile
        ]
        out += [
            "profile: what the traces show, over the traced steps whose input waits the capture did not hide; "
            "profiler slow-down = profiled step / unprofiled step of the same run (the "
            "steps timed before and after the capture pooled; its interval covers the ratio against either block)",
            table(["run", "configuration", "capture", "device"] + [title for _, title, _ in EVIDENCE], rows),
        ]
        for r in profile:
            said = ((r["run"].get("results") or {}).get("evidence") or {}).get("distortion_sentence")
            if said:
                out.append(f"  {r['uuid'][:8]}: {said}")
        pictures = [(r, p) for r in profile for p in pictures_of(r)]
        if pictures:
            out += ["", "step pictures (each profiled cycle: the CPU's scopes and the GPU's busy and idle time):"]
            out += [f"  {r['uuid'][:8]} {configuration(settings_of(r))}: {p}" for r, p in pictures]
        out += ["", f"traces to open at {PERFETTO}; per step: .venv/bin/steplens summarize TRACE"]
        for r in profile:
            out += [f"  {r['uuid'][:8]} {configuration(settings_of(r))}:"] + [
                f"    {p}" for p in trace_paths(r) or ["(none recorded)"]
            ]
        out.append("")
    if others:
        out.append("not succeeded:")
        for r in others:
            stopped = (r["run"] or {}).get("stopped")
            why = (
                (r["run"] or {}).get("error")
                or ("no run.json" if r["run"] is None else "")
                or (f"{stopped['signal']} during {stopped['phase']}" if stopped else "")
            )
            name = r["plx"].get("name") or settings_of(r).get("mode") or "?"
            out.append(f"  {r['uuid'][:8]} {name} [{r['plx'].get('status') or 'unknown'}] {why}".rstrip())
        out.append("")
    if not runs:
        out.append("no runs to report")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="steplens report", description=__doc__.split("\n")[0])
    p.add_argument("root", help="an offline root (POLYAXON_OFFLINE_ROOT), e.g. .polyaxon-offline")
    p.add_argument("uuids", nargs="*", help="the runs to report (default: every run under the root)")
    p.add_argument(
        "--since",
        type=parse_time,
        default=None,
        help="only runs created at or after this ISO time, e.g. 2026-12-02T17:00:00+00:00",
    )
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.root, args.uuids, args.since)
    except ReportError as e:
        print(f"steplens report: error: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
