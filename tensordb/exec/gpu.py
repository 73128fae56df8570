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
tiles on the devices the same way (the pool's admission, ``budget.py``): a task waits for room,
and device tiles are never spilled to disk. On a cluster, use dask-cuda's workers instead
(``dask://...?backend=cupy``).

Not yet run on GPU hardware: the code follows CuPy's documented API (see docs/distributed.md).
"""
from __future__ import annotations

from contextlib import contextmanager

from ..errors import NotSupportedError
from .kernels import get_backend
from .pool import HostTiles, LocalExecutor

__all__ = ["GpuExecutor", "DeviceTiles", "gpu_devices"]


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


class DeviceTiles(HostTiles):
    """Tiles resident on GPUs: worker ``w`` runs on ``devices[w]`` with its own non-blocking
    stream; a tile read on another device is copied there; only stored outputs come back to
    host memory, never into the host ``destinations``. No BLAS limits: the host threads only
    launch kernels and copy tiles. ``xp`` is CuPy (a test may pass another array module)."""

    name = "gpu"
    limits_blas = False
    inline = False  # tasks run in a worker's device context, never on the calling thread
    writes_destinations = False
    spills = False  # device tiles: the budget (device memory) waits, it does not spill

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

    def fetch(self, value, src: int, dst: int):
        if self._device(src) != self._device(dst):
            value = value.copy()  # cupy copies an array of another device onto the current one
            self.xp.cuda.get_current_stream().synchronize()  # the source may be freed next
        return value

    def publish(self, value) -> None:
        self.xp.cuda.get_current_stream().synchronize()  # readers on other streams see it done

    def to_host(self, value):
        return self.xp.asnumpy(value)


def GpuExecutor(spec: str = "gpu", *, memory_limit=None) -> LocalExecutor:  # noqa: N802
    """The local pool with one worker per GPU (``ex.devices``); ``ex.workers`` is their count.
    (A factory with a class's name: the GPU executor is no class of its own.)"""
    devices = gpu_devices(spec)
    return LocalExecutor(len(devices), memory_limit=memory_limit, tiles=DeviceTiles(devices))


def make(spec: str, workers: int = 0, *, memory_limit=None) -> LocalExecutor:
    """The registry's factory for ``gpu`` / ``gpu://ids`` (each GPU is a worker: ``workers`` is
    not used)."""
    return GpuExecutor(spec, memory_limit=memory_limit)
