"""Seconds spent in object-store requests, by kind, in the process that makes them: the client
(bench_object_store.py installs these on its own ObjectStore) and each Dask worker (installed
and read with ``Client.run``, which is why this is a module of its own: functions of the
benchmark's ``__main__`` cannot be unpickled on a worker).

    install()            # wrap ObjectStore's request methods in this process (once)
    take() -> dict       # {kind: seconds} since the last take, and zeroed
"""
from __future__ import annotations

import threading
import time

__all__ = ["KINDS", "install", "take"]

# kind -> the ObjectStore methods counted as it
KINDS = {"put": ("put", "put_bytes", "put_part"), "part": ("upload_part",),
         "complete": ("complete_upload",), "read": ("read",)}
_SPENT = {k: 0.0 for k in KINDS}
_LOCK = threading.Lock()
_DONE: list = []


def install(dask_worker=None) -> bool:
    """Wrap the request methods once per process (``dask_worker``: passed by ``Client.run``)."""
    if _DONE:
        return False
    from tensordb.storage.objects import ObjectStore
    for kind, methods in KINDS.items():
        for method in methods:
            real = getattr(ObjectStore, method, None)
            if real is not None:
                setattr(ObjectStore, method, _wrap(real, kind))
    _DONE.append(True)
    return True


def _wrap(real, kind):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            with _LOCK:
                _SPENT[kind] += time.perf_counter() - t0
    return wrapper


def take(dask_worker=None) -> dict:
    with _LOCK:
        out = dict(_SPENT)
        for k in _SPENT:
            _SPENT[k] = 0.0
    return out
