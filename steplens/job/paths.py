"""Where the job's files live: the folder that holds train.py beside this package."""

import os

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(PACKAGE)  # the repository: train.py, polyaxonfile.yaml, steplens/
DEFAULT_OFFLINE_ROOT = os.path.join(ROOT, ".polyaxon-offline")  # offline runs land here, never inside the package
DEFAULT_DATA_DIR = os.path.join(ROOT, "data")


def source_files() -> list[str]:
    """train.py and every module of the package, sorted by path: what source_sha256 hashes."""
    paths = [os.path.join(ROOT, "train.py")]
    for folder, _, names in os.walk(PACKAGE):
        paths += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    return sorted(p for p in paths if os.path.exists(p))
