"""Listing and describing stored tensors as plain dicts (what ``con.tensors()`` shows)."""
from __future__ import annotations

from ..geometry import grid_shape
from .meta import TensorMeta

__all__ = ["list_tensors", "describe_tensor", "summary"]


def summary(meta: TensorMeta) -> dict:
    """name, shape, dtype, dims, tiling, stored bytes and tiles, density."""
    dense = meta.size * meta.dtype.itemsize
    return {
        "name": meta.name,
        "shape": meta.shape,
        "dtype": meta.dtype.name,
        "dims": meta.dims,
        "tile_shape": meta.tile_shape,
        "grid": grid_shape(meta.grid),
        "bytes": meta.nbytes,            # on disk: stored tiles only
        "dense_bytes": dense,            # as a dense array
        "tile_count": meta.tile_count,   # stored tiles
        "total_tiles": meta.total_tiles,
        "nnz": meta.nnz,
        "density": meta.density,         # nonzero elements / elements
        "fill": meta.fill,               # the value of an absent entry (0 unless declared)
        "version": meta.version,
    }


def list_tensors(store) -> list[dict]:
    return [summary(m) for m in store.list()]


def describe_tensor(store, name: str) -> dict:
    """``summary`` plus per-dimension tiling and the payload file."""
    meta = store.meta(name)
    out = summary(meta)
    out["tile_density"] = meta.tile_count / meta.total_tiles if meta.total_tiles else 0.0
    out["dimensions"] = [
        {"name": d, "size": n, "tile": b[1] - b[0], "tiles": len(b) - 1, "bounds": b}
        for d, n, b in zip(meta.dims, meta.shape, meta.grid)]
    reader = store.open(name)
    out["file"] = reader.path
    return out
