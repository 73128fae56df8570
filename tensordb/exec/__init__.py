"""Execution: worker pools that run a TilePlan, and the tile kernels (NumPy; CuPy on GPUs).

Executors are named: ``local`` (in-process threads, the default), ``gpu`` (one worker per GPU,
CuPy kernels) and ``dask://host:port`` (a Dask cluster). An unknown name fails with the list.
All of them keep one contract (``contract.py``: the ``Executor`` protocol, the ``OutputSink``
every one of them hands its stored output tiles to, the ``Capabilities`` planning reads), run
tasks on one runtime (``runtime.py``) and return its ``RunResult``.
"""
from __future__ import annotations

from importlib import import_module  # dask and cupy load only when their executor is chosen

from ..errors import ProgrammingError
from .contract import Capabilities, Executor, OutputSink
from .pool import LocalExecutor, pool_capabilities
from .runtime import RunResult
from .spawn import check_main_guard

__all__ = ["LocalExecutor", "RunResult", "make_executor", "max_fan_in", "capabilities",
           "EXECUTORS", "Executor", "OutputSink", "Capabilities"]


def _local(spec: str, workers: int, **kw):
    return LocalExecutor(workers, **kw)


def _dask(*a, **kw):
    return import_module(".dask", __package__).make(*a, **kw)


def _gpu(*a, **kw):  # the local pool with CuPy tiles
    return import_module(".gpu", __package__).make(*a, **kw)


EXECUTORS = {"local": _local, "dask": _dask, "gpu": _gpu}


def _scheme(spec: str) -> str:
    return spec.split("://", 1)[0] if "://" in spec else spec


def capabilities(spec: str, workers: int, memory_limit: int | None = None, *,
                 executor: Executor | None = None) -> Capabilities:
    """What planning needs of the executor named ``spec`` (contract.Capabilities), without
    making one: the local pool's and a ``dask://local`` cluster's follow from the settings. A
    cluster that exists apart from us (``dask://host:port``) is known only by asking it: the
    live ``executor`` is asked (its workers' own count, memory limits and threads), and an
    executor registered by others always is."""
    scheme = _scheme(spec)
    factory = EXECUTORS.get(scheme)
    if executor is not None and factory not in (_local, _gpu):
        return executor.capabilities()
    if factory is _local or factory is _gpu:
        return pool_capabilities(workers, memory_limit)
    if factory is _dask:
        return import_module(".dask", __package__).static_capabilities(spec, workers,
                                                                     memory_limit)
    raise ProgrammingError(f"unknown executor '{spec}'",
                           hint=f"valid executors: {', '.join(sorted(EXECUTORS))}")


def max_fan_in(spec: str, make):
    """The most partials one aggregation task of the executor named ``spec`` combines (None: any
    number; planning makes trees of wider aggregations, physical/trees.py), read from its
    capabilities: planning makes no executor for it. An executor registered by others is asked
    itself: ``make()`` gives it."""
    if _scheme(spec) in ("local", "gpu", "dask"):
        return capabilities(spec, 1).max_fan_in
    return make().capabilities().max_fan_in


def make_executor(spec: str, workers: int, *, memory_limit=None):
    """Build the executor named by ``spec`` ('local', or a registered scheme such as 'dask://')."""
    scheme = _scheme(spec)
    factory = EXECUTORS.get(scheme)
    if factory is None:
        raise ProgrammingError(f"unknown executor '{spec}'",
                               hint=f"valid executors: {', '.join(sorted(EXECUTORS))}")
    check_main_guard(spec)  # dask://local in a script without the __main__ guard
    return factory(spec, workers, memory_limit=memory_limit)
