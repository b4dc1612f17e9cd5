"""Whether this process runs inside a Polyaxon job, and which run it is."""

import os
import sys
import time
from collections.abc import Callable
from types import ModuleType

OWNER = "default"  # what offline tracking and the local viewer call the owner
PROJECT = "pytorch-training-profiler"  # the Polyaxon project of local runs


def is_managed() -> bool:
    return bool(os.environ.get("POLYAXON_RUN_INSTANCE")) or os.environ.get("POLYAXON_IS_MANAGED", "").lower() in (
        "1",
        "true",
        "yes",
    )


def managed_identity() -> dict[str, str]:
    """owner, project and run uuid from POLYAXON_RUN_INSTANCE (owner.project.runs.uuid), passed explicitly
    so that no client cache on the machine can point tracking at another run."""
    parts = os.environ.get("POLYAXON_RUN_INSTANCE", "").split(".")
    if len(parts) == 4 and parts[2] == "runs":
        return {"owner": parts[0], "project": parts[1], "run_uuid": parts[3]}
    return {}


def asked(what: str, call: Callable[[], object]) -> bool:
    """call(), a request to the Polyaxon server, asked again while the server refuses it (the sandbox answers 405
    now and then); one still refused after four tries is warned about in a line naming what. The run's files
    stand either way. Returns whether the server took it."""
    for attempt in range(4):
        try:
            call()
            return True
        except Exception as e:  # the client raises its ApiException, or a connection error
            if attempt == 3:
                print(
                    f"warning: the Polyaxon server did not take {what} ({type(e).__name__}: "
                    f"{(str(e).splitlines() or [''])[0][:200]})",
                    file=sys.stderr,
                )
            else:
                time.sleep(1.0)  # not timed: the run's work is done
    return False


def tell(tracking: ModuleType, description: str, readme: str) -> None:
    """The run's one-line description and its readme (the overview panel of its page in Polyaxon's UI), through
    polyaxon.tracking after init()."""

    def both():
        tracking.set_description(description, async_req=False)
        tracking.set_readme(readme, async_req=False)

    asked("the run's readme", both)


def log_outputs(tracking: ModuleType, paths: dict[str, str], what: str) -> bool:
    """Files in the run's outputs (paths: artifact name -> path), logged as its artifacts in one request, through
    polyaxon.tracking after init(). Synchronous, so that a refusal is seen and asked again: the client's own
    log_artifact sends its lineage asynchronously, and drops it where the process ends first."""
    from polyaxon.schemas import V1ArtifactKind, V1RunArtifact

    run_folder = tracking.get_artifacts_path()
    # The summary's path is relative to the artifacts store, as the client's own log_artifact_ref gives it where it
    # skips the file's hash (with the hash it gives the absolute path). The server answers a lineage without a
    # summary with 405.
    lineage = [
        V1RunArtifact(
            name=name,
            kind=V1ArtifactKind.FILE,
            path=os.path.relpath(path, run_folder),
            summary={"path": os.path.relpath(path, os.path.dirname(run_folder))},
            is_input=False,
        )
        for name, path in paths.items()
    ]
    return asked(what, lambda: tracking.TRACKING_RUN.log_artifact_lineage(lineage, False))


def namespace() -> str:
    """The Kubernetes namespace of this job: Polyaxon's converter sets POLYAXON_K8S_NAMESPACE in every job's pod,
    from the pod's own metadata. Outside a cluster "default": the local viewer's streams service takes any."""
    return os.environ.get("POLYAXON_K8S_NAMESPACE") or "default"


def artifact_url(owner: str, project: str, run_uuid: str, path: str, namespace: str) -> str:
    """The URL path, on Polyaxon's own host, where its streams service serves one file of a run.

    path is relative to the run's folder (e.g. "outputs/traces/x.png"). The URL is relative to the host
    (it starts with /streams), so a readme that holds it works behind any host name or proxy.
    ValueError for an absolute path, a path that leaves the run's folder, or an empty part.
    """
    from urllib.parse import quote

    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a path inside the run's folder: {path!r}")
    for name, value in (("namespace", namespace), ("owner", owner), ("project", project), ("run uuid", run_uuid)):
        if not value or "/" in value:
            raise ValueError(f"bad {name} for a streams URL: {value!r}")
    head = "/".join(quote(v, safe="") for v in (namespace, owner, project))
    return f"/streams/v1/{head}/runs/{quote(run_uuid, safe='')}/ro_artifact/{quote('/'.join(parts), safe='/')}"
