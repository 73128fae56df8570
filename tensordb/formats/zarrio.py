"""Zarr arrays in and out, chunk by chunk: a tensor loaded from a zarr array (or a ``.zarr``
path) is read one tile at a time, each tile a whole number of the array's chunks, so an array
larger than memory loads; an export writes each stored tile into a new zarr array whose chunks are
the tensor's tiles (absent tiles are never written: zarr reads them as its fill value, 0) and
whose ``dimension_names`` are the tensor's dims, which a load gives back.

>>> import numpy as np, tempfile, os
>>> from tensordb.storage import Store
>>> d = tempfile.mkdtemp()
>>> with Store() as store:
...     _ = load_array(store, "A", np.arange(6.0).reshape(2, 3), what="A", dims=("r", "c"))
...     export_zarr(store.open("A"), os.path.join(d, "a.zarr"))
...     meta = load_zarr(store, "B", os.path.join(d, "a.zarr"), tile=None, replace=False, dims=None)
...     meta.dims, float(store.open("B").to_numpy().sum())
(('r', 'c'), 15.0)
"""
from __future__ import annotations

import json
import os
import shutil

from .._optional import require
from ..errors import OperationalError, ProgrammingError
from ..geometry import default_tile_shape
from ..storage.arrays import load_array

__all__ = ["is_zarr", "load_zarr", "export_zarr"]


def is_zarr(obj) -> bool:
    """Whether ``obj`` is a zarr array (zarr is not imported)."""
    return any(cls.__name__ == "Array" and (cls.__module__ or "").startswith("zarr")
               for cls in type(obj).__mro__)


def _open(source):
    if not isinstance(source, (str, os.PathLike)):  # an array (or anything sliced like one)
        return source, str(getattr(source, "path", "") or "a zarr array")
    zarr = require("zarr", "loading a .zarr array")
    try:
        return zarr.open_array(os.fspath(source), mode="r"), os.fspath(source)
    except Exception as exc:  # zarr's own errors: not an array, a group, a bad file
        raise OperationalError(f"cannot open {os.fspath(source)} as a zarr array: {exc}") from None


def _chunk_tiles(shape, chunks, dtype) -> tuple[int, ...]:
    """The default tile shape rounded up to whole chunks (a tile reads each chunk once)."""
    tile = default_tile_shape(shape, dtype)
    return tuple(min(n, max(c, -(-t // c) * c)) if n else t
                 for n, c, t in zip(shape, chunks, tile))


def load_zarr(store, name: str, source, *, tile, replace: bool, dims):
    """Store zarr array ``source`` (an array, or the path of one) as tensor ``name``, a tile
    at a time; its ``dimension_names`` name the dims unless ``dims`` does."""
    arr, where = _open(source)
    if dims is None:
        names = getattr(getattr(arr, "metadata", None), "dimension_names", None)
        if names and all(isinstance(n, str) and n for n in names):
            dims = list(names)
    if tile is None and arr.ndim:
        tile = _chunk_tiles(arr.shape, arr.chunks, arr.dtype)
    return load_array(store, name, arr, tile=tile, replace=replace, dims=dims, what=where)


def _is_zarr_array(path: str) -> bool:
    """Whether ``path`` holds one zarr array (v3: ``zarr.json`` of node type array; v2:
    ``.zarray`` and no ``.zgroup``), which an export may replace: a group holds other arrays."""
    meta = os.path.join(path, "zarr.json")
    if os.path.isfile(meta):
        try:
            with open(meta, encoding="utf-8") as fh:
                return json.load(fh).get("node_type") == "array"
        except (OSError, ValueError, AttributeError):
            return False
    return os.path.isfile(os.path.join(path, ".zarray")) and \
        not os.path.exists(os.path.join(path, ".zgroup"))


def export_zarr(reader, path: str, tmp: str | None = None) -> None:
    """Write the tensor of ``reader`` as a new zarr array at ``path`` (written under ``tmp``,
    then renamed; an existing zarr array at ``path`` is replaced, anything else refused)."""
    zarr = require("zarr", "exporting to .zarr")
    meta = reader.meta
    path = os.fspath(path)
    if os.path.exists(path) and not _is_zarr_array(path):
        raise ProgrammingError(f"cannot export '{meta.name}' to {path}: it exists and is not "
                               "a zarr array", hint="choose a new path; a zarr array there is "
                                                    "replaced")
    tmp = tmp or os.path.join(os.path.dirname(os.path.abspath(path)),
                              f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        chunks = meta.tile_shape if meta.ndim else ()
        out = zarr.create_array(store=tmp, shape=meta.shape, dtype=meta.dtype,
                                chunks=tuple(max(1, c) for c in chunks), fill_value=0,
                                dimension_names=tuple(meta.dims) if meta.ndim else None,
                                overwrite=True)
        for entry, tile in reader.tiles():  # stored tiles only: absent ones read as 0
            out[tuple(slice(s, s + n) for s, n in zip(entry.starts, entry.shape))] = tile
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError as exc:
        raise OperationalError(f"cannot export '{meta.name}' to {path}: "
                               f"{exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
