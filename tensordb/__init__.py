"""tensordb: a tensor-relational database engine.

Tensors are stored as tables of tiles; einsum queries become joins and aggregations over those
tiles, planned by a cost-based optimizer and run on a pool of workers.
"""
from .connection import Connection, connect
from .cursor import BINARY, DATETIME, NUMBER, ROWID, STRING, Cursor
from .errors import (BinderError, CatalogError, DatabaseError, DataError, Error, IntegrityError,
                     InterfaceError, InternalError, NotSupportedError, OperationalError,
                     OutOfMemoryError, ParserError, ProgrammingError, Warning)
from .plan.builder import Graph

__version__ = "0.1.0"
# DB-API 2.0 (PEP 249): threads may share the module, not connections; ``?`` placeholders.
apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"

__all__ = [
    "connect", "Connection", "Cursor", "Graph", "__version__",
    "Error", "Warning", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "ParserError", "BinderError", "CatalogError", "OutOfMemoryError",
    "STRING", "NUMBER", "DATETIME", "BINARY", "ROWID",
]
