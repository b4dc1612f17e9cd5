"""Polyaxon's own UI over offline runs (`haupt viewer --path ROOT`): the project, the runs, each run's readme,
read through the viewer's API and from the pages headless Chromium renders."""

import json
import os
import struct
import sys

import pytest
from conftest import ROOT, load_offline_run

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import viewer_screenshots  # noqa: E402
from viewer_screenshots import OWNER, PROJECT, Browser, Viewer  # noqa: E402

from steplens.polyaxonenv import artifact_url, namespace  # noqa: E402

RECORD = os.path.join("projects", PROJECT, "project.plx.json")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def browser():
    """Headless Chromium, or a skip where it is missing (.ci/run installs it and sets VIEWER_BROWSER=required)."""
    try:
        return Browser()
    except viewer_screenshots.ViewerError as e:
        if os.environ.get("VIEWER_BROWSER") == "required":
            raise
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def failed_run(failed_download_run):
    """A run that fails (its CIFAR-10 download cannot reach anything) in a root that already holds a project record."""
    return failed_download_run


@pytest.fixture(scope="module")
def viewer_root(tmp_path_factory, profile_run, bench_run, failed_run):
    """One offline root holding the three runs (linked from their own roots) and the project record the
    profile run's tracking start wrote."""
    root = tmp_path_factory.mktemp("offline-viewer")
    os.symlink(os.path.join(profile_run["root"], "projects"), root / "projects")
    os.makedirs(root / "runs")
    for run in (profile_run, bench_run, failed_run):
        os.symlink(os.path.join(run["root"], "runs", run["uuid"]), root / "runs" / run["uuid"])
    return root


@pytest.fixture(scope="module")
def viewer(viewer_root):
    with Viewer(viewer_root) as server:  # stopped on every way out, its process group with it
        yield server


def test_every_offline_run_leaves_its_project_record(profile_run):
    """The tracking start writes ROOT/projects/PROJECT/project.plx.json with the fields the viewer shows."""
    record = read_json(os.path.join(profile_run["root"], RECORD))
    run = load_offline_run(profile_run["root"], profile_run["uuid"])
    assert record["name"] == run["project"] == PROJECT
    assert record["owner"] == run["owner"] == OWNER
    assert len(record["uuid"]) == 32 and record["created_at"] and record["updated_at"], record
    assert not [
        n for n in os.listdir(os.path.dirname(os.path.join(profile_run["root"], RECORD))) if n.startswith(".partial")
    ], "a temp file was left beside the record"


def test_the_project_record_is_written_once(failed_run, profile_run):
    """A later run in the same root keeps the record it finds, byte for byte."""
    with open(os.path.join(profile_run["root"], RECORD), "rb") as f, open(failed_run["root"] / RECORD, "rb") as g:
        assert f.read() == g.read()


def test_the_viewer_lists_the_project_and_its_runs(viewer, profile_run, bench_run, failed_run):
    """The API's project list holds the project; its runs list holds the three runs with their names and states."""
    projects = viewer.api(f"{OWNER}/projects/list")["results"]
    assert [p["name"] for p in projects] == [PROJECT], projects
    runs = {r["uuid"]: r for r in viewer.api(f"{OWNER}/{PROJECT}/runs/")["results"]}
    assert runs[profile_run["uuid"]]["name"] == "profile-workers0"
    assert runs[profile_run["uuid"]]["status"] == "succeeded"
    assert runs[bench_run["uuid"]]["name"] == "bench-workers0"
    assert runs[failed_run["uuid"]]["status"] == "failed"


def test_a_profile_run_s_readme_holds_its_verdict_and_figures(viewer, profile_run):
    """The readme holds run.json's verdict sentence, the slow-down and, per cycle, the figures and the files to open."""
    results = read_json(os.path.join(profile_run["outputs"], "run.json"))["results"]
    run = viewer.api(f"{OWNER}/{PROJECT}/runs/{profile_run['uuid']}/")
    readme = run["readme"]
    assert results["evidence"]["verdict"]["sentence"] in readme
    ev = results["evidence"]
    assert f"{ev['profiler_distortion']:.2f}x +/- {ev['profiler_distortion_se']:.2f}" in readme
    for c in results["cycles"]:
        assert f"profiled step {c['evidence']['profiled_step_ms']:.1f} ms" in readme
        assert c["verdict"] in readme
        assert f"`{os.path.relpath(c['picture'], profile_run['outputs'])}`" in readme
        assert f"`{os.path.relpath(c['trace'], profile_run['outputs'])}`" in readme
    # A CPU profile has no GPU figures: n/a, with steplens summarize's reason.
    assert "GPU idle n/a" in readme and f"n/a: {ev['null_reasons']['gpu']}" in readme
    assert "\n" not in run["description"] and results["evidence"]["verdict"]["stage"] in run["description"]


def test_a_bench_run_s_readme_holds_its_rate_and_window(viewer, bench_run):
    results = read_json(os.path.join(bench_run["outputs"], "run.json"))["results"]
    run = viewer.api(f"{OWNER}/{PROJECT}/runs/{bench_run['uuid']}/")
    assert f"**Rate:** {results['samples_per_sec']:.1f} samples/s" in run["readme"]
    assert f"window: 3 batches of 4, {results['window_seconds']:.3f} s" in run["readme"]
    assert f"MFU: n/a ({results['ceiling']['note']})" in run["readme"]
    assert f"{results['samples_per_sec']:.1f} samples/s" in run["description"]


def test_a_failed_run_s_readme_says_so_and_why(viewer, failed_run):
    run = viewer.api(f"{OWNER}/{PROJECT}/runs/{failed_run['uuid']}/")
    assert run["readme"].startswith("Failed: ") and "--data synthetic" in run["readme"], run["readme"]
    assert run["readme"].strip().count("\n") == 0, "a failed run's readme is one line"


def test_the_dashboard_lists_the_metrics_and_pictures(viewer, profile_run):
    """The run's lineage lists the logged metrics and step pictures; the events API returns their values."""
    uuid = profile_run["uuid"]
    lineage = {a["name"]: a["kind"] for a in viewer.api(f"{OWNER}/{PROJECT}/runs/{uuid}/lineage/artifacts")["results"]}
    assert lineage.get("warmup_step_seconds") == lineage.get("profiled_step_wall_ms") == "metric", lineage
    assert lineage.get("steps-cycle1") == lineage.get("steps-cycle2") == "image", lineage
    base = f"streams/v1/{OWNER}/{OWNER}/{PROJECT}/runs/{uuid}/events"
    metrics = {m["name"]: m["data"] for m in viewer.api(f"{base}/metric?names=profiled_step_wall_ms")["data"]}
    assert metrics["profiled_step_wall_ms"]["step"] == [2, 3, 4, 7, 8, 9]
    images = viewer.api(f"{base}/image?names=steps-cycle1")["data"]
    path = json.loads(images[0]["data"]["image"][0])["path"]
    assert os.path.isfile(os.path.join(profile_run["root"], "runs", uuid, path)), path


def test_the_runs_page_shows_every_run(viewer):
    """Chromium renders the UI's runs page: the three run names show, and no 'not found'."""
    text = browser().wait_for(viewer.page(), ["profile-workers0", "bench-workers0", "Runs (3)"])
    assert "not found" not in text.lower(), text[:2000]


def test_a_run_s_page_shows_its_readme_verdict(viewer, profile_run):
    """Chromium renders the profile run's page: its readme panel holds the verdict sentence."""
    sentence = read_json(os.path.join(profile_run["outputs"], "run.json"))["results"]["evidence"]["verdict"]["sentence"]
    text = browser().wait_for(viewer.page(profile_run["uuid"]), ["profile-workers0", "Readme", sentence])
    assert "Add a Readme" not in text


def png_width(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">I", head[16:20])[0]


def test_a_run_s_readme_shows_its_step_pictures_in_the_ui(viewer, profile_run, tmp_path):
    """Chromium renders the profile run's page: each step picture its readme names as an image loads from the
    viewer's streams service, at the width of the PNG file; a missing file's image would read 0 in that page."""
    results = read_json(os.path.join(profile_run["outputs"], "run.json"))["results"]
    uuid = profile_run["uuid"]
    pictures = [c["picture"] for c in results["cycles"]]
    expected = [
        artifact_url(OWNER, PROJECT, uuid, "outputs/" + os.path.relpath(p, profile_run["outputs"]), "default")
        for p in pictures
    ]
    chromium = browser()
    widths = viewer_screenshots.readme_images(viewer, uuid, chromium, str(tmp_path / "readme.png"))
    assert list(widths) == expected, widths
    assert list(widths.values()) == [png_width(p) for p in pictures], widths
    assert png_width(tmp_path / "readme.png") > 0
    missing = expected[0].replace("picture-cycle1", "no-such-picture")
    with chromium.devtools(viewer.page(uuid)) as page:
        width = page.evaluate(
            "new Promise((done) => { const i = new Image(); i.onload = i.onerror = () => done(i.naturalWidth); "
            f"i.src = {json.dumps(missing)}; }})"
        )
    assert width == 0, f"an image of a missing file loaded ({width} pixels wide): the check above proves nothing"


def test_the_screenshot_tool_shoots_the_runs_page_and_a_run_s_page(viewer_root, profile_run, tmp_path):
    browser()  # skips where Chromium is missing
    assert viewer_screenshots.main([str(viewer_root), str(tmp_path), profile_run["uuid"]]) == 0
    for name in ("runs.png", f"run-profile-workers0-{profile_run['uuid'][:8]}.png"):
        with open(tmp_path / name, "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n", name
        assert struct.unpack(">II", head[16:24]) == (1400, 1000), name


def test_the_screenshot_tool_refuses_a_root_without_runs(tmp_path, capsys):
    assert viewer_screenshots.main([str(tmp_path), str(tmp_path / "out")]) == 1
    assert "no offline runs under" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_distributed_run_s_readme_speaks_of_every_rank(ddp_profile, ddp_bench):
    """DDP profile: the slowest rank, its stage and the verdict across ranks; DDP bench: each rank's rate."""
    top = read_json(os.path.join(ddp_profile["outputs"], "run.json"))["results"]["across_ranks"]
    readme = load_offline_run(ddp_profile["root"], ddp_profile["uuid"])["readme"]
    assert f"slowest rank: {top['slowest_rank']}; its stage: {top['slow_stage']}" in readme, readme
    assert top["verdict"] in readme and "rank 1's own verdict: " in readme
    results = read_json(os.path.join(ddp_bench["outputs"], "run.json"))["results"]
    readme = load_offline_run(ddp_bench["root"], ddp_bench["uuid"])["readme"]
    for r in results["ranks"]:
        assert f"rank {r['rank']} ({r['host']}, {r['device']}): {r['samples_per_sec']:.1f} samples/s" in readme


def test_the_readme_of_a_stored_h200_profile_run():
    """A profile run of an NVIDIA H200 machine (results/h200-pictures): its GPU figures as percentages, and its
    files named under outputs/ although the record was written elsewhere."""
    from steplens.job import overview

    path = os.path.join(ROOT, "results", "h200-pictures", "workers0", "run.json")
    data = read_json(path)
    description, readme = overview.succeeded(data, os.path.dirname(path))
    c = data["results"]["cycles"][0]
    assert f"GPU idle {c['evidence']['gpu_idle_share']:.0%} of the step" in readme
    assert f"input gap {c['evidence']['input_gap_share']:.0%} of the GPU's idle time" in readme
    assert (
        "`traces/picture-cycle1-steps2-4.png`" in readme and "`traces/trace-cycle1-steps2-4.pt.trace.json.gz`" in readme
    )
    assert "n/a" not in readme
    verdict = data["results"]["evidence"]["verdict"]
    assert description == f"profile, workers 0, NVIDIA H200: {verdict['stage']} holds the step ({verdict['share']:.0%})"


def test_a_file_s_streams_url_names_the_namespace_owner_project_run_and_path():
    """The URL path Polyaxon's streams service serves a run's file at, relative to the host; odd characters escaped."""
    url = artifact_url("acme", "profiling", "ab12cd", "outputs/traces/picture-cycle1-steps2-4.png", "polyaxon")
    assert (
        url == "/streams/v1/polyaxon/acme/profiling/runs/ab12cd/ro_artifact/outputs/traces/picture-cycle1-steps2-4.png"
    )
    assert artifact_url("o", "p", "u", "outputs/a b(1).png", "ns").endswith("/ro_artifact/outputs/a%20b%281%29.png")
    for bad in ("", "/etc/passwd", "outputs/../../x.png", "outputs//x.png", "./x.png"):
        with pytest.raises(ValueError, match="not a path inside the run's folder"):
            artifact_url("o", "p", "u", bad, "ns")
    with pytest.raises(ValueError, match="bad owner"):
        artifact_url("a/b", "p", "u", "outputs/x.png", "ns")


def test_the_namespace_is_the_pod_s_or_default(monkeypatch):
    monkeypatch.setenv("POLYAXON_K8S_NAMESPACE", "ml-team")
    assert namespace() == "ml-team"
    monkeypatch.delenv("POLYAXON_K8S_NAMESPACE")
    assert namespace() == "default"


def test_the_readme_shows_each_step_picture_as_an_image_under_its_path():
    """Given where the run's files are served, each cycle's picture line is followed by a Markdown image of it
    (its alt text the path); without, the readme names the paths only."""
    from steplens.job import overview

    path = os.path.join(ROOT, "results", "h200-pictures", "workers0", "run.json")
    data = read_json(path)
    served = lambda rel: artifact_url("default", PROJECT, data["polyaxon"]["run_uuid"], "outputs/" + rel, "ns")  # noqa: E731
    _, readme = overview.succeeded(data, os.path.dirname(path), served)
    lines = readme.splitlines()
    rels = []
    for c in data["results"]["cycles"]:
        rel = "traces/" + os.path.basename(c["picture"])  # the record was written on another machine
        at = lines.index(f"- step picture: `{rel}` (also on the dashboard as steps-cycle{c['cycle']})")
        assert lines[at + 1] == f"  ![{rel}]({served(rel)})", lines[at : at + 2]
        rels.append(rel)
    assert viewer_screenshots.readme_image_urls(readme) == [served(r) for r in rels]
    assert "![" not in overview.succeeded(data, os.path.dirname(path))[1]


class Tracking:
    """A stand-in for polyaxon.tracking: a run whose outputs folder is out_dir."""

    def __init__(self, out_dir):
        import types

        self.out_dir = str(out_dir)
        self.TRACKING_RUN = types.SimpleNamespace(run_uuid="ab12", owner="acme", project="profiling")

    def get_outputs_path(self):
        return self.out_dir


def test_a_run_s_pictures_are_served_only_from_its_own_outputs(tmp_path, monkeypatch):
    """A run that writes to its outputs folder gets image URLs with its pod's namespace; one written elsewhere
    (--output-dir) gets none, since Polyaxon serves only the run's folder."""
    from steplens.job.runrecord import RunRecord

    monkeypatch.setenv("POLYAXON_K8S_NAMESPACE", "ml-team")
    record = RunRecord(Tracking(tmp_path / "outputs"), {}, "profile")
    assert (
        record.image_url("traces/p.png")
        == "/streams/v1/ml-team/acme/profiling/runs/ab12/ro_artifact/outputs/traces/p.png"
    )
    elsewhere = RunRecord(Tracking(tmp_path / "outputs"), {}, "profile", output_dir=str(tmp_path / "mine"))
    assert elsewhere.image_url("traces/p.png") is None
