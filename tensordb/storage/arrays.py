"""load_array: a numpy array (any layout, a memory map included) cut into tiles and stored, one
tile at a time, in one writer commit. Every loader that ends with an array uses it."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import DataError
from ..geometry import default_tile_shape, grid_shape, tile_box
from .meta import TensorMeta, check_tile_shape, supported_dtype

__all__ = ["load_array"]


def load_array(store, name: str, arr: np.ndarray, *, tile=None, replace=False, dims=None,
               what: str, after_tile: Callable[[], None] | None = None) -> TensorMeta:
    """Cut ``arr`` (any layout) into tiles and store them; all-zero tiles are skipped."""
    if arr.dtype.hasobject:
        raise DataError(f"{what}: unsupported dtype object",
                        hint="supported dtypes: bool, float32, float64, int32, int64")
    dtype = supported_dtype(arr.dtype, what)
    tile_shape = (check_tile_shape(tile, arr.shape, name) if tile is not None
                  else default_tile_shape(arr.shape, dtype))
    with store.writer(name, arr.shape, dtype, tile_shape, dims=dims, replace=replace) as w:
        for coords in np.ndindex(*grid_shape(w.grid)):
            lo, hi = tile_box(w.grid, coords)
            block = arr[tuple(slice(a, b) for a, b in zip(lo, hi))] if arr.ndim else arr[...]
            w.write_tile(coords, block)
            if after_tile is not None:
                after_tile()
    return w.meta()
