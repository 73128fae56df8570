"""Helper threads for the file system calls a commit need not wait for one after the other:
the fsyncs of a payload file and its directory (run together, writer.py), and the freeing of a
replaced payload file's blocks (directory.py). One small pool per process, made when first used."""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["submit"]

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def submit(fn, *args) -> Future | None:
    """Run ``fn(*args)`` on a helper thread; None when no thread can start (the interpreter is
    shutting down): the caller then runs it itself."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(4, thread_name_prefix="tensordb-files")
        pool = _pool
    try:
        return pool.submit(fn, *args)
    except RuntimeError:
        return None
