"""Where the pool's tiles live and how they move between its workers: ``HostTiles`` (host
memory, shared by the worker threads), and the hooks a device's tiles (``gpu.DeviceTiles``)
fill in: a device cache that keeps stored tiles between runs, copies of finished outputs to the
host. The pool (``pool.py``) calls them; a hook that host tiles do not need does nothing."""
from __future__ import annotations

from contextlib import nullcontext

from .graphcache import GRAPHS
from .kernels import get_backend

__all__ = ["HostTiles"]


class HostTiles:
    """Where the pool's tiles live and how they move: host memory, shared by every worker thread
    (a transfer is only counted), NumPy kernels, outputs computed into their destination buffers.
    ``gpu.py`` supplies the same interface for tiles resident on GPUs."""

    name = "local"
    devices: tuple = ()
    limits_blas = True           # the workers' kernels are host BLAS: cap its threads per run
    inline = True                # a tiny plan may run on the calling thread (no worker context)
    writes_destinations = True   # output tiles may land straight in the caller's buffers
    spills = True                # tiles are NumPy arrays: the budget may spill them to disk
    pins_workers = True          # each worker thread keeps to a core of its own (see _pin)
    copies_out = False           # stored output tiles copied into their buffers as finished

    def __init__(self, xp=None) -> None:
        self.xp = xp if xp is not None else get_backend("numpy")
        # GraphBLAS matrices of stored graphs kept between runs (graphcache.py): the budget
        # counts them and drops them first when a run needs room (budget.py)
        self.cache = GRAPHS

    def worker(self, w: int):
        """The context a worker thread runs its tasks in (a device and stream on a GPU)."""
        return nullcontext()

    def fetch(self, value, src: int, dst: int):
        """Tile ``value`` made on worker ``src``, for a task on worker ``dst`` (called for every
        input, ``src == dst`` too)."""
        return value

    def publish(self, value) -> None:
        """Called before a tile is visible to other workers (a GPU waits for its stream)."""

    def to_host(self, value, key=None):
        """Tile ``value`` in host memory (``key``: the task that made it, when known)."""
        return value

    def copy_out(self, value, buffer, key=None) -> None:
        """Copy finished output tile ``value`` into ``buffer`` (host memory), on its worker."""
        self.xp.copyto(buffer, value, casting="unsafe")

    # Hooks of a device cache (gpu.py keeps stored tiles on the GPUs between runs); host
    # tiles keep nothing between runs.
    def start_run(self, plan, store):
        """A run of ``plan`` begins (``store``: the database it reads, or None): the plan to
        run (a GPU's cuts out what its cache holds already)."""
        return plan

    def produced(self, w: int, key: int, value) -> None:
        """Task ``key``'s tile ``value`` is final, on worker ``w``."""

    def room(self, plan, limit):
        """The part of ``limit`` (bytes, or None) a run of ``plan`` may fill with its tiles:
        what the graph cache holds is not (a run that could cross the rest is admitted task
        by task, and its admission drops the cache's entries first: budget.py)."""
        if not limit or self.cache is None:
            return limit
        return limit - self.cache.bytes

    def load(self, w: int, task, reader, runner, op):
        """The tile of Load ``task`` on worker ``w``."""
        return runner.run(task, (), op, source=reader)

    def released(self, value) -> None:
        """The run let tile ``value`` go (its last consumer ran)."""

    def end_run(self, plan, run, result, sink=None) -> None:
        """The run of ``plan`` is over (``result``: its RunResult, None when it failed); called
        before its tiles come back to host memory. ``sink``: where the run's stored output
        tiles go (exec/contract.py; its ``versions`` are those they will be stored as)."""

    def resident(self, plan):
        """What of ``plan``'s stored inputs is already where the run needs it (None: not a
        question for host tiles)."""
        return None

    def close(self) -> None:
        """The executor closes."""
