"""Whether this process runs inside a Polyaxon job, and which run it is."""

import os

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
