"""Execution: worker pools that run a TilePlan, and the tile kernels (NumPy; CuPy on GPUs).

Executors are named: ``local`` (in-process threads, the default), ``gpu`` (one worker per GPU,
CuPy kernels) and ``dask://host:port`` (a Dask cluster). An unknown name fails with the list.
All of them run tasks on one runtime (``runtime.py``) and return its ``RunResult``.
"""
from __future__ import annotations

from importlib import import_module  # dask and cupy load only when their executor is chosen

from ..errors import ProgrammingError
from .pool import LocalExecutor
from .runtime import RunResult
from .spawn import check_main_guard

__all__ = ["LocalExecutor", "RunResult", "make_executor", "max_fan_in", "EXECUTORS"]


def _local(spec: str, workers: int, **kw):
    return LocalExecutor(workers, **kw)


def _dask(*a, **kw):
    return import_module(".dask", __package__).make(*a, **kw)


def _gpu(*a, **kw):  # the local pool with CuPy tiles
    return import_module(".gpu", __package__).make(*a, **kw)


EXECUTORS = {"local": _local, "dask": _dask, "gpu": _gpu}


def _scheme(spec: str) -> str:
    return spec.split("://", 1)[0] if "://" in spec else spec


def max_fan_in(spec: str, make):
    """The most partials one aggregation task of the executor named ``spec`` combines (None: any
    number; planning makes trees of wider aggregations, physical/trees.py), read from its class:
    planning makes no executor for it. An executor registered by others is asked itself:
    ``make()`` gives it."""
    factory = EXECUTORS.get(_scheme(spec))
    if factory is _local or factory is _gpu:
        return LocalExecutor.max_fan_in
    if factory is _dask:
        return import_module(".dask", __package__).DaskExecutor.max_fan_in
    return getattr(make(), "max_fan_in", None)


def make_executor(spec: str, workers: int, *, memory_limit=None):
    """Build the executor named by ``spec`` ('local', or a registered scheme such as 'dask://')."""
    scheme = _scheme(spec)
    factory = EXECUTORS.get(scheme)
    if factory is None:
        raise ProgrammingError(f"unknown executor '{spec}'",
                               hint=f"valid executors: {', '.join(sorted(EXECUTORS))}")
    check_main_guard(spec)  # dask://local in a script without the __main__ guard
    return factory(spec, workers, memory_limit=memory_limit)
