"""The Connection's methods that move tensors in and out of the database: ``load``, ``tensor``,
``sparse``, ``tensors``, ``describe``, ``export``, ``drop``, ``check``. Each checks its arguments and calls
storage; none runs the pipeline (connection.py drives that). ``Connection`` inherits them.

>>> import numpy as np, tensordb
>>> with tensordb.connect() as con:
...     con.load("A", np.eye(3), tile=(2, 2))
...     con.describe("A")["tile_shape"], float(con.tensor("A").trace())
((2, 2), 3.0)
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ._optional import require
from .calls import one_at_a_time
from .config import available_memory, format_bytes
from .errors import OutOfMemoryError, ProgrammingError

if TYPE_CHECKING:
    from .config import Settings
    from .driver import Engine
    from .storage import Store

__all__ = ["TensorIO"]


class TensorIO:
    """Mixed into ``Connection``, whose ``store`` and ``settings`` these methods use."""

    store: "Store"
    engine: "Engine"
    settings: "Settings"

    @one_at_a_time
    def load(self, name: str, source, *, tile: Sequence[int] | None = None, replace: bool = False,
             **options) -> None:
        """Store a tensor from a numpy array (or anything ``numpy.asarray`` takes), an object
        with ``__dlpack__`` (a torch or JAX array on the CPU), an xarray DataArray (its dims
        name the dimensions), a pandas or polars DataFrame or an Arrow table (every column
        numeric: a rows x columns matrix, columns in their order; DuckDB reads it as it reads
        a query over it), a .npy/.npz/.parquet/.csv path, or a SQL query.

        ``source`` may also be a scipy.sparse matrix or array or a pydata ``sparse`` array: it is
        stored from its entries, never densified. Options: ``array`` (npz member),
        ``index``/``value``/``shape`` (coordinate tables), ``duplicates`` ('sum', the default, or
        'error': coordinates given twice in a table or sparse array), ``fill_value`` (the value
        of the entries a coordinate table or sparse array leaves out, recorded in the catalog:
        ``float("inf")`` for a graph's distances; docs/sql.md, "Fill values"), ``dims`` (dimension
        names), ``format`` (when the suffix does not say), ``query`` (SQL).

        A matrix larger than memory: ``source`` an iterator (a generator) of scipy.sparse row
        slabs, top to bottom, with ``shape=(rows, cols)``; stored one band of tile rows at a
        time, committed once (docs/storage.md, "Streamed loads").
        """
        self._load(name, source, tile=tile, replace=replace, **options)

    def _load(self, name: str, source, **options) -> list:
        """``load``, returning the catalog entries of what it stored: one tensor, or one per
        array of a .npz file loaded whole (``<name>_<array>``)."""
        _ = self.store  # a closed connection: InterfaceError
        return self.engine.load(name, source, **options)

    @contextlib.contextmanager
    def _operands(self, operands):
        """An einsum's operands as tensor names: each one that is not a name (a numpy array, or
        anything ``numpy.asarray`` takes, as numpy's einsum takes it) is stored as a temporary
        tensor ``_einsum_operand<k>`` for the block, and dropped after it, whatever happens."""
        names, made = [], []
        given = {op.lower() for op in operands if isinstance(op, str)}
        try:
            for k, op in enumerate(operands):
                if isinstance(op, str):
                    names.append(op)
                    continue
                name = next(n for n in (f"_einsum_operand{k}_{j}" if j else f"_einsum_operand{k}"
                                        for j in itertools.count())
                            if n.lower() not in given and not self.store.has(n))
                self._load(name, op)
                made.append(name)
                names.append(name)
            yield tuple(names)
        finally:
            for name in made:
                self.store.drop(name, if_exists=True)

    @one_at_a_time
    def tensor(self, name: str) -> np.ndarray:
        """The tensor as a dense numpy array (OutOfMemoryError, before allocating, when it would
        not fit the memory_limit or the memory available)."""
        reader = self.store.open(name)
        meta = reader.meta
        self._check_dense(f"tensor '{meta.name}'", meta.shape, meta.dtype)
        try:
            return reader.to_numpy()
        except MemoryError:  # the estimate above was too hopeful
            raise OutOfMemoryError(f"out of memory reading tensor '{meta.name}' "
                                   f"({format_bytes(math.prod(meta.shape) * meta.dtype.itemsize)})"
                                   " as a dense array") from None

    @one_at_a_time
    def to_xarray(self, name: str):
        """The tensor as an xarray DataArray named ``name``, its dimension names as its dims
        (``pip install tensordb[xarray]``); ``con.load(name, data_array)`` is the way back."""
        xarray = require("xarray", "to_xarray()")
        meta = self.store.meta(name)
        return xarray.DataArray(self.tensor(meta.name), dims=list(meta.dims), name=meta.name)

    def to_torch(self, name: str):
        """The tensor as a torch.Tensor on the CPU, handed over through DLPack without a copy
        (torch is not a dependency of tensordb: install it yourself)."""
        torch = require("torch", "to_torch()")
        return torch.from_dlpack(self.tensor(name))

    def _check_dense(self, what: str, shape, dtype) -> None:
        dtype = np.dtype(dtype)
        need = math.prod(shape) * dtype.itemsize
        limit, free = self.settings.memory_limit, available_memory()
        for budget, where in ((limit, "the memory_limit"), (free, "the memory available")):
            if budget is not None and need > budget:
                raise OutOfMemoryError(
                    f"{what} {dtype.name} {tuple(shape)} needs {format_bytes(need)} as a dense "
                    f"array, more than {where} ({format_bytes(budget)})",
                    hint="read it in parts with SQL (con.sql), or COPY it to a file")

    @one_at_a_time
    def sparse(self, name: str):
        """The tensor as a sparse array built from its nonzeros, never dense: a
        ``scipy.sparse.csr_array`` for a matrix, a pydata ``sparse.COO`` for any other rank, and
        for a tensor whose fill value is not 0 (with that ``fill_value``)."""
        from .formats.coo import to_sparse
        return to_sparse(self.store.open(name))

    @one_at_a_time
    def tensors(self) -> list[dict]:
        """One dict per stored tensor: name, shape, dtype, tiling, bytes, stored tiles, density."""
        from .storage.info import list_tensors
        return list_tensors(self.store)

    @one_at_a_time
    def describe(self, name: str) -> dict:
        from .storage.info import describe_tensor
        return describe_tensor(self.store, name)

    @one_at_a_time
    def export(self, name: str, path: str | os.PathLike, format: str | None = None) -> None:
        """Write a tensor to .npy, .parquet or .csv (COPY name TO 'path')."""
        from .formats.export import export_tensor
        if not isinstance(path, (str, os.PathLike)):
            raise ProgrammingError(f"an export path must be a string or path, got {type(path).__name__}")
        if format is not None and not isinstance(format, str):
            raise ProgrammingError(f"an export format must be a string, got {type(format).__name__}")
        export_tensor(self.store, name, path, format=format,
                      memory_limit=self.settings.memory_limit)

    @one_at_a_time
    def drop(self, name: str, if_exists: bool = False) -> None:
        self.store.drop(name, if_exists=if_exists)

    @one_at_a_time
    def check(self, name: str | None = None) -> list[dict]:
        """Verify every stored tile of tensor ``name`` (None: the whole database, orphan files
        too) against its checksum and catalog row, reading the files (CHECK TENSOR / CHECK
        DATABASE). One dict per problem (tensor, tile, file, offset, problem); a single row whose
        problem is 'ok' when none was found. Changes nothing.

        >>> import numpy as np, tensordb
        >>> with tensordb.connect() as con:
        ...     con.load("A", np.eye(3))
        ...     con.check("A")[-1]["problem"]
        'ok'
        """
        from .storage.integrity import COLUMNS, check
        return [dict(zip(COLUMNS, row)) for row in check(self.store, name)]

