"""Checks made before any heavy work: the places to write are writable, the workers fit the CPU budget."""

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Iterable
from typing import Any

from steplens.errors import UserError
from steplens.job.paths import DEFAULT_OFFLINE_ROOT
from steplens.polyaxonenv import is_managed


def writable_dirs(places: Iterable[tuple[str, str]]) -> list[str]:
    """Each (path, flag) made (or found) a folder this process can write; else UserError naming it and the
    problem, with the folders made here removed again (nothing is left behind). Returns the folders it made,
    outermost first (remove_made takes them away if a later check refuses the run)."""
    made = []
    try:
        for path, flag in places:
            path = os.path.abspath(path)
            if os.path.exists(path) and not os.path.isdir(path):
                raise UserError(f"{flag} {path} is a file, not a folder")
            missing = []
            parent = path
            while not os.path.exists(parent):
                missing.append(parent)
                parent = os.path.dirname(parent)
            try:
                try:
                    os.makedirs(path, exist_ok=True)
                finally:  # the levels made before a failure deeper down are removed too
                    made += [m for m in reversed(missing) if os.path.isdir(m)]
                probe = tempfile.NamedTemporaryFile(dir=path, prefix=".partial-probe-")
                probe.close()
            except OSError as e:
                raise UserError(f"{flag} {path} is not a writable folder ({e.strerror or e})") from e
    except UserError:
        remove_made(made)
        raise
    return made


def check_places(args: argparse.Namespace) -> list[str]:
    """Every place the run writes to, made (or found) writable before any heavy work; one line otherwise.
    Returns the folders made (writable_dirs)."""
    places = [(args.output_dir, "--output-dir")] if args.output_dir else []
    if args.data == "cifar10":
        # Checked, not made: the download makes the folder, and removes it again if it fails.
        places.append((existing_part(args.data_dir), "--data-dir"))
    if not is_managed():
        places.append((os.environ.get("POLYAXON_OFFLINE_ROOT") or DEFAULT_OFFLINE_ROOT, "POLYAXON_OFFLINE_ROOT"))
    return writable_dirs(places)


def remove_made(made: list[str]) -> None:
    """The folders writable_dirs made, removed where they are still empty (a run refused before it wrote any)."""
    for path in reversed(made):
        try:
            os.rmdir(path)
        except OSError:
            pass


def refused(e: Exception, before_run: bool, made: list[str]) -> int:
    """train.py's end on a UserError: its one line on stderr, and the exit status: 2 where the run was refused
    before it began (the folders made for it removed where still empty), else 1 (the run records the failure)."""
    if before_run:
        remove_made(made)
    print(f"train.py: error: {e}", file=sys.stderr)
    return 2 if before_run else 1


def existing_part(path: str) -> str:
    """path itself when it exists, else its nearest parent that does (where path would be made)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def check_workers(args: argparse.Namespace, budget: dict[str, Any]) -> str | None:
    """More workers than CPUs is allowed (and said); far more is refused unless forced."""
    bound = max(4, math.ceil(4 * budget["cpus"]))
    if args.workers > bound and not args.force_workers:
        raise UserError(
            f"--workers {args.workers} is more than 4x the CPU budget ({budget['cpus']:g} CPUs, "
            f"{budget['source']}): each worker is a process holding batches; use at most {bound}, "
            "or add --force-workers"
        )
    if args.workers > budget["cpus"]:
        note = (
            f"--workers {args.workers} is above the CPU budget ({budget['cpus']:g} CPUs, {budget['source']}): "
            "the workers and the training thread will share CPUs"
        )
        print(f"train.py: warning: {note}", file=sys.stderr)
        return note
    return None
