"""What runs on the Dask workers: a group of plan tasks on the shared runtime, and its records.

The client (``dask_run.py``) fuses each worker's tasks of one stage into one Dask task
(``dask_fuse.py``); ``run_group`` runs them in order on this worker, each on the shared runtime
(``TaskRunner``: kernel specs built once per group), frees each intermediate tile after its last
reader, writes the stored output tiles it has a slot for, and returns a ``GroupOut``: the tiles
other groups read, the tiles the client gathers, and, travelling down the graph to the groups
the client gathers, the facts of the tiles written here and the records of every task run (its
seconds, tile bytes and bytes moved; the most bytes the worker held). Nothing of a run stays on
the worker but the parts of an output object it is still filling (storage/objparts.py: a part
goes up with its last tile; ``forget`` drops those of a run given up). A group the client cancelled (a
failed query, a lost worker) stops before its next task. With a device backend
(``backend=cupy``) the worker also keeps the stored tiles its Loads copied onto its GPU, from one
query to the next (``devcache.DeviceCache``, keyed by payload file, tensor version and box; a
quarter of the device's memory, least recently used first): a Load of a version it holds copies
nothing, and the tiles of a tensor's other versions go when a Load of a new one arrives.
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np

from ..physical.plan import Aggregate, Load
from ..storage import identity
from ..storage.objparts import ObjectSlot, forget_spools, write_object_slot
from ..storage.slots import write_slot
from ..storage.sparse import is_sparse, tile_nbytes
from .runtime import Cancelled, TaskRunner

__all__ = ["Step", "Group", "GroupOut", "run_group", "pick", "forget", "to_host", "gpu_count",
           "cache_figures", "probe_database"]

_CACHE: list = []                            # [DeviceCache, capacity]: device backends only


@functools.lru_cache(maxsize=None)
def _xp(backend: str):
    from .kernels import get_backend
    return get_backend(backend)  # once per worker process: CuPy's device check is not free


class Step:
    """One plan task of a group. ``args``: where each input is, ``(-1, key)`` a tile of this
    group, ``(i, key)`` tile ``key`` of the group's ``i``-th Dask input, ``(i, None)`` that
    input itself (a tile the client scattered); ``moved``: per input, whether another worker
    made it (the bytes moved, as the local pool counts them); ``slot``: the TileSlot of a
    stored output tile written here; ``export``: another group reads it; ``client``: the
    client gathers it; ``uses``: how many tasks of this group read it."""

    __slots__ = ("task", "op", "source", "choice", "args", "moved", "slot", "export", "client",
                 "uses")

    def __init__(self, task, op, source, choice, args, moved, slot, export, client,
                 uses) -> None:
        self.task, self.op, self.source, self.choice = task, op, source, choice
        self.args, self.moved, self.slot = args, moved, slot
        self.export, self.client, self.uses = export, client, uses

    def __getstate__(self):
        return tuple(getattr(self, f) for f in self.__slots__)

    def __setstate__(self, state) -> None:
        for f, v in zip(self.__slots__, state):
            setattr(self, f, v)


class Group:
    """The steps of one Dask task, in the order they run. Dask tokenizes every graph it is
    given: the unique key stands for the contents, which would otherwise be hashed."""

    __slots__ = ("key", "steps")

    def __init__(self, key: str, steps: list) -> None:
        self.key, self.steps = key, steps

    def __dask_tokenize__(self):
        return self.key

    def __getstate__(self):
        return self.key, self.steps

    def __setstate__(self, state) -> None:
        self.key, self.steps = state


class GroupOut:
    """What a group returns. ``values``: plan key -> tile, for other groups; ``client``: plan
    key -> tile, for the client; ``facts``: plan key -> TileFacts of the tiles written (here or
    by the groups before); ``records``: group key -> (worker, [(plan key, seconds, nbytes,
    moved)], most bytes held, seconds writing), this group's and those before it."""

    __slots__ = ("values", "client", "facts", "records")

    def __init__(self, values=None, client=None, facts=None, records=None) -> None:
        self.values = {} if values is None else values
        self.client = {} if client is None else client
        self.facts = {} if facts is None else facts
        self.records = {} if records is None else records

    def __getstate__(self):
        return self.values, self.client, self.facts, self.records

    def __setstate__(self, state) -> None:
        self.values, self.client, self.facts, self.records = state

    def __sizeof__(self) -> int:  # what Dask counts as held on the worker
        return sum(tile_nbytes(v) for d in (self.values, self.client)
                   for v in d.values()) + 64 * (len(self.facts) + len(self.records))

    def take(self, before: "GroupOut") -> None:
        """The facts and records of a group this one read."""
        self.facts.update(before.facts)
        self.records.update(before.records)


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


def run_group(run: str, backend: str, group: Group, *deps):
    """Run a group's tasks in order on this worker (see the module's docstring)."""
    worker = _this_worker()
    _name_this_worker(worker)
    xp = _xp(backend)
    runner = TaskRunner(xp)
    out = GroupOut()
    for d in deps:
        if isinstance(d, GroupOut):
            out.take(d)
    local: dict = {}     # plan key -> tile made here that tasks of the group still read
    left: dict = {}      # plan key -> how many of them still will
    live = peak = 0      # bytes of those tiles, and their most
    rows, writes = [], 0.0
    for step in group.steps:
        if worker is not None and not _wanted(worker, group.key):
            raise Cancelled(f"{group.key} was cancelled")  # nobody waits for it any more
        task = step.task
        inputs = [local[k] if i < 0 else deps[i] if k is None else deps[i].values[k]
                  for i, k in step.args]
        t0 = time.perf_counter()
        if isinstance(task, Aggregate):
            # an input may be read by other tasks or held in Dask's store: never write into
            # one, so the accumulator starts from a copy (a sparse partial, a CSR output tile,
            # is never written into: it is combined into new ones)
            if not is_sparse(inputs[0]):
                inputs[0] = xp.array(inputs[0], dtype=task.dtype, copy=True)
        if isinstance(task, Load) and xp is not np and step.source is not None and \
                step.source.path is not None:
            value = _cached_load(xp, runner, step)
        else:
            value = runner.run(task, inputs, step.op, choice=step.choice, source=step.source)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()  # time the kernel, not its launch
        nbytes = tile_nbytes(value)
        moved = sum(tile_nbytes(v) for v, m in zip(inputs, step.moved) if m)
        rows.append((task.key, time.perf_counter() - t0, nbytes, moved))
        del inputs
        for i, k in step.args:
            if i < 0:
                left[k] -= 1
                if not left[k]:
                    live -= tile_nbytes(local.pop(k))
        if step.slot is not None:
            t1 = time.perf_counter()
            out.facts[task.key] = write_output(run, step.slot, value)
            writes += time.perf_counter() - t1
        if step.client:
            out.client[task.key] = value if xp is np else to_host(value)
        if step.export:
            out.values[task.key] = value
        if step.uses:
            local[task.key], left[task.key] = value, step.uses
            live += nbytes
            peak = max(peak, live)
    address = worker.address if worker is not None else ""
    out.records[group.key] = (address, rows, _worker_bytes(worker) + peak, writes)
    return out


def pick(keys: tuple, client: bool, before: GroupOut) -> GroupOut:
    """Part of what a group returned, on its worker: the tiles ``keys`` another worker reads,
    or (``client``) the tiles the client gathers; the facts and records go along."""
    out = GroupOut({k: before.values[k] for k in keys}, before.client if client else None)
    out.take(before)
    return out


def write_output(run: str, slot, tile):
    """Write a stored output tile into its place in the new payload file (storage/slots.py), or
    into its part of an output object (an ``ObjectSlot``: storage/objparts.py, which uploads the
    part once its last tile is in), and return only its facts."""
    if not isinstance(tile, np.ndarray):
        tile = to_host(tile)  # a device tile: its bytes go to the file from host memory
    return write_object_slot(run, slot, tile) if isinstance(slot, ObjectSlot) else \
        write_slot(slot, tile)


def forget(run: str) -> None:
    """Drop the parts of output objects this worker was filling for ``run`` (a query given up,
    or one whose parts all went up: then there is nothing left to drop)."""
    forget_spools(run)


def _this_worker():
    try:
        from distributed import get_worker
        return get_worker()
    except Exception:  # noqa: BLE001 - not on a worker (a test runs a group in-process)
        return None


def _wanted(worker, key: str) -> bool:
    """Whether the worker still runs task ``key`` for someone (a cancelled one is not)."""
    try:
        ts = worker.state.tasks.get(key)
    except Exception:  # noqa: BLE001 - an older worker: run on
        return True
    return ts is None or ts.state not in ("cancelled", "released", "forgotten")


def _cached_load(xp, runner, step):
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
    reader, task = step.source, step.task
    # tensors of several databases may meet on one worker: the payload's directory names one
    name = f"{os.path.dirname(reader.path)}/{reader.meta.name}"
    cache.keep_version(name, reader.meta.version)
    key = (name.lower(), reader.meta.version, tuple(task.starts), tuple(task.stops))
    value = cache.get(key, 0, held=False)
    if value is None:
        value = runner.run(task, (), step.op, source=reader)
        cache.put(key, 0, value, held=False)
        if cache.bytes > capacity:
            cache.make_room(cache.bytes - capacity)
    return value


def cache_figures() -> dict:
    """This worker's device cache: tiles and bytes kept (empty without one)."""
    return {"tiles": len(_CACHE[0]), "bytes": _CACHE[0].bytes} if _CACHE else {}


def _worker_bytes(worker) -> int:
    try:
        return int(worker.state.nbytes)
    except Exception:  # noqa: BLE001 - not on a worker, or an older WorkerState
        return 0


def to_host(value):
    import cupy
    return cupy.asnumpy(value)


def gpu_count():
    try:
        from .kernels import get_backend
        return int(get_backend("cupy").cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - reported to the client
        return str(exc)
