"""The memory a load or an export may use, from the connection's memory_limit (its ``Shares``,
tensordb/shares.py).

Loads and exports run one tile (or one batch) at a time; what they hold beyond that is DuckDB's
(scanning Parquet and CSV, running a query, sorting a COO table by tile, writing CSV) and the
Arrow batches passed between DuckDB and the loader. With a memory_limit, DuckDB's own memory
limit is half of it (at least DUCK_FLOOR: a sort needs some room; DuckDB spills to the database's
spill directory beyond it) and a batch is at most a sixteenth of it. Without one, DuckDB keeps its
default, except for a COO sort (SORT_MEMORY). A DuckDB memory_limit the user set with SQL is left
alone.
"""
from __future__ import annotations

import contextlib

from ..shares import BATCH_BYTES, BATCH_FLOOR, DUCK_FLOOR, SORT_MEMORY, Shares

__all__ = ["duck_memory", "duck_bytes", "batch_bytes", "SORT_MEMORY", "DUCK_FLOOR", "BATCH_BYTES",
           "BATCH_FLOOR"]


def duck_bytes(limit: int | None, *, sort: bool = False) -> int | None:
    """DuckDB's memory limit for a load or export (None: leave DuckDB's default): the
    ``Shares`` of the limit (tensordb/shares.py)."""
    shares = Shares(limit)
    return shares.sort if sort else shares.duck


def batch_bytes(limit: int | None) -> int:
    return Shares(limit).batch


@contextlib.contextmanager
def duck_memory(store, nbytes: int | None):
    """Cap DuckDB's memory at ``nbytes`` for the block (it spills to disk beyond the cap), unless
    the user set a limit of their own. Blocks nest: an inner one sets its own cap and gives the
    outer one's back. (A limit read back as text is rounded, so we RESET rather than SET.)"""
    duck = store.duck
    outer = getattr(store, "_duck_cap", None)  # the cap an enclosing block of ours set
    if nbytes is None:
        yield
        return
    if outer is None:
        limit = duck.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
        if limit != store._duck_memory_default:
            yield
            return
    duck.execute(f"SET memory_limit = '{int(nbytes)}B'")
    store._duck_cap = int(nbytes)
    try:
        yield
    finally:
        store._duck_cap = outer
        if outer is None:
            duck.execute("RESET memory_limit")
        else:
            duck.execute(f"SET memory_limit = '{outer}B'")
