"""What runs on the Dask workers: each plan task on the shared runtime, and the records of a run.

The client (``dask.py``) ships these functions in its graph and collects the records with
``client.run(collect, run_id)`` once the outputs are gathered; ``forget`` drops a failed run's.
A worker keeps, per run: one ``TaskRunner`` (kernel specs built once), each task's seconds and
tile bytes, and the most bytes Dask held on it. With a device backend (``backend=cupy``) it
also keeps the stored tiles its Loads copied onto its GPU, from one query to the next
(``devcache.DeviceCache``, keyed by payload file, tensor version and box; a quarter of the
device's memory, least recently used first): a Load of a version it holds copies nothing, and
the tiles of a tensor's other versions go when a Load of a new one arrives.
"""
from __future__ import annotations

import functools
import os
import time
from collections import defaultdict

import numpy as np

from ..physical.plan import Aggregate, Load
from ..storage import identity
from ..storage.objparts import ObjectSlot, forget_spools, write_object_slot
from ..storage.slots import write_slot
from ..storage.sparse import is_sparse, tile_nbytes
from .runtime import TaskRunner

__all__ = ["Payload", "run_task", "write_output", "to_host", "collect", "forget", "gpu_count",
           "cache_figures", "probe_database"]

_LOG: dict[str, list] = defaultdict(list)    # run id -> (key, seconds, nbytes, moved) per task
_RAN: dict[str, set] = defaultdict(set)      # run id -> Dask keys of the tasks run here
_HELD: dict[str, int] = defaultdict(int)     # run id -> most bytes the worker held during the run
_RUNNERS: dict[str, TaskRunner] = {}         # run id -> the task interpreter, once per worker
_CACHE: list = []                            # [DeviceCache, capacity]: device backends only
_WRITES: dict[str, float] = {}               # run id -> seconds spent writing output tiles


@functools.lru_cache(maxsize=None)
def _xp(backend: str):
    from .kernels import get_backend
    return get_backend(backend)  # once per worker process: CuPy's device check is not free


class Payload:
    """A task record, its operation and a Load's reader. Dask tokenizes every graph it is given;
    the unique key stands for the contents, which would otherwise be hashed field by field."""

    __slots__ = ("key", "task", "op", "source", "choice", "inputs", "given", "slot")

    def __init__(self, key: str, task, op, source, choice=None, inputs=(), given=(),
                 slot=None) -> None:
        self.key, self.task, self.op, self.source, self.choice = key, task, op, source, choice
        # the Dask keys of its inputs, and those of them the client scattered (not made by a
        # worker): an input made on another worker is a tile moved (``run_task``)
        self.inputs, self.given = tuple(inputs), frozenset(given)
        # a stored output tile no other task reads: written here (its TileSlot), and only its
        # facts returned
        self.slot = slot

    def __dask_tokenize__(self):
        return self.key

    def __getstate__(self):
        return (self.key, self.task, self.op, self.source, self.choice, self.inputs, self.given,
                self.slot)

    def __setstate__(self, state) -> None:
        (self.key, self.task, self.op, self.source, self.choice, self.inputs,
         self.given, self.slot) = state


def _name_this_worker(worker=None) -> None:
    """Errors raised here (a payload of another database) name this worker's address."""
    if identity.named():
        return
    try:
        if worker is None:
            from distributed import get_worker
            worker = get_worker()
        identity.set_process_label(f"Dask worker {worker.address}")
    except Exception:  # noqa: BLE001 - not on a worker: the process id names it
        pass


def probe_database(root: str, database: str, dask_worker=None) -> str | None:
    """Run on each worker (``client.run``, which passes ``dask_worker``): None when it sees
    database ``database`` at ``root``, else why not, naming the worker."""
    _name_this_worker(dask_worker)
    return identity.sees_database(root, database)


def run_task(run: str, backend: str, payload: Payload, *inputs):
    """Run one tile task on the shared runtime, recording its time on this worker."""
    _name_this_worker()
    task = payload.task
    xp = _xp(backend)
    runner = _RUNNERS.get(run)
    if runner is None:
        runner = _RUNNERS[run] = TaskRunner(xp)
    t0 = time.perf_counter()
    inputs = list(inputs)
    if isinstance(task, Aggregate):
        # Dask keeps every input in the worker's store until it is released: never write into
        # one, so the accumulator starts from a copy.
        # (A sparse partial, a CSR output tile, is never written into: combined into new ones.)
        if not is_sparse(inputs[0]):
            inputs[0] = xp.array(inputs[0], dtype=task.dtype, copy=True)
    if isinstance(task, Load) and xp is not np and payload.source is not None and \
            payload.source.path is not None:
        value = _cached_load(xp, runner, payload)
    else:
        value = runner.run(task, inputs, payload.op, choice=payload.choice,
                           source=payload.source)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()  # time the kernel, not its launch
    # Measured as the local pool measures it: each input this task read that another worker
    # made (it came here by a transfer); a tile the client scattered is not a worker's.
    ran = _RAN[run]
    moved = sum(tile_nbytes(v) for k, v in zip(payload.inputs, inputs)
                if k not in ran and k not in payload.given)
    ran.add(payload.key)
    _LOG[run].append((task.key, time.perf_counter() - t0, tile_nbytes(value), moved))
    _HELD[run] = max(_HELD[run], _worker_bytes())
    if payload.slot is not None:
        return write_output(run, payload.slot, value)
    return value


def write_output(run: str, slot, tile):
    """Write a stored output tile into its place in the new payload file, on the worker that
    computed it (storage/slots.py), and return only its facts (TileFacts) to the client."""
    _name_this_worker()
    t0 = time.perf_counter()
    if not isinstance(tile, np.ndarray):
        tile = to_host(tile)  # a device tile: its bytes go to the file from host memory
    facts = write_object_slot(run, slot, tile) if isinstance(slot, ObjectSlot) else \
        write_slot(slot, tile)
    _WRITES[run] = _WRITES.get(run, 0.0) + time.perf_counter() - t0
    return facts


def _cached_load(xp, runner, payload):
    """A Load on a device backend: the tile this worker's GPU keeps from an earlier query, or
    the box copied host -> device and kept (this worker's device cache)."""
    from .devcache import DeviceCache
    if not _CACHE:
        try:
            capacity = int(xp.cuda.runtime.memGetInfo()[1]) // 4
        except Exception:  # noqa: BLE001 - a stand-in without device memory to ask about
            capacity = 1 << 30
        _CACHE[:] = [DeviceCache(), capacity]
    cache, capacity = _CACHE
    reader, task = payload.source, payload.task
    # tensors of several databases may meet on one worker: the payload's directory names one
    name = f"{os.path.dirname(reader.path)}/{reader.meta.name}"
    cache.keep_version(name, reader.meta.version)
    key = (name.lower(), reader.meta.version, tuple(task.starts), tuple(task.stops))
    value = cache.get(key, 0, held=False)
    if value is None:
        value = runner.run(task, (), payload.op, source=reader)
        cache.put(key, 0, value, held=False)
        if cache.bytes > capacity:
            cache.make_room(cache.bytes - capacity)
    return value


def cache_figures() -> dict:
    """This worker's device cache: tiles and bytes kept (empty without one)."""
    return {"tiles": len(_CACHE[0]), "bytes": _CACHE[0].bytes} if _CACHE else {}


def _worker_bytes() -> int:
    try:
        from distributed import get_worker
        return int(get_worker().state.nbytes)
    except Exception:  # noqa: BLE001 - not on a worker, or an older WorkerState
        return 0


def to_host(value):
    import cupy
    return cupy.asnumpy(value)


def collect(run: str):
    """The worker's records of one run (then forgotten): ([(key, s, nbytes, moved)], peak,
    seconds spent writing output tiles)."""
    records, held, writes = _LOG.pop(run, []), _HELD.pop(run, 0), _WRITES.get(run, 0.0)
    forget(run)
    return records, held, writes


def forget(run: str) -> None:
    forget_spools(run)  # the parts of output objects this worker was filling
    _LOG.pop(run, None)
    _HELD.pop(run, None)
    _RUNNERS.pop(run, None)
    _WRITES.pop(run, None)
    _RAN.pop(run, None)


def gpu_count():
    try:
        from .kernels import get_backend
        return int(get_backend("cupy").cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - reported to the client
        return str(exc)
