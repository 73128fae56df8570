"""Tensor metadata and the checks every name, dimension list and grid goes through."""
from __future__ import annotations

import numbers

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..dtypes import check_dtype
from ..errors import DataError, ProgrammingError
from ..geometry import Grid, grid_shape, regular_grid
from ..sparsity import MAX_TILE_ELEMENTS, fit_elements

__all__ = ["TensorMeta", "check_name", "check_dims", "check_grid", "check_tile_shape",
           "default_dims", "supported_dtype", "MAX_DIMS", "check_fill"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_NAME = 128
# numpy's limit on an array's dimensions (NPY_MAXDIMS: 64 since numpy 2, 32 before): a tensor
# with more could be stored but never read, computed with or exported.
MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


@dataclass(frozen=True)
class TensorMeta:
    """One stored tensor, as the catalog describes it.

    ``nbytes`` is what the stored tiles take on disk (absent tiles take nothing), ``nnz`` the
    nonzero elements they hold and ``density`` is ``nnz / size``. ``fill`` is the value of an
    entry a sparse tile does not store (0 unless declared, e.g. +inf for distances); a tensor
    with another fill stores every tile (an absent tile is all zeros), and its ``nnz`` counts
    the elements that are not the fill.
    """

    name: str
    version: int
    dtype: np.dtype
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    grid: Grid
    nbytes: int
    tile_count: int
    nnz: int
    density: float
    fill: float = 0.0  # the value of an absent entry (a graph's distances: +inf)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def tile_shape(self) -> tuple[int, ...]:
        """The extent of the first (largest) tile along each dimension."""
        return tuple(b[1] - b[0] for b in self.grid)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return grid_shape(self.grid)

    @property
    def total_tiles(self) -> int:
        """Tiles in the grid, stored or not."""
        return math.prod(self.grid_shape)


def check_name(name, what: str = "tensor") -> str:
    """A tensor name is an SQL identifier: a letter or _, then letters, digits or _."""
    if not isinstance(name, str) or not _IDENT.match(name) or len(name) > _MAX_NAME:
        raise ProgrammingError(
            f"invalid {what} name {name!r}",
            hint="names start with a letter or _ followed by letters, digits or _ "
                 f"(at most {_MAX_NAME} characters)")
    return name


_LETTERS = "ijklmnopqrstuvwxyz"


def default_dims(ndim: int) -> tuple[str, ...]:
    """i, j, k, ... as einsum statements name labels; d0, d1, ... past 18 dimensions."""
    if ndim <= len(_LETTERS):
        return tuple(_LETTERS[:ndim])
    return tuple(f"d{k}" for k in range(ndim))


def check_dims(dims: Sequence[str] | None, ndim: int, tensor: str) -> tuple[str, ...]:
    """Dimension names become SQL columns: identifiers, distinct, and never ``value``. There
    are at most ``MAX_DIMS`` of them."""
    if ndim > MAX_DIMS:
        raise ProgrammingError(f"tensor '{tensor}' would have {ndim} dimensions; numpy supports "
                               f"at most {MAX_DIMS}")
    if dims is None:
        return default_dims(ndim)
    if isinstance(dims, str):
        dims = [dims] if ndim == 1 else list(dims)
    dims = tuple(dims)
    if len(dims) != ndim:
        raise ProgrammingError(f"tensor '{tensor}' has {ndim} dimension(s) but {len(dims)} "
                               f"dimension name(s) were given: {list(dims)}")
    seen = set()
    for d in dims:
        check_name(d, "dimension")
        if d.lower() == "value":
            raise ProgrammingError(f"tensor '{tensor}': 'value' cannot name a dimension",
                                   hint="'value' is the column that holds the elements in SQL")
        if d.lower() in seen:
            raise ProgrammingError(f"tensor '{tensor}': dimension name '{d}' is repeated")
        seen.add(d.lower())
    return dims


def check_tile_shape(tile, shape: Sequence[int], tensor: str) -> tuple[int, ...]:
    """A requested tile shape: one positive int per dimension, clamped to the shape."""
    try:
        if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in tile):
            raise TypeError
        tile = tuple(int(t) for t in tile)
    except (TypeError, ValueError):
        raise ProgrammingError(f"tensor '{tensor}': tile must be a tuple of integers, got {tile!r}") \
            from None
    if len(tile) != len(shape) or any(t < 1 and n > 0 for t, n in zip(tile, shape)):
        raise ProgrammingError(f"tensor '{tensor}': tile {tile} does not fit shape {tuple(shape)}",
                               hint="give one positive tile extent per dimension")
    tile = tuple(max(1, min(t, n)) for t, n in zip(tile, shape))
    if math.prod(tile) > MAX_TILE_ELEMENTS:  # a tile's linear indices are int64
        raise ProgrammingError(f"tensor '{tensor}': tile {tile} holds {math.prod(tile)} elements, "
                               f"more than a tile can ({MAX_TILE_ELEMENTS}, 2**62)",
                               hint=f"use a smaller tile, e.g. {fit_elements(tile)}")
    return tile


def check_grid(grid, shape: Sequence[int], tensor: str) -> Grid:
    """Accept a grid (boundaries per dimension) or a tile shape (ints) and return a grid."""
    shape = tuple(int(n) for n in shape)
    grid = tuple(grid)
    if all(isinstance(g, (int, np.integer)) for g in grid) and (grid or not shape):
        return regular_grid(shape, check_tile_shape(grid, shape, tensor))
    out = []
    if len(grid) != len(shape):
        raise ProgrammingError(f"tensor '{tensor}': grid has {len(grid)} dimension(s), shape {shape}")
    for d, (bounds, n) in enumerate(zip(grid, shape)):
        bounds = tuple(int(b) for b in bounds)
        ok = len(bounds) >= 2 and bounds[0] == 0 and bounds[-1] == n and (
            all(a < b for a, b in zip(bounds, bounds[1:])) or bounds == (0, 0))
        if not ok:
            raise ProgrammingError(f"tensor '{tensor}': bad grid boundaries {bounds} for dimension "
                                   f"{d} of size {n}")
        out.append(bounds)
    return tuple(out)


def supported_dtype(dtype, what: str) -> np.dtype:
    """``check_dtype`` plus a message that names the tensor or file."""
    try:
        return check_dtype(dtype, what)
    except TypeError:  # pragma: no cover - check_dtype already maps this
        raise DataError(f"{what}: unknown dtype {dtype!r}") from None


def check_fill(fill, dtype, name: str) -> float:
    """A tensor's fill value (the value of its absent entries) as a float: a real number that
    ``dtype`` holds exactly (so +inf and -inf only for floating tensors), never NaN.

    >>> check_fill(float("inf"), np.dtype("float64"), "D")
    inf
    >>> check_fill(float("inf"), np.dtype("int32"), "D")
    Traceback (most recent call last):
    ...
    tensordb.errors.ProgrammingError: tensor 'D': fill value inf does not fit its dtype int32
    """
    try:
        f = float(fill)
    except (TypeError, ValueError):
        raise ProgrammingError(f"tensor '{name}': fill value {fill!r} is not a number") from None
    if math.isnan(f):
        raise ProgrammingError(f"tensor '{name}': fill value NaN (an absent entry must be a "
                               "value that a stored one can differ from)")
    if f == 0:  # every dtype holds 0 (the usual fill: no conversion to try)
        return f
    dtype = np.dtype(dtype)
    with np.errstate(all="ignore"):
        exact = np.array(f).astype(dtype).astype(np.float64) == f if dtype.kind != "c" else True
    if f != 0 and (dtype.kind in "bc" or not exact):
        raise ProgrammingError(f"tensor '{name}': fill value {fill!r} does not fit its dtype "
                               f"{dtype.name}")
    return f
