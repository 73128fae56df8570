"""The GPU executor: the local pool with one worker thread per GPU, tiles resident on the devices.

    con = tensordb.connect(executor="gpu")        # every visible GPU is a worker
    con = tensordb.connect(executor="gpu://0,2")  # GPUs 0 and 2 only

Worker ``w`` runs on device ``devices[w]`` with its own non-blocking CUDA stream; Loads copy
host -> device, kernels are CuPy's (cuBLAS for contractions), and only the stored outputs come
back to host memory. A tile read by a worker on another device is copied onto that device (the
counted transfer). Each task's stream is synchronised before its tile is published, so another
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
(``dask://...?backend=cupy``).

Ran on an NVIDIA H200 with CuPy 14 (2026-11-26): the gpu tests and the random corpora equal
NumPy; several GPUs have not run (see docs/distributed.md).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from ..errors import NotSupportedError
from .kernels import get_backend
from .pool import HostTiles, LocalExecutor

__all__ = ["GpuExecutor", "DeviceTiles", "OnHost", "gpu_devices"]


def gpu_devices(spec: str = "gpu") -> list[int]:
    """The device ids a spec names: 'gpu' (all visible) or 'gpu://0,2'. CuPy must be usable."""
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
        return int(self.array.nbytes)


class DeviceTiles(HostTiles):
    """Tiles resident on GPUs: worker ``w`` runs on ``devices[w]`` with its own non-blocking
    stream; a tile read on another device is copied there; only stored outputs come back to
    host memory, never into the host ``destinations``. No BLAS limits: the host threads only
    launch kernels and copy tiles. ``xp`` is CuPy (a test may pass another array module)."""

    name = "gpu"
    limits_blas = False
    inline = False  # tasks run in a worker's device context, never on the calling thread
    pins_workers = False  # a worker only launches kernels; the driver's threads it starts
                          # would inherit its core
    writes_destinations = False
    spills = True      # the budget moves device tiles to host memory (evict), not to disk
    loads_copy = True  # a Load copies its box host -> device: the budget reserves it

    def __init__(self, devices: list[int], xp=None) -> None:
        super().__init__(xp if xp is not None else get_backend("cupy"))
        self.devices = list(devices)

    def _device(self, w: int) -> int:
        return self.devices[w % len(self.devices)]

    @contextmanager
    def worker(self, w: int):
        """This thread's device and stream, current while the worker runs tasks."""
        cuda = self.xp.cuda
        with cuda.Device(self._device(w)):
            with cuda.Stream(non_blocking=True):  # the current stream is per thread
                yield

    def evict(self, value):
        """The budget's spill on a GPU: the tile copied to host memory (``OnHost``), its bytes
        and the seconds the copy took. A task that reads it copies it back (``fetch``)."""
        t0 = time.perf_counter()
        host = self.xp.asnumpy(value)
        return OnHost(host), int(host.nbytes), time.perf_counter() - t0

    def fetch(self, value, src: int, dst: int):
        if isinstance(value, OnHost):  # evicted by the budget: back onto this worker's device
            return self.xp.asarray(value.array)
        if self._device(src) != self._device(dst):
            value = value.copy()  # cupy copies an array of another device onto the current one
            self.xp.cuda.get_current_stream().synchronize()  # the source may be freed next
        return value

    def publish(self, value) -> None:
        self.xp.cuda.get_current_stream().synchronize()  # readers on other streams see it done

    def to_host(self, value):
        return value.array if isinstance(value, OnHost) else self.xp.asnumpy(value)


def GpuExecutor(spec: str = "gpu", *, memory_limit=None) -> LocalExecutor:  # noqa: N802
    """The local pool with one worker per GPU (``ex.devices``); ``ex.workers`` is their count.
    (A factory with a class's name: the GPU executor is no class of its own.)"""
    devices = gpu_devices(spec)
    return LocalExecutor(len(devices), memory_limit=memory_limit, tiles=DeviceTiles(devices))


def make(spec: str, workers: int = 0, *, memory_limit=None) -> LocalExecutor:
    """The registry's factory for ``gpu`` / ``gpu://ids`` (each GPU is a worker: ``workers`` is
    not used)."""
    return GpuExecutor(spec, memory_limit=memory_limit)
