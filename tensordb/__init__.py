"""tensordb: a tensor-relational database engine.

Tensors are stored as tables of tiles; einsum queries become joins and aggregations over those
tiles, planned by a cost-based optimizer and run on a pool of workers.
"""
from .connection import Connection, connect
from .errors import (BinderError, CatalogError, DatabaseError, DataError, Error, IntegrityError,
                     InterfaceError, InternalError, NotSupportedError, OperationalError,
                     OutOfMemoryError, ParserError, ProgrammingError, Warning)
from .plan.builder import Graph

__version__ = "0.1.0"
apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"

__all__ = [
    "connect", "Connection", "Graph", "__version__",
    "Error", "Warning", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "ParserError", "BinderError", "CatalogError", "OutOfMemoryError",
]
