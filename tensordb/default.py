"""The module's functions on a default in-memory connection, as DuckDB's module has them:
``tensordb.sql("SELECT ...")`` is ``tensordb.default_connection().sql("SELECT ...")``, as
``duckdb.sql`` is ``duckdb.default_connection().sql``.

>>> import tensordb
>>> tensordb.sql("SELECT 42").fetchall()
[(42,)]
"""
from __future__ import annotations

import threading

from .connection import connect

# Connection methods the module offers, each on the default connection (not ``explain``, the
# name of a module of the package).
MODULE_FUNCTIONS = (
    "sql", "query", "execute", "executemany", "register", "unregister", "table", "view",
    "read_parquet", "read_csv", "read_json", "from_df", "from_arrow", "fetchone", "fetchmany",
    "fetchall", "fetchnumpy", "fetchdf", "df", "fetch_arrow_table", "arrow", "pl", "load",
    "to_arrow_table", "tensor", "einsum", "tensors", "describe", "drop")
__all__ = ["default_connection", "MODULE_FUNCTIONS", *MODULE_FUNCTIONS]

_default = None
_default_lock = threading.Lock()


def default_connection():
    """The in-memory connection the module's functions use (``tensordb.sql``, ...), opened at
    the first call; as ``duckdb.default_connection()`` is DuckDB's."""
    global _default
    with _default_lock:
        if _default is None or _default._store is None:
            _default = connect()
        return _default


def _module_function(name: str):
    def call(*args, **kwargs):
        return getattr(default_connection(), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``default_connection().{name}(...)``: the in-memory default connection's."
    return call


for _name in MODULE_FUNCTIONS:
    globals()[_name] = _module_function(_name)
del _name
