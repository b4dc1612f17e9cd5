"""Mutation testing of the core with mutmut: one module after another, one worker, each against its own tests.

    python scripts/mutation.py [MODULE ...]      (make mutation; MODULES="stats verdict" make mutation)

Each module is mutated in its own copy of this checkout (under $MUTATION_WORK, /tmp/steplens-mutation by
default), so this checkout is never changed and each module has its own mutmut configuration. A mutant is
killed when one of the tests mapped to its module fails (or times out); mutmut runs only the tests that reach
the mutated function. The counts go to results/mutation/<module>.json and the survivors' diffs to
<module>-survivors.txt; results/mutation/README.md names the survivors that are equivalent, with the reason.
MUTATION_REPORT_ONLY=1 writes the report again from the last run's copy, running nothing.
"""

import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "mutation")

# test_verdict's tests built from figures written out by hand (the others read stored traces or run train.py),
# and test_verdict_units's
VERDICT_FAST = (
    "test_diagnosis or never_given or close_runner_up or profiler_may_have or next_step_of_a_gpu"
    " or communication_kernels or runner_up_window or verdict_units"
)
# test_delays's tests of the delay verdict on hand-made traces (its others read stored traces)
DELAYS_FAST = "(test_delays and not stored and not own_run and not scope_share)"
# Tests that run train.py, read the stored H200 traces or measure memory: make test runs them, not each mutant.
NOT_SLOW = (
    "not (profile_run or real_cpu_trace or stored or h200 or memory or streams or scaled or cli_ or class_table"
    " or perfetto_ui or repeat_s_bench or run_times or graph_replay or stop_during)"
)
# module: (the file mutated, the fast tests that are its contract, pytest options)
MODULES = {
    "stats": ("steplens/stats.py", ["tests/test_stats.py"]),
    "verdict": (
        "steplens/evidence/diagnosis.py",
        # test_delays: the verdict on a loop without the scopes (_delay_verdict), on traces written out by hand
        [
            "tests/test_diagnosis.py",
            "tests/test_verdict.py",
            "tests/test_delays.py",
            "tests/test_verdict_units.py",
            "-k",
            f"({VERDICT_FAST}) or {DELAYS_FAST}",
        ],
    ),
    "attribution": (
        "steplens/evidence/attribution.py",
        [
            "tests/test_attribution.py",
            "tests/test_attribution_units.py",
            "tests/test_summarize.py",
            "tests/test_kernels.py",
            "-k",
            NOT_SLOW,
        ],
    ),
    "kernels": ("steplens/trace/kernels.py", ["tests/test_kernels.py", "-k", NOT_SLOW]),
    # test_onepass: the one-pass read's nesting figures (Slices) against the exact read's, on random traces
    "nesting": ("steplens/trace/nesting.py", ["tests/test_nesting.py", "tests/test_onepass.py", "-k", NOT_SLOW]),
    "distortion": (
        "steplens/evidence/distortion.py",
        ["tests/test_distortion.py", "tests/test_distortion_units.py", "tests/test_profiling.py", "-k", NOT_SLOW],
    ),
    "settings": ("steplens/job/settings.py", ["tests/test_settings.py"]),
    "checks": (
        "steplens/job/checks.py",
        ["tests/test_settings.py", "tests/test_stopping.py", "-k", "settings or workers"],
    ),
}
# What the tests read besides steplens/ and tests/ (stored traces, the scripts they import).
ALSO_COPY = ["train.py", "pytest.ini", "results", "scripts", "docs", "README.md", "polyaxonfile.yaml"]


def tracked_files():
    """The files of this checkout that git would carry (tracked, or new and not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in out.split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]


def copy_checkout(dest):
    if os.path.exists(dest):
        shutil.rmtree(dest)
    for rel in tracked_files():
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), os.path.join(dest, rel))


def write_config(dest, target, tests):
    # test files that do not exist (yet) are left out; pytest options (-k EXPR) are kept
    tests = [t for t in tests if not t.startswith("tests/") or os.path.exists(os.path.join(ROOT, t))]
    lines = [
        "[mutmut]",
        "source_paths = steplens",
        f"only_mutate = {target}",
        "also_copy =\n" + "".join(f"    {p}\n" for p in ALSO_COPY),
        "pytest_add_cli_args_test_selection =\n" + "".join(f"    {t}\n" for t in tests),
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -q",
        "",
    ]
    with open(os.path.join(dest, "setup.cfg"), "w") as f:
        f.write("\n".join(lines))
    return tests


def mutmut(dest, *args, timeout=None):
    env = dict(os.environ, PYTHONHASHSEED="0")
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=dest, capture_output=True, text=True, env=env, timeout=timeout
    )


def statuses(dest):
    """{mutant name: status} from `mutmut results --all true`."""
    proc = mutmut(dest, "results", "--all", "true")
    found = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


SHOW = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
for name in json.load(sys.stdin):
    print(json.dumps(get_diff_for_mutant(name, path=find_mutant(name).path)))
"""


def show_all(dest, names, found):
    """Each mutant's diff, read in one process (mutmut show starts one for each)."""
    proc = subprocess.run(
        [sys.executable, "-c", SHOW], cwd=dest, input=json.dumps(names), capture_output=True, text=True
    )
    diffs = [json.loads(line) for line in proc.stdout.splitlines()]
    if len(diffs) != len(names):
        sys.stderr.write(proc.stderr[-3000:])
        diffs = [mutmut(dest, "show", m).stdout for m in names]
        return diffs
    return [f"# {m}: {found[m]}\n{d}" for m, d in zip(names, diffs)]


def run_module(name, work):
    target, tests = MODULES[name]
    dest = os.path.join(work, name)
    started = datetime.datetime.now(datetime.timezone.utc)
    if os.environ.get("MUTATION_REPORT_ONLY"):  # the report again from the last run's copy, nothing run
        tests = write_config(dest, target, tests) if os.path.isdir(dest) else tests
        proc = subprocess.CompletedProcess([], 0, "", "")
    else:
        copy_checkout(dest)
        tests = write_config(dest, target, tests)
        proc = mutmut(dest, "run", "--max-children", "1")
    found = statuses(dest)
    counts = {}
    for status in found.values():
        counts[status] = counts.get(status, 0) + 1
    # A timeout is a mutant detected too: its tests did not pass (a loop that never ends, mostly).
    survivors = sorted(m for m, s in found.items() if s not in ("killed", "timeout"))
    diffs = show_all(dest, survivors, found)
    by_function = {}
    for m, status in found.items():
        fn = re.sub(r"__mutmut_\d+$", "", m.rsplit(".", 1)[-1]).removeprefix("x_")
        row = by_function.setdefault(fn, {"mutants": 0, "killed": 0})
        row["mutants"] += 1
        row["killed"] += status in ("killed", "timeout")
    report = {
        "module": name,
        "file": target,
        "tests": tests,
        "command": f"python scripts/mutation.py {name}",
        "mutmut": subprocess.run([sys.executable, "-m", "pip", "show", "mutmut"], capture_output=True, text=True)
        .stdout.split("Version: ")[-1]
        .split("\n")[0],
        "started": started.isoformat(timespec="seconds"),
        "seconds": None
        if os.environ.get("MUTATION_REPORT_ONLY")
        else round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()),
        "report_only": bool(os.environ.get("MUTATION_REPORT_ONLY")),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "mutants": len(found),
        "by_status": counts,
        "killed": counts.get("killed", 0) + counts.get("timeout", 0),
        "by_function": dict(sorted(by_function.items())),
        "survivors": survivors,
        "exit_code": proc.returncode,
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, f"{name}-survivors.txt"), "w") as f:
        f.write("\n".join(diffs) if diffs else "no survivors\n")
    if proc.returncode != 0 or not found:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return report


def main(argv):
    names = argv or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        print(f"mutation: unknown module {', '.join(unknown)} (known: {', '.join(MODULES)})", file=sys.stderr)
        return 2
    work = os.environ.get("MUTATION_WORK", "/tmp/steplens-mutation")
    for name in names:  # one after another: one worker at a time
        r = run_module(name, work)
        share = f"{100 * r['killed'] / r['mutants']:.1f}%" if r["mutants"] else "n/a"
        print(f"{name}: {r['mutants']} mutants, {r['killed']} killed ({share}), {len(r['survivors'])} not killed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
