"""Bench and profile runs read from a Polyaxon project or from offline run folders, as plain records."""

import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
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
    cycles = [c for c in (run_json.get("results") or {}).get("cycles") or [] if isinstance(c, dict)]
    recorded = [c["trace"] for c in cycles if isinstance(c.get("trace"), str)]
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
        "pictures": [p for p in (recorded_file(c["picture"], base) for c in cycles if c.get("picture")) if p],
        # the profile's traces in cycle order, those found on this machine (the roofline reads them)
        "traces": [p for p in (recorded_file(t, base) for t in recorded) if p],
        "traces_recorded": len(recorded),
        # GPU time by kernel class (diagnosis.headline), recorded in run.json by profile runs that have it
        "gpu_top_classes": outputs.get("gpu_top_classes")
        or ((run_json.get("results") or {}).get("evidence") or {}).get("gpu_top_classes"),
    }


# Runs per listing request, and run.json downloads at once (older runs only: see gather_polyaxon).
PAGE_SIZE = 100
DOWNLOADS = 8
# Newest first, the uuid breaking ties: a total order, so that no run falls between two pages.
ORDER = "-created_at,uuid"


def note(text: str) -> None:
    print(f"steplens compare: {text}", file=sys.stderr)


def gather_offline(root: str, limit: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Offline runs under root (POLYAXON_OFFLINE_ROOT), the newest `limit` only if given; and what was read,
    as gather_polyaxon gives it. A folder without a readable run.plx.json (a run still going, or killed) is
    counted, not read."""
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
    folders = sorted(os.listdir(runs_dir))
    records = [r for r in (offline_record(os.path.join(runs_dir, uuid)) for uuid in folders) if r]
    unread, matched = len(folders) - len(records), len(records)
    if limit is not None:
        records = sorted(records, key=lambda r: r["created_at"])[len(records) - limit :] if limit else []
    read = {"read": len(records), "matched": matched, "limit": limit, "root": root}
    if unread:
        read["unread"] = f"{unread} folder(s) without a finished run (no readable run.plx.json)"
    return records, read


def offline_record(base: str) -> dict[str, Any] | None:
    """One offline run's record, or None where its run.plx.json is missing or unreadable (not a finished run)."""
    try:
        with open(os.path.join(base, "run.plx.json")) as f:
            run = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    run_json = None
    try:
        with open(os.path.join(base, "outputs", "run.json")) as f:
            run_json = checked_run_json(json.load(f), os.path.basename(base))
    except OSError:
        pass  # older or failed runs have none: their facts come from the outputs
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        uuid = os.path.basename(base)
        note(f"note: {uuid}: outputs/run.json is damaged ({_why(e)}): left out; its facts come from the outputs")
    return record_from(
        os.path.basename(base),
        run.get("name"),
        run.get("created_at"),
        run.get("status"),
        run.get("inputs"),
        run.get("outputs"),
        run_json,
        run.get("status_conditions"),
        base,
    )


def list_runs(client: Any, query: str | None, limit: int | None, page_size: int) -> tuple[list[Any], int]:
    """The runs the query matches, newest first: page after page (limit and offset) until the listing is
    exhausted, or until `limit` runs are read. Returns the runs and how many the server says match.

    The end is the server's count, not a short page: a server that caps its pages below page_size
    still gets asked for the rest. A run listed twice (one created while reading shifts the pages) counts once.
    """
    runs, seen, offset, matched = [], set(), 0, 0
    while limit is None or len(runs) < limit:
        want = page_size if limit is None else min(page_size, limit - len(runs))
        page = client.list(query=query, sort=ORDER, limit=want, offset=offset)
        matched = page.count if page.count is not None else max(matched, offset + len(page.results or []))
        if not page.results:
            break
        offset += len(page.results)
        for r in page.results:
            if r.uuid not in seen:
                seen.add(r.uuid)
                runs.append(r)
        if matched > page_size:
            note(f"listing runs: {offset} of {matched}")
        if offset >= matched:
            break
    return runs[:limit], matched


def _run_json(owner: str | None, project: str, uuid: str, folder: str) -> dict[str, Any]:
    from polyaxon.client import RunClient

    path = RunClient(owner=owner, project=project, run_uuid=uuid).download_artifact(
        path="outputs/run.json", path_to=os.path.join(folder, uuid)
    )
    with open(path) as f:
        return checked_run_json(json.load(f), uuid)


# run.json's parts that records read, and the type each must have: a part of another type is left out, and named
RUN_JSON_PARTS = {"settings": dict, "environment": dict, "results": dict, "cpu_budget": dict, "error": str}


def checked_run_json(data: Any, uuid: str) -> dict[str, Any] | None:
    """run.json as records read it: an object whose parts have their types; what is not is named in one line and
    left out, so a damaged run.json costs its facts, never the comparison."""
    if not isinstance(data, dict):
        note(f"note: {uuid}: outputs/run.json is not an object ({type(data).__name__}): left out")
        return None
    bad = [k for k, kind in RUN_JSON_PARTS.items() if data.get(k) is not None and not isinstance(data[k], kind)]
    if bad:
        note(f"note: {uuid}: outputs/run.json has {', '.join(bad)} of the wrong type: left out")
    return {k: v for k, v in data.items() if k not in bad}


def _why(e: BaseException) -> str:
    """An exception in one short line (the client's HTTP errors carry the whole response)."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:160]}" if first else type(e).__name__


def fetch_run_jsons(owner: str | None, project: str, uuids: list[str], workers: int) -> dict[str, dict[str, Any]]:
    """run.json of each run, `workers` downloads at a time; a run whose download fails is named, one line each."""
    from concurrent.futures import ThreadPoolExecutor

    if not uuids:
        return {}
    note(f"downloading run.json of {len(uuids)} run(s) whose outputs lack the machine facts, {workers} at a time")
    found, failed = {}, {}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {u: pool.submit(_run_json, owner, project, u, tmp) for u in uuids}
        for u, future in futures.items():
            try:
                found[u] = future.result()
            except Exception as e:  # a run without run.json (failed early) is still compared: its facts are absent
                failed[u] = _why(e)
    for u, why in failed.items():
        note(f"note: {u}: no machine facts in its outputs and no run.json ({why})")
    return found


def project_client(project: str, run_uuid: str | None = None) -> tuple[Any, str]:
    """A Polyaxon client for project ([owner/]name), or for one of its runs, and the project's name alone."""
    try:
        from polyaxon.client import RunClient
    except ImportError as e:
        raise CompareError(f"reading Polyaxon project {project} needs its client: pip install polyaxon ({e})") from e

    owner, _, name = project.rpartition("/")
    return RunClient(owner=owner or None, project=name, run_uuid=run_uuid), name


@contextmanager
def quiet_client() -> Iterator[None]:
    """The client logs each failed request at length (a stack, the headers): here each failure is said in one line."""
    client_log = logging.getLogger("polyaxon.cli")
    was, client_log.disabled = client_log.disabled, True
    try:
        yield
    finally:
        client_log.disabled = was


def server_errors() -> tuple[type[BaseException], ...]:
    """What a failed request to the server raises."""
    import urllib3
    from polyaxon.exceptions import ApiException, PolyaxonClientException

    return ApiException, PolyaxonClientException, urllib3.exceptions.HTTPError, OSError


def server_error(project: str, client: Any, what: str, e: BaseException) -> CompareError:
    """A failed request in one line, with the host asked and what to check."""
    host = getattr(getattr(client.client, "config", None), "host", None) or "the configured host"
    return CompareError(
        f"project {project} on {host}: {what} failed ({_why(e)}); check the project's name and "
        "the host (polyaxon config set --host=...)"
    )


def gather_polyaxon(
    project: str,
    query: str | None = None,
    limit: int | None = None,
    page_size: int = PAGE_SIZE,
    workers: int = DOWNLOADS,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Runs of a Polyaxon project from the listing of their inputs and outputs, every page of it.

    The listing carries train.py's machine facts as env_* outputs; run.json is downloaded only for runs
    that lack them (older ones). limit: the newest `limit` runs only (None: all). Returns the records and
    what was read: {"read", "matched", "limit", "query", "project"} (read_line says it in words).
    """
    client, name = project_client(project)
    try:
        with quiet_client():
            listed, matched = list_runs(client, query, limit, page_size)
            run_jsons = fetch_run_jsons(
                client.owner, name, [r.uuid for r in listed if "env_host" not in (r.outputs or {})], workers
            )
    except server_errors() as e:
        raise server_error(project, client, "the run listing", e) from e
    records = [
        record_from(
            r.uuid,
            r.name,
            r.created_at,
            getattr(r.status, "value", r.status),
            r.inputs,
            r.outputs,
            run_jsons.get(r.uuid),
            r.status_conditions,
        )
        for r in listed
    ]
    read = {"read": len(records), "matched": matched, "limit": limit, "query": query, "project": project}
    return records, read


# A Polyaxon run's uuid: 32 hexadecimal digits, or the same with dashes.
RUN_UUID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")
TRACES = "outputs/traces"  # where profile mode puts a run's traces
TRACE_ENDINGS = (".pt.trace.json", ".pt.trace.json.gz")


def is_run_uuid(text: str) -> bool:
    return bool(RUN_UUID.fullmatch(text))


def server_traces(client: Any) -> list[str]:
    """A run's traces on the server, each with the .evidence.json profile mode wrote beside it: every such file
    under TRACES, as a path under the run's folder."""
    found, folders = [], [TRACES]
    while folders:
        folder = folders.pop()
        tree = client.get_artifacts_tree(path=folder)
        found += [f"{folder}/{name}" for name in tree.files or {} if name.endswith((*TRACE_ENDINGS, ".evidence.json"))]
        folders += [f"{folder}/{name}" for name in tree.dirs or []]
    return sorted(found)


def fetch_traces(project: str, uuids: list[str], folder: str) -> dict[str, list[str]]:
    """Each run's traces downloaded from the project into folder/UUID, in the run's own layout.

    Every run is checked before anything is downloaded: a run the project does not hold, or one without traces,
    is a CompareError. Returns each run's traces as paths under its folder on the server.
    """
    listed = {}
    with quiet_client():
        for uuid in uuids:
            client, _ = project_client(project, uuid)
            from polyaxon.exceptions import NotFoundException  # the client is installed: project_client says

            try:
                client.refresh_data()
                files = server_traces(client)
            except NotFoundException as e:
                raise CompareError(f"run {uuid} is not in project {project}: give one of its profile runs") from e
            except server_errors() as e:
                raise server_error(project, client, f"reading run {uuid}", e) from e
            if not any(f.endswith(TRACE_ENDINGS) for f in files):
                raise CompareError(
                    f"run {uuid} of project {project} has no traces (no *.pt.trace.json[.gz] under {TRACES}): "
                    "give a profile run"
                )
            listed[uuid] = (client, files)
        for uuid, (client, files) in listed.items():
            for path in files:
                try:  # the client draws a progress bar on stdout, which holds this command's own output
                    with open(os.devnull, "w") as nowhere, redirect_stdout(nowhere):
                        client.download_artifact(path=path, path_to=os.path.join(folder, uuid))
                except server_errors() as e:
                    raise server_error(project, client, f"the download of {path} of run {uuid}", e) from e
    return {uuid: [f for f in files if f.endswith(TRACE_ENDINGS)] for uuid, (_, files) in listed.items()}


def read_line(read: dict[str, Any]) -> str:
    """How many runs were read of how many matched, in words."""
    where = f"runs in project {read['project']}" if "project" in read else f"offline runs under {read['root']}"
    matching = f" matching {read['query']!r}" if read.get("query") else ""
    text = f"read {read['read']} of the {read['matched']} {where}{matching}"
    if read.get("limit") is not None and read["matched"] > read["read"]:
        text += f": the newest {read['read']} (--limit {read['limit']})"
    elif read["read"] < read["matched"]:
        text += f": {read['matched'] - read['read']} of them not read"
    if read.get("unread"):
        text += f"; left unread: {read['unread']}"
    return text


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
