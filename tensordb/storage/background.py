"""Helper threads for the file system calls a commit need not wait for one after the other:
the fsyncs of a payload file and its directory (run together, writer.py), and the freeing of a
replaced payload file's blocks (directory.py). One small pool per process, made when first used."""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["submit"]

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


# The cores of the process when it imported us: a helper thread started by a worker thread that
# keeps to one core (exec/pool.py) would inherit that core; it may run on any.
_CORES = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def _any_core() -> None:
    if _CORES is not None:
        try:
            os.sched_setaffinity(0, _CORES)
        except OSError:
            pass


# Set while this thread is inside ``submit``. A garbage collection there may run a finalizer
# (a collected connection closes its store, whose spare files go through ``submit``), and the
# executor's locks are not reentrant: the nested call would wait for its own thread forever
# (seen: a test run hung in ThreadPoolExecutor.submit under Store.close under a collection).
_inside = threading.local()


def submit(fn, *args) -> Future | None:
    """Run ``fn(*args)`` on a helper thread; None when no thread can start (the interpreter is
    shutting down) or when called from within ``submit`` itself (a finalizer run by a garbage
    collection there): the caller then runs it itself."""
    global _pool
    if getattr(_inside, "busy", False):
        return None
    _inside.busy = True
    try:
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(4, thread_name_prefix="tensordb-files",
                                           initializer=_any_core)
            pool = _pool
        return pool.submit(fn, *args)
    except RuntimeError:
        return None
    finally:
        _inside.busy = False
