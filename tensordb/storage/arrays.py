"""Tensors from arrays. load_array: a numpy array (any layout, a memory map included) cut into
tiles and stored, one tile at a time, in one writer commit; every loader that ends with an array
uses it. create_zeros: a tensor of zeros (CREATE TENSOR), which stores no tile at all."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..dtypes import SUPPORTED_DTYPES
from ..errors import DataError
from ..geometry import default_tile_shape, grid_shape, tile_box
from .meta import TensorMeta, check_tile_shape, supported_dtype

__all__ = ["load_array", "create_zeros"]


def load_array(store, name: str, arr: np.ndarray, *, tile=None, replace=False, dims=None,
               what: str, after_tile: Callable[[], None] | None = None,
               check_tables: bool = True) -> TensorMeta:
    """Cut ``arr`` (any layout) into tiles and store them; all-zero tiles are skipped.
    ``check_tables=False``: the caller has just looked for a user table of that name
    (``Store.check_free``), so only the commit looks again (Store.writer)."""
    if arr.dtype.hasobject:
        raise DataError(f"{what}: unsupported dtype object",
                        hint=f"supported dtypes: {', '.join(SUPPORTED_DTYPES)}")
    dtype = supported_dtype(arr.dtype, what)
    tile_shape = (check_tile_shape(tile, arr.shape, name) if tile is not None
                  else default_tile_shape(arr.shape, dtype))
    with store.writer(name, arr.shape, dtype, tile_shape, dims=dims, replace=replace,
                      check_tables=check_tables) as w:
        for coords in np.ndindex(*grid_shape(w.grid)):
            lo, hi = tile_box(w.grid, coords)
            block = arr[tuple(slice(a, b) for a, b in zip(lo, hi))] if arr.ndim else arr[...]
            w.write_tile(coords, block)
            if after_tile is not None:
                after_tile()
    return w.meta()


def create_zeros(store, name: str, shape, dtype, *, tile=None, dims=None,
                 replace=False) -> TensorMeta:
    """Store a tensor of zeros: its catalog entry only, since absent tiles are zeros. ``tile``
    is its tile shape (default: ``default_tile_shape``); the writer checks every argument.

    >>> import numpy as np
    >>> from tensordb.storage import Store
    >>> with Store() as store:
    ...     meta = create_zeros(store, "Z", (4, 6), "float32", tile=(2, 3), dims=("i", "j"))
    ...     meta.tile_count, meta.grid_shape, float(np.abs(store.open("Z").to_numpy()).sum())
    (0, (2, 2), 0.0)
    """
    dtype = supported_dtype(dtype, f"tensor '{name}'")
    tile_shape = tuple(tile) if tile is not None else default_tile_shape(shape, dtype)
    return store.writer(name, shape, dtype, tile_shape, dims=dims, replace=replace).commit()
