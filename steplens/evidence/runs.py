"""Bench and profile runs read from a Polyaxon project or from offline run folders, as plain records."""

import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from typing import Any

from steplens.atomic import recorded_file

# Outputs of older train.py runs under their former names ("kernel-time limit"), read where the new ones are missing.
OLD_NAMES = {"gpu_bound_share": "share_of_gpu_limit", "gpu_time_samples_per_sec": "gpu_limit_samples_per_sec"}


class CompareError(Exception):
    pass


def moment(value: datetime | str | None) -> str:
    """A start time as an ISO string in UTC, so that runs from either source sort in start order."""
    if value in (None, ""):
        return ""
    try:
        d = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).isoformat()


def failure_of(conditions: list[Any] | None) -> str | None:
    """reason: message of the last failed status condition, if any."""
    for c in reversed(conditions or []):
        c = c if isinstance(c, dict) else c.to_dict()
        if c.get("type") == "failed":
            return ": ".join(str(v) for v in (c.get("reason"), c.get("message")) if v) or None
    return None


def record_from(
    uuid: str,
    name: str | None,
    created_at: datetime | str | None,
    status: str | None,
    inputs: dict[str, Any] | None,
    outputs: dict[str, Any] | None,
    run_json: dict[str, Any] | None,
    conditions: list[Any] | None = None,
    base: str | None = None,
) -> dict[str, Any]:
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
        machine = {
            "host": env.get("hostname"),
            "gpu": env.get("gpu"),
            "driver": env.get("driver"),
            "torch": env.get("torch"),
            "cuda": env.get("cuda"),
            "cpu_budget": (run_json.get("cpu_budget") or {}).get("cpus"),
            "machine_id": env.get("machine_id"),
            "boot_id": env.get("boot_id"),
            "gpu_uuid": env.get("gpu_uuid"),
        }
        facts = "run.json" if env else None
    return {
        "uuid": uuid,
        "name": name,
        "created_at": moment(created_at),
        "status": status,
        "logged_inputs": settings is not None,
        "settings": dict(settings or {}),
        "mode": (settings or {}).get("mode"),
        "outputs": outputs,
        "samples_per_sec": outputs.get("samples_per_sec"),
        "machine": machine,
        "facts_from": facts,
        "error": run_json.get("error") or failure_of(conditions),
        "window_restarts": outputs.get(
            "epoch_restarts_in_window", (run_json.get("results") or {}).get("epoch_restarts_in_window")
        ),
        "pictures": [
            p
            for p in (
                recorded_file(c["picture"], base)
                for c in (run_json.get("results") or {}).get("cycles") or []
                if c.get("picture")
            )
            if p
        ],
        # GPU time by kernel class (diagnosis.headline), recorded in run.json by profile runs that have it
        "gpu_top_classes": outputs.get("gpu_top_classes")
        or ((run_json.get("results") or {}).get("evidence") or {}).get("gpu_top_classes"),
    }


def gather_offline(root: str) -> list[dict[str, Any]]:
    runs_dir = os.path.join(root, "runs")
    if not os.path.isdir(root):
        raise CompareError(
            f"{root} does not exist or is not a folder: give the folder POLYAXON_OFFLINE_ROOT "
            "pointed at when train.py ran"
        )
    if not os.path.isdir(runs_dir):
        raise CompareError(
            f"{root} holds no offline runs (no runs/ folder): run train.py first, "
            "or give the folder POLYAXON_OFFLINE_ROOT pointed at"
        )
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
        records.append(
            record_from(
                uuid,
                run.get("name"),
                run.get("created_at"),
                run.get("status"),
                run.get("inputs"),
                run.get("outputs"),
                run_json,
                run.get("status_conditions"),
                base,
            )
        )
    return records


def gather_polyaxon(project: str, query: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
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
                    print(
                        f"steplens compare: note: {r.uuid}: no machine facts in its outputs and no run.json "
                        f"({type(e).__name__})",
                        file=sys.stderr,
                    )
            status = getattr(r.status, "value", r.status)
            records.append(
                record_from(r.uuid, r.name, r.created_at, status, r.inputs, r.outputs, run_json, r.status_conditions)
            )
    return records


# The ids tell apart machines that share a hostname; runs recorded before them have None, a value of its own.
MACHINE_IDS = ("machine_id", "boot_id", "gpu_uuid")


MACHINE = ("host", "gpu", "driver", "torch", "cuda", "cpu_budget") + MACHINE_IDS


def world_settings(run_json: dict[str, Any], outputs: dict[str, Any] | None) -> dict[str, Any]:
    """world_size and nproc_per_node as settings, so that grouping never pools runs of different world sizes
    (a run without them, from before DDP, was one process)."""
    world = run_json.get("distributed") or {}
    return {
        "world_size": world.get("world_size", (outputs or {}).get("world_size", 1)),
        "nproc_per_node": world.get("local_world_size", 1),
    }
