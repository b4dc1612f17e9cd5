"""steplens compare -p against a real Polyaxon server (haupt sandbox): every page of the listing is read, a line says
how many runs were read of how many matched, --limit reads the newest, a query selects across pages, and run.json
downloads of older runs go several at a time with each failure named."""

import json
import os

import pytest
from test_compare import fabricated_offline, push_stored_runs, run_compare

FACTS = {
    "env_host": "gpu-a",
    "env_gpu": "NVIDIA H200",
    "env_driver": "570.86.15",
    "env_torch": "2.11.0+cu130",
    "env_cuda": "13.0",
    "env_cpu_budget": 4,
}


def make_runs(sandbox, project, count):
    """`count` succeeded bench runs made through the server's API, in this order: workers 0 and 4 alternating,
    repeat i // 2, each with train.py's machine facts as outputs. Returns their uuids in creation order."""
    sandbox.cli("project", "create", "--name", project)
    uuids = []
    for i in range(count):
        run = sandbox.api(sandbox.run_client(project).create, name=f"bench-{i}")
        client = sandbox.run_client(project, run.uuid)
        sandbox.api(client.log_inputs, async_req=False, mode="bench", workers=4 * (i % 2), repeat=i // 2)
        sandbox.api(client.log_outputs, async_req=False, samples_per_sec=1000.0 + 3000.0 * (i % 2) + i, **FACTS)
        sandbox.succeed(client)
        uuids.append(run.uuid)
    return uuids


@pytest.fixture(scope="module")
def eight(sandbox):
    """Eight runs in one project: with --page-size 3, the listing takes three pages."""
    return make_runs(sandbox, "pages", 8)


def compared(out):
    with open(os.path.join(out, "comparison.json")) as f:
        result = json.load(f)
    return result, {r["uuid"] for t in result["tables"] for r in t["bench_runs"]}


def test_every_page_of_the_listing_is_read_and_a_line_says_how_many(sandbox, eight, tmp_path):
    """Eight runs, three per page: every run is compared, a progress line follows each page, and one line (also at
    the top of comparison.md) says 8 were read of 8."""
    proc = run_compare("-p", "pages", "--page-size", "3", "--out", str(tmp_path), env=sandbox.env())
    assert proc.returncode == 0, proc.stderr
    result, uuids = compared(tmp_path)
    assert uuids == set(eight), "every run of the project, not the first page"
    assert [(g["group"], g["n"]) for g in result["tables"][0]["groups"]] == [("workers=0", 4), ("workers=4", 4)]
    assert result["read"]["read"] == 8 and result["read"]["matched"] == 8
    progress = [line for line in proc.stderr.splitlines() if "listing runs:" in line]
    assert [line.rsplit(": ", 1)[1] for line in progress] == ["3 of 8", "6 of 8", "8 of 8"], proc.stderr
    assert proc.stdout.count("read 8 of the 8") == 1, "said once, in the table's first line"
    assert proc.stdout.startswith("Runs: read 8 of the 8 runs in project pages.")
    assert (tmp_path / "comparison.md").read_text().startswith("Runs: read 8 of the 8 runs in project pages.")


def test_limit_reads_the_newest_runs_and_says_how_many_were_left(sandbox, eight, tmp_path):
    """--limit 5 on purpose: the five newest runs, across two pages, and the line says 5 of 8."""
    proc = run_compare("-p", "pages", "--page-size", "3", "--limit", "5", "--out", str(tmp_path), env=sandbox.env())
    assert proc.returncode == 0, proc.stderr
    result, uuids = compared(tmp_path)
    assert uuids == set(eight[3:]), "the newest five"
    assert "read 5 of the 8 runs in project pages: the newest 5 (--limit 5)" in proc.stdout, proc.stdout
    assert (result["read"]["read"], result["read"]["matched"], result["read"]["limit"]) == (5, 8, 5)


def test_a_query_selects_runs_across_pages(sandbox, eight, tmp_path):
    """-q 'inputs.repeat:0|2' matches four runs apart in the project's order (repeats 0 and 2 of both groups); two
    per page, all four are read, and the line names the query. (The sandbox answers a tags: query with no runs,
    tagged or not: that query is not tried here.)"""
    query = "inputs.repeat:0|2"
    proc = run_compare("-p", "pages", "-q", query, "--page-size", "2", "--out", str(tmp_path), env=sandbox.env())
    assert proc.returncode == 0, proc.stderr
    result, uuids = compared(tmp_path)
    assert uuids == {eight[i] for i in (0, 1, 4, 5)}
    assert f"read 4 of the 4 runs in project pages matching '{query}'" in proc.stdout, proc.stdout
    assert len([line for line in proc.stderr.splitlines() if "listing runs:" in line]) == 2
    assert result["read"]["query"] == query


def test_run_json_downloads_go_in_parallel_and_each_failure_is_named(sandbox, tmp_path):
    """Two stored H200 runs that predate the env_* outputs get their facts from run.json, downloaded two at a time;
    a run with neither facts nor run.json is named with the reason, and still compared (its machine unknown)."""
    old = ["6705508ff2d847f2b8e1c8edbcc31cc8", "cd3eb54a6c0548ddaf83cbdf2d84c0ce"]  # workers 0 and 4, repeat 2
    push_stored_runs(sandbox, "downloads", old, tmp_path / "old")
    bare = sandbox.api(sandbox.run_client("downloads").create, name="bare")
    client = sandbox.run_client("downloads", bare.uuid)
    sandbox.api(client.log_inputs, async_req=False, mode="bench", workers=0, repeat=1)
    sandbox.api(client.log_outputs, async_req=False, samples_per_sec=1000.0)
    sandbox.succeed(client)
    out = tmp_path / "out"
    proc = run_compare("-p", "downloads", "--downloads", "2", "--per-host", "--out", str(out), env=sandbox.env())
    assert proc.returncode == 0, proc.stderr
    assert "downloading run.json of 3 run(s) whose outputs lack the machine facts, 2 at a time" in proc.stderr
    failures = [line for line in proc.stderr.splitlines() if "no machine facts in its outputs and no run.json" in line]
    assert len(failures) == 1 and bare.uuid in failures[0], proc.stderr
    assert failures[0].rstrip().endswith(")") and "(" in failures[0], "the reason is named"
    result, uuids = compared(out)
    assert uuids == {*old, bare.uuid}
    h200 = [t for t in result["tables"] if t["machine"]["gpu"] == "NVIDIA H200"]
    assert len(h200) == 1 and {r["uuid"] for r in h200[0]["bench_runs"]} == set(old), "facts from run.json"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--limit", "0"], "--limit must be >= 1, got 0"),
        (["--page-size", "-1"], "--page-size must be >= 1, got -1"),
        (["--downloads", "0"], "--downloads must be >= 1, got 0"),
    ],
)
def test_bad_counts_are_refused_in_one_line_before_any_request(args, said, tmp_path):
    proc = run_compare("-p", "nowhere", *args, "--out", str(tmp_path / "out"), env=dict(os.environ))
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_query_with_offline_runs_is_refused(tmp_path):
    """-q filters on the server: with --offline it would be ignored, so it is refused."""
    proc = run_compare("--offline", str(tmp_path), "-q", "tags:x", "--out", str(tmp_path / "out"), env=dict(os.environ))
    assert proc.returncode == 2 and "-q/--query selects runs on a Polyaxon server" in proc.stderr, proc.stderr


def test_a_missing_project_or_an_unreachable_server_is_one_line(sandbox, tmp_path):
    """No such project on the server, or no server at the host: one line naming the project and the host, no trace
    of the client's own logging."""
    unreachable = sandbox.env(POLYAXON_HOST="http://127.0.0.1:9")  # port 9 (discard): nothing listens here
    for env, said in ((sandbox.env(), "NotFoundException"), (unreachable, "127.0.0.1:9")):
        proc = run_compare("-p", "nosuch", "--out", str(tmp_path / "out"), env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("steplens compare: error: project nosuch on ") and said in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_offline_runs_are_counted_and_limit_keeps_the_newest(tmp_path):
    """Offline: eight finished runs and one folder without run.plx.json (a run still going). The line counts the eight
    and names the unread folder; --limit 4 keeps the four newest by start time."""
    root = tmp_path / "offline"
    fabricated_offline(str(root), hosts=("vm", "vm2"))
    os.makedirs(root / "runs" / "still-going")
    proc = run_compare("--offline", str(root), "--per-host", "--out", str(tmp_path / "all"), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert (
        f"read 8 of the 8 offline runs under {root}; left unread: 1 folder(s) without a finished run "
        "(no readable run.plx.json)" in proc.stdout
    ), proc.stdout
    proc = run_compare("--offline", str(root), "--limit", "4", "--out", str(tmp_path / "newest"), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert f"read 4 of the 8 offline runs under {root}: the newest 4 (--limit 4)" in proc.stdout, proc.stdout
    result, uuids = compared(tmp_path / "newest")
    assert uuids == {"vm200", "vm201", "vm210", "vm211"}, "the second host's runs start an hour later"
