"""The GPU executor: the local pool with one worker thread per GPU, tiles resident on the devices.

    con = tensordb.connect(executor="gpu")        # every visible GPU is a worker
    con = tensordb.connect(executor="gpu://0,2")  # GPUs 0 and 2 only

Worker ``w`` runs on device ``devices[w]`` with its own non-blocking CUDA stream; Loads copy
host -> device, kernels are CuPy's (cuBLAS for contractions), and only the stored outputs come
back to host memory. A tile read by a worker on another device is copied onto that device (the
counted transfer). Each task's stream is synchronised before its tile is published, so another
stream or device never reads a tile that is still being written, and no freed block is reused
while a copy from it is in flight. Without CuPy or a GPU, asking for this executor raises
NotSupportedError. On a cluster, use dask-cuda's workers instead (``dask://...?backend=cupy``).

Not yet run on GPU hardware: the code follows CuPy's documented API (see docs/distributed.md).
"""
from __future__ import annotations

import threading

from ..errors import NotSupportedError
from ..physical.plan import TilePlan
from .kernels import get_backend
from .pool import LocalExecutor, RunResult, _Run, _worker_loop

__all__ = ["GpuExecutor", "gpu_devices"]


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


class GpuExecutor(LocalExecutor):
    """One worker per GPU; ``workers`` is the number of devices."""

    name = "gpu"

    def __init__(self, spec: str = "gpu", *, memory_limit: int | None = None) -> None:
        self.devices = gpu_devices(spec)
        super().__init__(len(self.devices), memory_limit=memory_limit, backend="cupy")

    def _start(self) -> None:
        if not self.threads:
            self.threads = [threading.Thread(target=self._device_loop, args=(w,), daemon=True,
                                             name=f"tensordb-gpu-{w}") for w in range(self.workers)]
            for th in self.threads:
                th.start()

    def _device_loop(self, w: int) -> None:
        """The pool's worker loop, with this thread's device and stream current throughout."""
        cupy = self.xp
        with cupy.cuda.Device(self.devices[w]):
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:  # the current stream is per thread: kernels of w queue here
                _worker_loop(w, self.queues[w])

    def run(self, plan: TilePlan, store=None, progress=None, destinations=None) -> RunResult:
        # Tiles live on the devices: they come back in RunResult.tiles, never in the host
        # ``destinations``; no BLAS limits, the host threads only launch kernels and copy tiles.
        if not plan.tasks:
            return RunResult({})
        with self._lock:
            self._start()
            result = _GpuRun(self, plan, progress, {}).go()
        result.tiles = {k: self.xp.asnumpy(v) for k, v in result.tiles.items()}
        return result


class _GpuRun(_Run):
    """The pool's dataflow run; tiles cross devices by copy, and are complete when published."""

    def _device(self, w: int) -> int:
        return self.ex.devices[w % len(self.ex.devices)]

    def _fetch(self, w: int, task, key: int):
        value = super()._fetch(w, task, key)
        src = self.made_on.get(key, w)
        if self._device(src) != self._device(w):
            value = value.copy()  # cupy copies an array of another device onto the current one
            self.xp.cuda.get_current_stream().synchronize()  # the source may be freed next
        return value

    def _publish(self, w: int, task, value) -> None:
        self.xp.cuda.get_current_stream().synchronize()  # readers on other streams see it done
        super()._publish(w, task, value)


def make(spec: str, workers: int = 0, *, memory_limit=None) -> GpuExecutor:
    """The registry's factory for ``gpu`` / ``gpu://ids`` (each GPU is a worker: ``workers`` is
    not used)."""
    return GpuExecutor(spec, memory_limit=memory_limit)
