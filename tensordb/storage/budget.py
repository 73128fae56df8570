"""The memory a load or an export may use, from the connection's memory_limit.

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

__all__ = ["duck_memory", "duck_bytes", "batch_bytes", "SORT_MEMORY", "DUCK_FLOOR"]

SORT_MEMORY = 1 << 30   # DuckDB memory for sorting a COO table by tile without a memory_limit
DUCK_FLOOR = 64 << 20   # the least DuckDB gets: its CSV reader and a sort fail below about 50 MB
BATCH_BYTES = 16 << 20  # per Arrow batch without a memory_limit: about one tile
BATCH_FLOOR = 1 << 20


def duck_bytes(limit: int | None, *, sort: bool = False) -> int | None:
    """DuckDB's memory limit for a load or export (None: leave DuckDB's default)."""
    if limit is None:
        return SORT_MEMORY if sort else None
    return max(int(limit) // 2, DUCK_FLOOR)


def batch_bytes(limit: int | None) -> int:
    return BATCH_BYTES if limit is None else min(BATCH_BYTES, max(int(limit) // 16, BATCH_FLOOR))


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
