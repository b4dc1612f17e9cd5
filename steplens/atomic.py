"""Files written whole or not at all (temp file + rename), and stored file paths relocated."""

import json
import os
from typing import Any


def recorded_file(path: str, base: str | None) -> str | None:
    """A file an offline run recorded, found under the run's own folder base when the run was recorded on
    another machine (its path ends in /outputs/...); relative when under the current folder; None if absent."""
    if base and not os.path.exists(path) and "/outputs/" in path:
        path = os.path.join(base, "outputs", path.split("/outputs/", 1)[1])
    if not os.path.exists(path):
        return None
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def run_record_near(path: str) -> tuple[str, dict[str, Any]] | None:
    """The run.json of the train.py run a path lies in, and where it is: for a trace, two or three levels up
    (outputs/traces/X, or outputs/traces/rankR/X in DDP); for a folder, in it, in its outputs/, or one level up
    (a run's folder, its outputs, its traces). None where no readable run.json with settings is there."""
    folder = os.path.abspath(path)
    if os.path.isdir(folder):
        places = [folder, os.path.join(folder, "outputs"), os.path.dirname(folder)]
    else:
        places = [os.path.dirname(os.path.dirname(folder)), os.path.dirname(os.path.dirname(os.path.dirname(folder)))]
    for place in places:
        found = os.path.join(place, "run.json")
        try:
            with open(found) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("settings"), dict):
            return found, record
    return None


def write_atomic(path: str, data: bytes | str, replace: bool = True) -> str:
    """Write bytes or text to path through a temp file and a rename: never a half-written file.
    replace=False: a file already at path is kept (a hard link, which fails where one exists)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{os.path.basename(path)}")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError:  # a filesystem without hard links: a rename, unless another writer came first
                if not os.path.exists(path):
                    os.replace(tmp, path)
            if os.path.exists(tmp):
                os.remove(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def write_json_atomic(path: str, obj: Any) -> str:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
