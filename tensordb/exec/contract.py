"""The contract between the driver and an executor, written down once.

- ``Capabilities``: what planning needs to know of an executor (its workers, the partials one
  aggregation task combines, the tile bytes one worker may hold, its threads), read without
  building it (``exec.capabilities``) or, for a cluster, from the live one.
- ``Executor``: what every executor offers (the local pool, the GPU pool, Dask alike).
- ``OutputSink``: what every executor hands its stored output tiles to, and nothing else: where
  a tile is written is the sink's decision (physical/sink.py ``CatalogSink``). An executor in
  this process computes tiles in the sink's buffers and calls ``finished``; one whose workers
  see the storage has them write each tile into its ``slot`` and reports ``wrote``.

    result = executor.run(plan, store, sink=sink)   # the driver: Prepared.run(executor, sink)
    sink.commit(result)

``RunResult`` (runtime.py) means the same on every executor, and is measured where the tasks
ran, never derived from the plan: ``bytes_moved`` is the bytes of the tiles tasks read that
another worker made (each read counted; the pool counts them as its workers read them, a Dask
worker as its tasks run, a tile the client scattered excluded), ``peak_bytes`` the tile bytes
alive at once, ``seconds`` the run's wall time, ``ops`` the same per operation. Where workers
read stored tiles from the storage themselves (Dask), a stored tile is read on each worker that
needs it and does not move, so a cluster may move less than the plan's estimate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..shares import Shares

__all__ = ["Capabilities", "Executor", "OutputSink", "CallbackSink", "as_sink",
           "pool_capabilities"]


@dataclass(frozen=True)
class Capabilities:
    """What planning reads of an executor. ``max_fan_in``: the most partials one aggregation
    task combines (None: any number; wider ones become trees, physical/trees.py).
    ``memory_per_worker``: the tile bytes one worker may hold (None: no limit).
    ``workers_write``: its workers write stored output tiles to the storage themselves."""

    workers: int
    max_fan_in: int | None = None
    memory_per_worker: int | None = None
    threads_per_worker: int = 1
    workers_write: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1 or (self.max_fan_in is not None and self.max_fan_in < 2):
            raise ValueError(f"bad executor capabilities {self!r}")


def pool_capabilities(workers: int, memory_limit: int | None,
                      max_fan_in: int | None = None) -> Capabilities:
    """An in-process pool of ``workers`` threads under ``memory_limit`` (bytes, or None): an
    aggregation task combines any number of partials (unless a subclass says ``max_fan_in``),
    each worker has an equal share of the limit."""
    workers = max(1, int(workers))
    return Capabilities(workers, max_fan_in, Shares(memory_limit or None, workers).worker)


@runtime_checkable
class OutputSink(Protocol):
    """Where a run's stored output tiles go (physical/sink.py ``CatalogSink``)."""

    def open(self, workers_write: bool = False) -> dict:
        """Buffers (task key -> array) the executor may compute tiles in; with
        ``workers_write`` none: the workers write into ``slot`` s."""

    def finished(self, key: int, tile, facts: tuple | None = None) -> bool:
        """Tile ``key`` is final; True: written, the executor need not keep it."""

    def slot(self, key: int):
        """Where a worker in another process writes tile ``key`` (a TileSlot), or None."""

    def wrote(self, key: int, facts) -> None:
        """A worker wrote tile ``key`` into its slot; ``facts``: its TileFacts."""


@runtime_checkable
class Executor(Protocol):
    """What the driver calls; every executor has these (tests/exec/test_executor_contract.py)."""

    name: str

    def capabilities(self) -> Capabilities:
        ...

    def run(self, plan, store=None, progress=None, destinations=None, finished=None, *,
            sink: OutputSink | None = None):
        """Run ``plan``; its stored output tiles go to ``sink``. ``destinations`` and
        ``finished`` are the older form of a sink (its buffers and its ``finished``)."""

    def resident(self, plan):
        """What of ``plan``'s stored inputs is already where the run needs it (None: not a
        question for this executor)."""

    @property
    def alive(self) -> bool:
        """False once the executor cannot run anything more (a cluster gone)."""

    def close(self) -> None:
        ...


class CallbackSink:
    """A sink made of the older arguments: ``destinations`` (buffers) and ``finished(key,
    tile)``; it has no slots, so a cluster's tiles come back to it."""

    def __init__(self, destinations=None, finished=None) -> None:
        self.destinations, self.callback = destinations or {}, finished
        owner = getattr(finished, "__self__", None)
        self.versions = getattr(owner, "versions", None)
        if finished is None:  # nothing to call: the executor hands no tile over (as before)
            self.finished = None

    def open(self, workers_write: bool = False) -> dict:
        return self.destinations

    def finished(self, key: int, tile, facts: tuple | None = None) -> bool:
        return bool(self.callback(key, tile)) if self.callback is not None else False

    def slot(self, key: int):
        return None

    def wrote(self, key: int, facts) -> None:  # pragma: no cover - it gives out no slots
        raise AssertionError("a CallbackSink has no slots")


def as_sink(sink, destinations=None, finished=None):
    """The sink an executor calls: ``sink`` itself, else one made of the older arguments
    (None when there are none: the tiles only come back in the RunResult). Older callers pass
    a sink's own ``finished`` (and ``buffers``): that sink is the one called, so its workers
    may write into its slots too."""
    if sink is not None:
        return sink
    if destinations is None and finished is None:
        return None
    owner = getattr(finished, "__self__", None)
    kind = type(owner)
    is_sink = _SINK_TYPES.get(kind)
    if is_sink is None:  # a Protocol's isinstance walks its members: once per type
        is_sink = isinstance(owner, OutputSink) and not isinstance(owner, CallbackSink)
        if len(_SINK_TYPES) < 64:
            _SINK_TYPES[kind] = is_sink
    if is_sink:
        return owner
    return CallbackSink(destinations, finished)


_SINK_TYPES: dict[type, bool] = {}  # type -> whether its instances are OutputSinks (as_sink)
