"""Storage: the DuckDB catalog, tile payload files, readers, writers and integrity (docs/storage.md).

Only this package and the ones on it (sqlfront, formats) import duckdb, and no duckdb exception
leaves them (each becomes a tensordb error). The interface the rest of tensordb relies on:

``Store(path=None, *, read_only=False)``
    Opens (creating if needed) a database directory (``catalog.duckdb`` + ``tiles/``), or an
    in-memory database when ``path`` is None (payloads in a temporary directory, deleted on
    close). A second writer, in another process or this one, gets an OperationalError; so does a
    path that is a regular file, and so does a directory whose catalog is missing (or holds no
    tensordb tables) while payload files exist. Opening for writing deletes payload files that the
    catalog proves unreferenced (crash leftovers). Attributes: ``duck`` (the DuckDB connection; user tables live
    there too, schema main), ``root`` (directory), ``tiles_dir``, ``read_only``, ``fsync`` (sync
    payloads before commit; on for on-disk databases).
``Store.list() -> list[TensorMeta]``, ``has(name)``, ``meta(name) -> TensorMeta`` (CatalogError if
    missing; names are case-insensitive), ``open(name) -> TensorReader``, ``open_many(names)
    -> {name: TensorReader}`` (one catalog query for all),
    ``drop(name, if_exists=False)``,
    ``writer(name, shape, dtype, grid, dims=None, replace=False, check_tables=True) ->
    TensorWriter`` (``grid``: one tuple of boundaries per dimension, or a tile shape of ints;
    CatalogError at once if the name is taken and not ``replace``, or is a table, and a table is
    looked for again inside the commit's transaction; ``check_tables=False`` leaves the table to
    the commit alone), ``check_free(name, replace, tables=True)``, ``check_no_tables(names)`` (one
    query for user tables named like any of ``names``; a writer marked ``tables_checked`` after
    it, inside the commit's transaction, is not looked for again),
    ``transaction()`` (a context manager: every writer commit and drop inside it lands atomically
    together, or none does; nested blocks join the outer one), ``close()``.
``TensorMeta`` (frozen): name, version, dtype (np.dtype), shape, dims, grid, nbytes (stored
    bytes), tile_count (stored tiles), nnz, density (nnz / size); ``size``, ``ndim``,
    ``tile_shape``, ``grid_shape``, ``total_tiles``.
``TensorReader`` (picklable: no DuckDB handles; maps its file lazily, once): ``meta``, ``path``,
    ``coords()`` (present tile coordinates, in file order), ``has(coords)``, ``tile(coords)``
    (read-only view of one tile, memory-mapped; None if absent), ``tiles()`` (entry, view) pairs,
    ``read_box(starts, stops)`` (ndarray for any box, or None when no stored tile overlaps it; a
    view when it lies in one tile or in a run of full-width row tiles adjacent in the file, else an
    assembled copy with absent tiles as zeros), ``to_numpy()`` (a new dense array).
``TensorWriter``: ``write_tile(coords, array)`` (cast to the dtype; all-zero tiles are not stored;
    thread-safe), then ``commit() -> TensorMeta`` or ``abort()``; a context manager that commits
    on success and aborts on an exception. Nothing is visible before commit.

Catalog tables (schema ``tensordb``):

    tensors(name, version, dtype, shape BIGINT[], dims VARCHAR[], grid BIGINT[][], nbytes,
            tile_count, nnz, density, created)
    tiles(tensor, version, coords BIGINT[], starts BIGINT[], shape BIGINT[], file, "offset",
          nbytes, nnz, crc32)

``arrays.create_zeros(store, name, shape, dtype, tile=None, dims=None, replace=False)``: a tensor
    of zeros (CREATE TENSOR): a catalog entry and no tile. ``arrays.load_array``: an array cut
    into tiles and stored.
``integrity.check(store, name=None)``: the rows of CHECK TENSOR / CHECK DATABASE (every tile read
    back and compared with its crc32 and catalog row; orphans; ``COLUMNS`` names the columns).

Modules: store (Store), directory (the database directory: checks before opening, one writer,
the sweep of leftover payloads and of a killed load's inflated npz members), catalog (the
tables), writer/reader (payload files), boxes (slices and gathers), sparse (sparse tile payloads),
integrity (the check), arrays (arrays cut into tiles; tensors of zeros), views (tensors shown to
DuckDB as Arrow streams), budget (DuckDB's memory for loads and exports), info (listing), meta
(names, grids), objects/objreader/objectdb (payloads in an S3-compatible object store:
``Store(path, storage="s3://bucket/prefix", storage_options={...})``). Tile geometry and dtypes
are tensordb.geometry and tensordb.dtypes, shared with the other stages: storage imports no stage above it. The SQL front door (user SQL passed to DuckDB)
is tensordb.sqlfront, the file formats (loads and exports) tensordb.formats; both sit on this
package and use only its public names (``Store.lock``, ``check_open``, ``in_transaction``,
``find``, ``views_of``, ``register_view``; the error translation and quoting above).
"""
from ._duck import (first_row, held_interrupt, is_interrupt, quote_ident,  # noqa: E402
                    quote_str, spelled_names, translate, translate_message, translating)
from .store import Store, TensorMeta, TensorReader, TensorWriter  # noqa: E402

__all__ = ["Store", "TensorMeta", "TensorReader", "TensorWriter",
           # DuckDB's errors as tensordb's, and quoting: for every package that runs SQL on the
           # store's connection (sqlfront/, formats/, session/), as storage itself does
           "translate", "translate_message", "translating", "is_interrupt", "quote_ident",
           "quote_str", "first_row", "spelled_names",
           # a Ctrl-C held over a step that must not be cut in two (exec/pool_run.py too)
           "held_interrupt"]
