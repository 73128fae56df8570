"""Storage: the DuckDB catalog, tile payload files, import and export.

Only this package imports duckdb for the catalog. The interface the rest of tensordb relies on:

``Store(path=None, *, read_only=False)``
    Opens (creating if needed) a database directory, or an in-memory database when ``path`` is None.
    A second process opening the same database for writing gets an OperationalError.
    Attributes: ``duck`` (the DuckDB connection; user tables live there too), ``root`` (directory).
``Store.list() -> list[TensorMeta]``, ``has(name)``, ``meta(name) -> TensorMeta`` (CatalogError if
    missing), ``open(name) -> TensorReader``, ``drop(name, if_exists=False)``,
    ``writer(name, shape, dtype, grid, dims=None, replace=False) -> TensorWriter``,
    ``transaction()`` (a context manager: every writer commit and drop inside it lands atomically
    together, or none does), ``close()``.
``TensorMeta`` (frozen): name, version, dtype (np.dtype), shape, dims, grid, nbytes, tile_count,
    nnz, density; ``size``, ``tile_shape``.
``TensorReader`` (picklable: no DuckDB handles): ``meta``, ``coords()`` (present tile coordinates),
    ``tile(coords)`` (read-only view of one tile, memory-mapped), ``read_box(starts, stops)``
    (ndarray for any box, or None when no stored tile overlaps it; a view when it is one tile or a
    contiguous run of tiles, else an assembled copy with absent tiles as zeros), ``to_numpy()``.
``TensorWriter``: ``write_tile(coords, array)`` (all-zero tiles are not stored), then ``commit()``
    or ``abort()``; a context manager that commits on success. Nothing is visible before commit.

Catalog tables (schema ``tensordb``):

    tensors(name, version, dtype, shape BIGINT[], dims VARCHAR[], grid BIGINT[][], nbytes,
            tile_count, nnz, density, created)
    tiles(tensor, version, coords BIGINT[], starts BIGINT[], shape BIGINT[], file, "offset",
          nbytes, nnz)
"""
from .store import Store, TensorMeta, TensorReader, TensorWriter  # noqa: E402

__all__ = ["Store", "TensorMeta", "TensorReader", "TensorWriter"]
