"""tensordb: a tensor-relational database engine.

Tensors are stored as tables of tiles; einsum queries become joins and aggregations over those
tiles, planned by a cost-based optimizer and run on a pool of workers.
"""
from .connection import Connection, connect
from .cursor import BINARY, DATETIME, NUMBER, ROWID, STRING, Cursor
# DuckDB's module functions, on a default in-memory connection (tensordb.sql("SELECT 1"))
from .default import (arrow, default_connection, describe, df, drop, einsum, execute,
                      executemany, fetch_arrow_table, fetchall, fetchdf, fetchmany, fetchnumpy,
                      fetchone, from_arrow, from_df, load, pl, query, read_csv, read_json,
                      read_parquet, register, sql, table, tensor, tensors, to_arrow_table,
                      unregister, view)
from .errors import (BinderError, CatalogError, DatabaseError, DataError, Error, GradientWarning,
                     IntegrityError, InterfaceError, NonFiniteWarning, InternalError, NotSupportedError, OperationalError,
                     OutOfMemoryError, ParserError, ProgrammingError, Warning)
from .plan.builder import Graph

__version__ = "0.1.0"
# DB-API 2.0 (PEP 249): threads may share the module, not connections; ``?`` placeholders.
apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"

__all__ = [
    "connect", "Connection", "Cursor", "Graph", "__version__",
    "Error", "Warning", "GradientWarning", "NonFiniteWarning", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "ParserError", "BinderError", "CatalogError", "OutOfMemoryError",
    "STRING", "NUMBER", "DATETIME", "BINARY", "ROWID", "default_connection",
    "sql", "query", "execute", "executemany", "register", "unregister", "table", "view",
    "read_parquet", "read_csv", "read_json", "from_df", "from_arrow", "fetchone", "fetchmany",
    "fetchall", "fetchnumpy", "fetchdf", "df", "fetch_arrow_table", "arrow", "pl", "load",
    "to_arrow_table", "tensor", "einsum", "tensors", "describe", "drop",
]
