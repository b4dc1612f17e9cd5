"""End to end against a real Polyaxon server (haupt sandbox on 127.0.0.1), driven from the CLI.

The sandbox queues runs but has no agent without Kubernetes: Sandbox.execute_queued_run does the
agent's part (the run's resolved command, the run's identity in the environment). install=false
skips only the runtime `pip install`, which would replace this machine's torch.
"""

import glob
import json
import os

import pytest
from polyaxon_support import StandInAgent, created_uuid

CPU_SIZED = [
    "-P",
    "batch_size=4",
    "-P",
    "warmup_steps=1",
    "-P",
    "bench_steps=2",
    "-P",
    "data=synthetic",
    "-P",
    "device=cpu",
    "-P",
    "install=false",
]


@pytest.fixture(scope="module")
def project(sandbox):
    sandbox.cli("project", "create", "--name", "e2e")
    return "e2e"


def get_run_json(sandbox, project, run_uuid):
    proc = sandbox.cli("ops", "get", "-p", project, "-uid", run_uuid, "-o", "json")
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def submit_and_execute(sandbox, project, *params):
    submitted = sandbox.cli("run", "-f", "polyaxonfile.yaml", "-u", "-p", project, *params, *CPU_SIZED)
    run_uuid = created_uuid(submitted.stdout)
    assert get_run_json(sandbox, project, run_uuid)["status"] in ("created", "compiled", "queued")
    proc, container = sandbox.execute_queued_run(project, run_uuid)
    assert proc.returncode == 0, f"resolved command failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return run_uuid, proc, container


def test_bench_run_through_the_server(sandbox, project, tmp_path):
    """polyaxon run -> queued -> executed -> `ops get` shows samples_per_sec, `ops artifacts` gives run.json; the
    managed run set its readme and description on the server."""
    run_uuid, proc, container = submit_and_execute(sandbox, project, "-P", "mode=bench", "-P", "workers=0")
    assert container["image"] == "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
    assert "--- package inventory" in proc.stdout and "torch==" in proc.stdout
    shown = sandbox.cli("ops", "get", "-p", project, "-uid", run_uuid).stdout
    assert "samples_per_sec" in shown and "succeeded" in shown
    run = get_run_json(sandbox, project, run_uuid)
    assert run["outputs"]["samples_per_sec"] > 0 and run["outputs"]["window_steps"] == 2
    assert run["inputs"]["mode"] == "bench" and run["inputs"]["workers"] == 0
    sandbox.cli(
        "ops", "artifacts", "-p", project, "-uid", run_uuid, "-f", "outputs/run.json", "--path-to", str(tmp_path)
    )
    with open(tmp_path / "outputs" / "run.json") as f:
        record = json.load(f)
    assert record["status"] == "succeeded" and record["polyaxon"]["managed"] is True
    assert record["polyaxon"]["run_uuid"] == run_uuid
    assert record["results"]["samples_per_sec"] == pytest.approx(run["outputs"]["samples_per_sec"])
    client = sandbox.run_client(project, run_uuid)
    client.refresh_data()
    data = client.run_data
    assert (data.readme or "").startswith(f"**Rate:** {run['outputs']['samples_per_sec']:.1f} samples/s"), data.readme
    assert (data.description or "").startswith("bench, workers 0, cpu: "), data.description


def test_profile_run_traces_download(sandbox, project, tmp_path):
    """A profile run through the server: `ops artifacts -d outputs/traces` downloads both traces. Lean: what the
    traces hold is tested on the shared profile run; here their way through the server (smaller traces, the same
    files). Three unprofiled steps a side: the input reaches train.py's flag."""
    run_uuid, _, _ = submit_and_execute(
        sandbox,
        project,
        "-P",
        "mode=profile",
        "-P",
        "workers=2",
        "-P",
        "profile_detail=lean",
        "-P",
        "unprofiled_steps=3",
    )
    sandbox.cli("ops", "artifacts", "-p", project, "-uid", run_uuid, "-d", "outputs/traces", "--path-to", str(tmp_path))
    traces = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "**" / "*.pt.trace.json.gz"), recursive=True))
    assert traces == ["trace-cycle1-steps2-4.pt.trace.json.gz", "trace-cycle2-steps7-9.pt.trace.json.gz"]
    run = get_run_json(sandbox, project, run_uuid)
    assert run["status"] == "succeeded" and run["outputs"]["profiled_step_ms"] > 0
    sandbox.cli(
        "ops", "artifacts", "-p", project, "-uid", run_uuid, "-f", "outputs/run.json", "--path-to", str(tmp_path)
    )
    with open(tmp_path / "outputs" / "run.json") as f:
        record = json.load(f)
    assert record["status"] == "succeeded", "train.py's own end, beside the status the exit code gave"
    assert record["settings"]["unprofiled_steps"] == 3 and record["results"]["unprofiled"]["steps"] == 3
    assert record["results"]["evidence"]["profiled_step_ms"] == pytest.approx(run["outputs"]["profiled_step_ms"])


def test_a_run_stopped_from_polyaxon_ends_stopped_with_its_run_json(sandbox, project, tmp_path):
    """`polyaxon ops stop` while the run trains: SIGTERM reaches train.py (the polyaxonfile execs it), which
    ends at the next step boundary, uploads run.json and sets the run's status to stopped."""
    submitted = sandbox.cli(
        "run",
        "-f",
        "polyaxonfile.yaml",
        "-u",
        "-p",
        project,
        "-P",
        "mode=bench",
        "-P",
        "workers=0",
        *[p.replace("bench_steps=2", "bench_steps=100000") for p in CPU_SIZED],
    )
    run_uuid = created_uuid(submitted.stdout)
    agent = StandInAgent(sandbox, project, run_uuid).start()
    agent.wait_for_line("bench: timing")
    sandbox.cli("ops", "stop", "-p", project, "-uid", run_uuid, "--yes")
    code, stderr = agent.terminate_when_stopping()
    assert code == 128 + 15 and "Traceback" not in stderr, stderr
    assert "stopped by SIGTERM during bench" in stderr
    assert get_run_json(sandbox, project, run_uuid)["status"] == "stopped"
    sandbox.cli(
        "ops", "artifacts", "-p", project, "-uid", run_uuid, "-f", "outputs/run.json", "--path-to", str(tmp_path)
    )
    with open(tmp_path / "outputs" / "run.json") as f:
        record = json.load(f)
    assert record["status"] == "stopped" and record["stopped"]["signal"] == "SIGTERM"
