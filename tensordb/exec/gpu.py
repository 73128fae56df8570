"""The GPU executor: the local pool with one worker thread per GPU, tiles resident on the devices.

    con = tensordb.connect(executor="gpu")        # every visible GPU is a worker
    con = tensordb.connect(executor="gpu://0,2")  # GPUs 0 and 2 only
    con = tensordb.connect(executor="gpu://?cache=off")  # no tile kept between queries

Worker ``w`` runs on device ``devices[w]`` with its own non-blocking CUDA stream; Loads copy
host -> device, kernels are CuPy's (cuBLAS for contractions), and only the stored outputs come
back to host memory, each tile into its writer's buffer on the worker that finished it
(``copy_out``; the pool takes its statistics and starts its write there). A tile read by a
worker on another device is copied onto that device (the counted transfer). Each task's stream is synchronised before its tile is published, so another
stream or device never reads a tile that is still being written, and no freed block is reused
while a copy from it is in flight. Without CuPy or a GPU, asking for this executor raises
NotSupportedError. The pool and the runtime are the local executor's; this module supplies only
the array module (CuPy) and how tiles move (``DeviceTiles``). A ``memory_limit`` bounds the
tiles on the devices the same way (the pool's admission, ``budget.py``): a Load counts as the
copy it is, and when a task would cross the limit, tiles that no running task reads are moved to
host memory (``evict``; never to disk; a finished output tile too, since it goes to the host
anyway) and copied back onto the device when a task reads them,
else the task waits for room (several GPUs) or runs over the limit, counted in ``over_budget``.
Only the tiles count: CuPy's pool may keep freed blocks, and a task's inputs copied back are
held while it runs. On a cluster, use dask-cuda's workers instead
(``dask://...?backend=cupy``; each keeps a device cache of its own, dask_worker.py).

The executor lives as long as the connection, and keeps stored tiles on the devices between
runs (``devcache.py``): a Load whose box of that tensor version is cached on its device copies
nothing, one cached on another device is copied from there, and a run's stored outputs become
the cached tiles of the versions their commit stores. The tiles of a LET stay as well, and a
later plan computing the same value is cut to Loads of them (``start_run``, devlets.py).
EXPLAIN shows which inputs (and LETs) are resident (``resident``), ``RunResult.copies`` what
a run copied each way, ``RunResult.op_copies`` the same per operation.

Sparse tiles stay CSR on the devices (``xsparse``, gpu_sparse.py): a Load of CSR tiles copies
their three arrays, cupyx's kernels run on them where the plan's sparse method has a cupyx form.

Ran on an NVIDIA H200 with CuPy 14 (2026-11-26, and again 2026-11-27 with the device cache,
the tile-by-tile copies out and the sparse tiles): the gpu tests, the random corpora and the
sparse corpus equal NumPy (docs/benchmarks.md, "Sparse tiles on a GPU"). Several GPUs have not
run (docs/distributed.md).
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from contextlib import contextmanager

import numpy as np

from ..errors import InternalError, NotSupportedError
from ..geometry import tile_box
from ..physical.plan import Load
from ..storage.sparse import is_sparse, tile_nbytes
from .budget import device_upper_bytes
from .devcache import DeviceCache, load_key
from .devlets import cut_held, held_tiles, identities
from .gpu_sparse import dense, download, is_device_sparse, sparse_module, tile_bytes, upload
from .gpu_sparse import load as load_sparse
from .kernels import get_backend
from .pool import HostTiles, LocalExecutor

__all__ = ["GpuExecutor", "DeviceTiles", "OnHost", "gpu_devices"]


def _options(spec: str) -> tuple[str, dict]:
    """``spec`` without its ``?key=value&...`` options, and the options (only ``cache``)."""
    spec, _, query = spec.partition("?")
    opts = dict(kv.split("=", 1) if "=" in kv else (kv, "") for kv in query.split("&") if kv)
    bad = sorted(set(opts) - {"cache"})
    if bad or opts.get("cache", "on").lower() not in ("on", "off"):
        raise NotSupportedError(f"cannot read the GPU executor's options in '?{query}'",
                                hint="the one option is cache=on|off: gpu://0,1?cache=off")
    return spec, opts


def gpu_devices(spec: str = "gpu") -> list[int]:
    """The device ids a spec names: 'gpu' (all visible) or 'gpu://0,2'. CuPy must be usable."""
    spec = _options(spec)[0]
    cupy = get_backend("cupy")  # NotSupportedError without CuPy or a GPU
    count = cupy.cuda.runtime.getDeviceCount()
    rest = spec.split("://", 1)[1] if "://" in spec else ""
    if not rest:
        return list(range(count))
    try:
        ids = [int(x) for x in rest.split(",") if x.strip()]
    except ValueError:
        raise NotSupportedError(f"cannot read GPU ids in '{spec}'", hint="write gpu://0,1") from None
    bad = [i for i in ids if not 0 <= i < count]
    if bad or not ids:
        raise NotSupportedError(f"no GPU {bad or ids} here: {count} GPU(s) are visible",
                                hint="ids count from 0 within CUDA_VISIBLE_DEVICES")
    return ids


class OnHost:
    """A device tile the memory budget moved to host memory (``DeviceTiles.evict``)."""

    __slots__ = ("array",)

    def __init__(self, array) -> None:
        self.array = array

    @property
    def nbytes(self) -> int:
        return tile_nbytes(self.array)  # a CSR tile's three arrays (scipy's, on the host)


class DeviceTiles(HostTiles):
    """Tiles resident on GPUs: worker ``w`` runs on ``devices[w]`` with its own non-blocking
    stream; a tile read on another device is copied there; only stored outputs come back to
    host memory, never into the host ``destinations``. No BLAS limits: the host threads only
    launch kernels and copy tiles. ``xp`` is CuPy (a test may pass another array module),
    ``xsparse`` its sparse module (``cupyx.scipy.sparse``; gpu_sparse.py): a Load of CSR tiles
    copies their arrays and keeps them CSR on the device (None: densified, as before)."""

    name = "gpu"
    limits_blas = False
    inline = False  # tasks run in a worker's device context, never on the calling thread
    pins_workers = False  # a worker only launches kernels; the driver's threads it starts
                          # would inherit its core
    writes_destinations = False
    spills = True      # the budget moves device tiles to host memory (evict), not to disk
    copies_out = True  # a stored output's tile goes to its host buffer as soon as it is final
    loads_copy = True  # a Load copies its box host -> device: the budget reserves it

    def __init__(self, devices: list[int], xp=None, cache: bool = True) -> None:
        super().__init__(xp if xp is not None else get_backend("cupy"))
        self.xsparse = sparse_module(self.xp)
        self.devices = list(devices)
        # stored tiles kept on the devices between runs (devcache.py); None: every Load copies
        self.cache = DeviceCache() if cache else None
        self.copies: Counter = Counter()  # this run's copies (RunResult.copies)
        self.op_copies: dict[str, Counter] = {}  # ...per operation (RunResult.op_copies)
        self._out_ops: dict[int, str] = {}  # this run's stored output tile -> its operation
        self._count_lock = threading.Lock()
        self._listening = None  # (weakref to the store told to report commits, its listener)
        self._capacity: int | None = -1  # the devices' memory the cache may fill (-1: not read)
        # this run's task key -> (cache key, bytes) of a LET tile it keeps (devlets.py)
        self._making: dict[int, tuple] = {}
        self._pinned: dict[int, tuple] = {}  # task key -> (cache key, device) of a held LET tile
        self._pieces: dict[int, list] = {}  # task key -> the pinned tiles its box is cut from
        # this run's stored output tiles copied to the host already: id -> (device tile, host
        # copy); the run holds both until it ends, so an id is never another array's here
        self._landed: dict[int, tuple] = {}
        self._landed_lock = threading.Lock()
        self._running = False

    def _device(self, w: int) -> int:
        return self.devices[w % len(self.devices)]

    @contextmanager
    def worker(self, w: int):
        """This thread's device and stream, current while the worker runs tasks."""
        cuda = self.xp.cuda
        with cuda.Device(self._device(w)):
            with cuda.Stream(non_blocking=True):  # the current stream is per thread
                yield

    def _count(self, op: str | None = None, **counts) -> None:
        """Add ``counts`` to the run's; its bytes copied to operation ``op``'s too (by the
        name of its result)."""
        with self._count_lock:
            self.copies.update(counts)
            if op is not None:
                self.op_copies.setdefault(str(op), Counter()).update(
                    {k: v for k, v in counts.items() if k in _BYTES})

    def evict(self, value):
        """The budget's spill on a GPU: the tile copied to host memory (``OnHost``), its bytes
        and the seconds the copy took. A task that reads it copies it back (``fetch``). A
        cached tile leaves the cache too (else its device memory would stay taken)."""
        t0 = time.perf_counter()
        if self.cache is not None:
            self.cache.discard(value)
        with self._landed_lock:
            landed = self._landed.pop(id(value), None)
        if landed is not None and landed[0] is value:  # its host copy exists: no second copy
            return OnHost(landed[1]), int(landed[1].nbytes), time.perf_counter() - t0
        host = self._host(value)
        self._count(device_to_host=tile_nbytes(host))
        return OnHost(host), tile_nbytes(host), time.perf_counter() - t0

    def _host(self, value):  # a NumPy array, or a scipy CSR array (a device CSR tile's)
        return download(value) if is_device_sparse(value) else self.xp.asnumpy(value)

    def fetch(self, value, src: int, dst: int):
        if isinstance(value, OnHost):  # evicted by the budget: back onto this worker's device
            self._count(host_to_device=value.nbytes)
            if is_sparse(value.array):
                return upload(value.array, self.xp, self.xsparse)
            return self.xp.asarray(value.array)
        if self._device(src) != self._device(dst):
            value = value.copy()  # cupy copies an array of another device onto the current one
            self.xp.cuda.get_current_stream().synchronize()  # the source may be freed next
            self._count(peer=tile_bytes(value))
        return value

    def publish(self, value) -> None:
        self.xp.cuda.get_current_stream().synchronize()  # readers on other streams see it done

    def to_host(self, value, key=None):
        if isinstance(value, OnHost):
            return value.array
        host = self._host(value)  # a sparse output tile: scipy CSR, stored as the CPU's
        self._count(self._out_ops.get(key), device_to_host=tile_nbytes(host))
        return self._land(value, host)

    def _land(self, value, host):
        """``host`` is the copy of device tile ``value``: during a run, ``evict`` copies it no
        more (the run holds ``value`` until it ends, or until ``evict`` lets it go)."""
        with self._landed_lock:
            if self._running:
                self._landed[id(value)] = (value, host)
        return host

    def copy_out(self, value, buffer, key=None) -> None:
        """A finished output tile into its writer's buffer (host memory), on its worker:
        straight into the buffer where CuPy can (``ndarray.get(out=)``), else through a host
        copy."""
        value = dense(value, self.xp)  # (a CSR tile has no dense place: never, in a plan)
        self._count(self._out_ops.get(key), device_to_host=int(value.nbytes))
        get = getattr(value, "get", None)
        if get is not None and buffer.dtype == value.dtype and buffer.shape == value.shape \
                and buffer.flags.c_contiguous and value.flags.c_contiguous:
            get(out=buffer)
        else:
            np.copyto(buffer, self.xp.asnumpy(value), casting="unsafe")
        if buffer.dtype == value.dtype and buffer.shape == value.shape:
            self._land(value, buffer)

    # -- the device cache (devcache.py) --------------------------------------------------------
    def _key(self, task, reader) -> tuple:
        return load_key(task, reader)

    def load(self, w: int, task, reader, runner, op):
        """A Load on worker ``w``: the cached tile on its device (no copy), else a copy of the
        one cached on another device (peer), else the box copied host -> device; kept. A held
        LET tile (devlets.py) is only ever found: ``start_run`` pinned it."""
        cache = self.cache
        if cache is None:
            return self._read(task, reader, runner, op)
        key, dev = self._key(task, reader), self._device(w)
        held = getattr(reader, "held", False)
        try:
            value = cache.get(key, dev)
            if value is not None:
                self._count(**({"let_hits": 1} if held else {"hits": 1}))
                return value
            src = cache.peer(key, dev, self.devices)
            if src is not None:
                value = src[1].copy()  # onto this worker's device, from the one that holds it
                self.xp.cuda.get_current_stream().synchronize()
                self._count(op.output, peer=tile_bytes(value), peer_hits=1,
                            **({"let_hits": 1} if held else {}))
            elif held and task.key in self._pieces:
                value = self._assemble(task, reader.meta.dtype, self._pieces[task.key], dev, op)
            elif held:
                raise InternalError(f"the LET tile {key} left the device cache during the run")
            else:
                value = self._read(task, reader, runner, op)
            return cache.put(key, dev, value)
        finally:
            if held:  # read: held as this Load's tile now, as any cached tile
                for pinned in [self._pinned[task.key]] if task.key in self._pinned else \
                        self._pieces.get(task.key, ()):
                    cache.unpin(*pinned)

    def _read(self, task, reader, runner, op):
        """A Load's box copied host -> device: kept CSR where its stored tiles are
        (gpu_sparse.load: their three arrays copied, counted ``csr_loads``), else dense."""
        value = load_sparse(task, reader, self.xp, self.xsparse)
        if value is None:
            value = runner.run(task, (), op, source=reader)
            self._count(op.output, host_to_device=int(value.nbytes), misses=1)
        else:
            self._count(op.output, host_to_device=tile_bytes(value), misses=1, csr_loads=1)
        return value

    def _assemble(self, task, dtype, pieces, dev, op):
        """The box of Load ``task`` built on device ``dev`` from the cached tiles ``pieces``
        (``[(cache key, device)]``, pinned) of the same LET value cut another way."""
        xp = self.xp
        out = xp.empty([b - a for a, b in zip(task.starts, task.stops)], dtype=dtype)
        for key, d in pieces:
            part = self.cache.get(key, d, held=False)
            if part is None:
                raise InternalError(f"the LET tile {key} left the device cache during the run")
            src = tuple(slice(max(a, p) - p, min(b, q) - p)
                        for a, b, p, q in zip(task.starts, task.stops, key[2], key[3]))
            dst = tuple(slice(max(a, p) - a, min(b, q) - a)
                        for a, b, p, q in zip(task.starts, task.stops, key[2], key[3]))
            part = dense(part, xp)[src]
            if d != dev:  # onto this worker's device (as a peer copy)
                part = part.copy()
                self.xp.cuda.get_current_stream().synchronize()
                self._count(op.output, peer=int(part.nbytes))
            out[dst] = part
        self._count(let_hits=1, let_assembled=1)
        return out

    def released(self, value) -> None:
        if self.cache is not None:
            self.cache.release(value)

    def start_run(self, plan, store):
        """Before a run: the cache forgets the versions the plan does not read, and the plan's
        LET values already held on the devices are cut out of it (devlets.py): the plan to run."""
        with self._count_lock:
            self.copies, self.op_copies = Counter(), {}
        self._out_ops = {k: str(out.name) for out in plan.outputs.values() if out.stored
                         for k in out.tiles.values()}
        self._making, self._pinned, self._pieces = {}, {}, {}
        with self._landed_lock:
            self._landed.clear()
            self._running = True
        cache = self.cache
        if cache is None:
            return plan
        if store is not None and getattr(store, "commit_listeners", None) is not None:
            self._listen(store)
        for reader in plan.readers.values():  # a version read now: the others are stale
            cache.keep_version(reader.meta.name, reader.meta.version)
        idents = identities(plan)
        if not idents:
            return plan
        for ident, deps in idents.values():
            cache.let_reads("=" + ident, deps)
        made = held_tiles(plan, idents)
        self._pinned = {k: (m[0], d) for k, m in made.items()
                        if (d := cache.pin(m[0], self.devices)) is not None}
        # a tile of another box: assembled on the device from the cached tiles covering it
        self._pieces = {k: got for k, m in made.items() if k not in self._pinned
                        and (got := cache.cover(m[0], self.devices))}
        found = {k: m for k, m in made.items() if k in self._pinned or k in self._pieces}
        self._making = {k: (m[0], np.dtype(m[1]).itemsize * _volume(m[0][2], m[0][3]))
                        for k, m in made.items() if k not in found}
        return cut_held(plan, found) if found else plan

    def produced(self, w: int, key: int, value) -> None:
        """A task's tile is final: a LET's tile stays in the cache (held by the run until its
        last reader ran)."""
        making = self._making.get(key)
        if making is not None and not isinstance(value, OnHost):
            self.cache.put(making[0], self._device(w), value)
            self._count(let_tiles_kept=1)

    def _listen(self, store) -> None:
        """Have ``store`` report its commits to the cache: tiles of replaced and dropped
        versions leave, a run's stored outputs become the new versions' tiles."""
        if self._listening is not None and self._listening[0]() is store:
            return
        self._unlisten()
        ref = weakref.ref(self.cache)

        def committed(stored, retired, ref=ref):
            cache = ref()
            if cache is not None:
                cache.committed(stored, retired)

        store.commit_listeners.append(committed)
        self._listening = (weakref.ref(store), committed)

    def _unlisten(self) -> None:
        if self._listening is None:
            return
        store, fn = self._listening[0](), self._listening[1]
        self._listening = None
        if store is not None and fn in getattr(store, "commit_listeners", ()):
            store.commit_listeners.remove(fn)

    def capacity(self) -> int | None:
        """Three quarters of the devices' memory (None where the array module does not say):
        the cache and a run's tiles together stay within it, and within memory_limit."""
        if self._capacity == -1:
            try:
                total = 0
                for d in self.devices:
                    with self.xp.cuda.Device(d):
                        total += int(self.xp.cuda.runtime.memGetInfo()[1])
                self._capacity = total * 3 // 4
            except Exception:  # noqa: BLE001 - a stand-in for CuPy, or a device that won't say
                self._capacity = None
        return self._capacity

    def room(self, plan, limit):
        """Make room for ``plan``: idle cached tiles leave (those it does not read first) until
        the cache, the plan's tiles and the LET tiles it will keep fit the limit (or the
        devices); LET tiles are kept where they fit so, or where the run's admission will drop
        them when it needs room. What is left of ``limit`` for the run's tiles."""
        cache = self.cache
        if cache is None:
            return limit
        lets = sum(n for _, n in self._making.values())
        if not cache.bytes and not lets:
            return limit
        caps = [c for c in (limit, self.capacity()) if c]
        if caps:
            # the plan's Loads as the devices hold them (a CSR box at its arrays' bytes), less
            # the boxes already cached on the device that loads them: a Load that finds its box
            # there copies nothing; one cached on another device only is copied (``peer``).
            # (A GPU pool has a worker per device: a task's worker names its device.)
            where = {(self._key(t, plan.readers[t.tensor]), self._device(t.worker))
                     for t in plan.tasks if isinstance(t, Load)}
            upper = device_upper_bytes(plan)

            def over_now() -> int:
                return cache.bytes + upper - cache.resident_bytes(where) + lets - min(caps)

            over = over_now()
            if over > 0:
                cache.make_room(over, keep={key for key, _ in where})
                # worked out again, not less the bytes freed: a box of the plan dropped (the
                # last resort) is copied again, and so is no room
                over = over_now()
            # Past the limit the pool's admission runs, and drops idle cached tiles (a LET's
            # among them, once its readers ran) before anything else; past the devices' own
            # memory, or with no limit, nothing would: no LET tile is kept then.
            if over > 0 and lets and (limit is None or min(caps) < limit):
                self._making, lets = {}, 0
        return None if limit is None else limit - cache.bytes - lets

    def end_run(self, plan, run, result, sink=None) -> None:
        cache = self.cache
        self._making, self._pinned, self._pieces = {}, {}, {}
        with self._landed_lock:
            self._landed.clear()
            self._running = False
        if cache is not None:
            cache.run_ended()
            # the versions the outputs will have (the sink's): without them, nothing is
            # held (a tile must never be taken for another version's)
            versions = getattr(sink, "versions", None)
            if result is not None and isinstance(versions, dict):
                self._hold_outputs(plan, run, result, versions)
        if result is not None:
            # this run's counter (the next run starts a new one): the outputs' copies back to
            # the host, made after this, are counted in it too
            with self._count_lock:
                result.copies = self.copies
                result.op_copies = self.op_copies
                if cache is not None:
                    self.copies.update(cached_bytes=cache.bytes, cached_tiles=len(cache))

    def _hold_outputs(self, plan, run, result, versions: dict) -> None:
        """Keep the device arrays of the stored outputs until their commit (then they are the
        new versions' cached tiles: the next query reads them without a copy)."""
        for out in plan.outputs.values():
            name = out.store_name or out.name
            version = versions.get(name.lower())
            if not out.stored or out.grid is None or version is None:
                continue
            tiles = []
            for coords, key in out.tiles.items():
                value = result.tiles.get(key)
                if value is None or isinstance(value, OnHost):
                    continue
                starts, stops = tile_box(out.grid, coords)
                tiles.append((starts, stops, self._device(run.made_on.get(key, 0)), value))
            self.cache.hold_outputs(name, version, tiles)

    def resident(self, plan):
        """Per stored input (and LET): its Loads, how many find their tile cached on their
        device, how many on another device only, the bytes in place (``DeviceCache.resident``)."""
        return None if self.cache is None else \
            self.cache.resident(plan, self.devices, self._device)

    def close(self) -> None:
        self._unlisten()
        if self.cache is not None:
            self.cache.clear()


_BYTES = ("host_to_device", "device_to_host", "peer")  # the counts of bytes copied


def _volume(starts, stops) -> int:
    n = 1
    for a, b in zip(starts, stops):
        n *= b - a
    return n


def GpuExecutor(spec: str = "gpu", *, memory_limit=None, cache: bool = True
                ) -> LocalExecutor:  # noqa: N802
    """The local pool with one worker per GPU (``ex.devices``); ``ex.workers`` is their count.
    ``cache=False``: no tile stays on a device after a run. (A factory with a class's name:
    the GPU executor is no class of its own.)"""
    devices = gpu_devices(spec)
    return LocalExecutor(len(devices), memory_limit=memory_limit,
                         tiles=DeviceTiles(devices, cache=cache))


def make(spec: str, workers: int = 0, *, memory_limit=None) -> LocalExecutor:
    """The registry's factory for ``gpu`` / ``gpu://ids`` (each GPU is a worker: ``workers`` is
    not used), with ``?cache=off`` for no device cache."""
    cache = _options(spec)[1].get("cache", "on").lower() == "on"
    return GpuExecutor(spec, memory_limit=memory_limit, cache=cache)
