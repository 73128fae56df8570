"""Where a run's spill files live, and removing the ones a killed process left behind.

The executor spills intermediate tiles of a run to ``<database dir>/spill/run-<pid>-<n>/`` (the
directory DuckDB's own temporary files use too; they never start with ``run-``), or, for an
in-memory or read-only database, to a ``tensordb-spill-`` directory of the system's temporary
directory (``tensordb-spill-<pid>-...``). The run removes its directory when it ends, however it
ends; a database opened for writing removes the ``run-`` directories a killed process left (the
one writer at a time is the only process that runs queries on it, so none of them is another
run's), and a run making a temporary directory removes those of processes that no longer exist.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile

__all__ = ["SPILL_DIR", "RUN_PREFIX", "TEMP_PREFIX", "make_run_directory", "remove_leftover_runs",
           "remove_orphan_temporary_runs"]

SPILL_DIR = "spill"
RUN_PREFIX = "run-"
TEMP_PREFIX = "tensordb-spill-"
_runs = itertools.count()


def make_run_directory(store=None) -> str:
    """A fresh directory for one run's spill files (see the module docstring)."""
    root = getattr(store, "root", None)
    if root is not None and getattr(store, "persistent", False) and not store.read_only:
        parent = os.path.join(str(root), SPILL_DIR)
        os.makedirs(parent, exist_ok=True)
        while True:
            path = os.path.join(parent, f"{RUN_PREFIX}{os.getpid()}-{next(_runs)}")
            try:
                os.mkdir(path)
                return path
            except FileExistsError:  # a leftover of a killed process with our pid
                continue
    remove_orphan_temporary_runs()
    return tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")


def remove_orphan_temporary_runs() -> None:
    """Remove the temporary spill directories (``tensordb-spill-<pid>-...``) of processes that
    no longer exist: an in-memory database has no next open to clean up after a kill -9."""
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        pid = entry.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # the process is gone: nothing of it is running
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # alive under another user
            pass


def remove_leftover_runs(root) -> None:
    """Remove the spill directories of runs a killed process left in database ``root``."""
    parent = os.path.join(str(root), SPILL_DIR)
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(RUN_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
