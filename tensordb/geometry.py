"""Tile geometry, shared by every stage: where each dimension of a tensor is cut.

A grid is one tuple of boundaries per dimension, ``(0, b1, ..., n)``; tile ``c`` along a dimension
spans ``[bounds[c], bounds[c+1])``. Stored tensors use a regular grid (a tile shape, the last tile
shorter); an operation split into ``d`` pieces uses an even grid (the first ``n % d`` pieces get
one element more).

>>> regular_bounds(10, 4)
(0, 4, 8, 10)
>>> even_bounds(10, 3)
(0, 4, 7, 10)
>>> default_tile_shape((4096, 4096), "float32")
(1024, 4096)
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import ProgrammingError

__all__ = ["BoxName", "GatherName", "IotaName", "OneHotName", "Grid", "TARGET_TILE_BYTES", "regular_bounds", "even_bounds", "regular_grid",
           "default_tile_shape", "grid_shape", "tile_box", "overlapping"]

Grid = tuple[tuple[int, ...], ...]

# Tiles of about 16 MiB: big enough that a kernel call on one runs for milliseconds (per-task
# overheads are tens of microseconds), small enough that a few per worker fit in cache-friendly
# memory and that block-sparse structure is visible.
TARGET_TILE_BYTES = 16 << 20
_MIN_SLAB_ROWS = 64


# A grid lists every boundary: a dimension cut into more pieces than this is a mistake (tiles of
# a few elements), and its boundaries alone would fill the memory.
MAX_TILES_PER_DIM = 1 << 20


def regular_bounds(n: int, tile: int) -> tuple[int, ...]:
    tile = max(1, int(tile))
    count = -(-n // tile)
    if count > MAX_TILES_PER_DIM:
        raise ProgrammingError(f"a dimension of {n} elements in tiles of {tile} makes {count} tiles; "
                               f"at most {MAX_TILES_PER_DIM} per dimension",
                               hint="choose larger tiles (TILE (...) / tile=)")
    return tuple(range(0, n, tile)) + (n,) if n > 0 else (0, 0)


def even_bounds(n: int, pieces: int) -> tuple[int, ...]:
    pieces = max(1, min(int(pieces), max(n, 1)))
    q, r = divmod(n, pieces)
    out, at = [0], 0
    for p in range(pieces):
        at += q + (1 if p < r else 0)
        out.append(at)
    return tuple(out)


def regular_grid(shape: Sequence[int], tile_shape: Sequence[int]) -> Grid:
    return tuple(regular_bounds(n, t) for n, t in zip(shape, tile_shape))


def grid_shape(grid: Grid) -> tuple[int, ...]:
    """Number of tiles along each dimension."""
    return tuple(len(b) - 1 for b in grid)


def tile_box(grid: Grid, coords: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(starts, stops) of tile ``coords``."""
    return (tuple(b[c] for b, c in zip(grid, coords)),
            tuple(b[c + 1] for b, c in zip(grid, coords)))


def overlapping(bounds: Sequence[int], start: int, stop: int) -> range:
    """Indices of the pieces of ``bounds`` that overlap [start, stop)."""
    import bisect
    lo = bisect.bisect_right(bounds, start) - 1
    hi = bisect.bisect_left(bounds, stop)
    return range(max(lo, 0), min(hi, len(bounds) - 1))


def default_tile_shape(shape: Sequence[int], dtype, target_bytes: int = TARGET_TILE_BYTES
                       ) -> tuple[int, ...]:
    """A tile shape of at most about ``target_bytes``, cutting leading dimensions first.

    Trailing dimensions stay whole while they fit, so a tile is a contiguous slab of the C-ordered
    tensor and consecutive tiles are adjacent: a box spanning several row tiles can be read as one
    view. When a row itself is too large, the trailing dimensions are cut into near-square pieces.
    """
    shape = tuple(int(n) for n in shape)
    if not shape:
        return ()
    budget = max(1, target_bytes // np.dtype(dtype).itemsize)  # elements per tile
    tile = list(shape)
    # Walk from the last dimension: keep it whole if the elements to its right fit the budget.
    inner = 1
    for d in range(len(shape) - 1, -1, -1):
        n = max(shape[d], 1)
        if inner * n <= budget:
            inner *= n
            continue
        tile[d] = max(1, budget // inner)
        for e in range(d - 1, -1, -1):
            tile[e] = 1
        if d == len(shape) - 2 and tile[d] < min(_MIN_SLAB_ROWS, shape[d]):
            # Rows are so long that a slab would be thin: cut into square-ish pieces instead.
            return _square_tiles(shape, budget)
        break
    return tuple(min(t, max(n, 1)) for t, n in zip(tile, shape))


def _square_tiles(shape: tuple[int, ...], budget: int) -> tuple[int, ...]:
    side = max(1, int(math.floor(budget ** (1.0 / len(shape)))))
    tile = [min(side, max(n, 1)) for n in shape]
    # Give unused budget back to the trailing dimensions (they keep rows contiguous).
    for d in range(len(shape) - 1, -1, -1):
        rest = budget // max(1, math.prod(tile) // tile[d])
        tile[d] = min(max(shape[d], 1), max(tile[d], rest))
    return tuple(tile)


class BoxName(str):
    """The graph name of a box of a stored tensor (a slice, ``X[0:100, d]``): a ``str`` that
    prints as ``X[0:100,0:5]`` and carries the stored tensor's name (``base``) and the box, one
    ``(start, stop)`` per dimension. The storage opens it as a reader of that box alone
    (storage/boxes.py); no stage parses its text.

    >>> b = BoxName("X", ((0, 100), (0, 5)))
    >>> str(b), b.base, b.box, b.shape
    ('X[0:100,0:5]', 'X', ((0, 100), (0, 5)), (100, 5))
    """

    base: str
    box: tuple[tuple[int, int], ...]

    def __new__(cls, base: str, box) -> "BoxName":
        box = tuple((int(a), int(b)) for a, b in box)
        self = super().__new__(cls, f"{base}[{','.join(f'{a}:{b}' for a, b in box)}]")
        object.__setattr__(self, "base", str(base))
        object.__setattr__(self, "box", box)
        return self

    def __setattr__(self, key, value):
        raise AttributeError("a BoxName is immutable")

    def __reduce__(self):
        return BoxName, (self.base, self.box)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.box)


class GatherName(str):
    """The graph name of a gather (``E[tok[b], d]``, an embedding lookup): the rows of the
    stored tensor ``base`` that the values of the stored integer tensor ``index`` select, a
    ``str`` printing ``E[tok]``. Its shape is the index's shape, then the base's other axes.
    The storage opens it as a reader that reads the index's box, then the base's tiles holding
    those rows (storage/boxes.py).

    >>> g = GatherName("E", "tok", (2, 3), (50, 4))
    >>> str(g), g.shape
    ('E[tok]', (2, 3, 4))
    """

    base: str
    index: str
    index_shape: tuple[int, ...]
    base_shape: tuple[int, ...]

    def __new__(cls, base: str, index: str, index_shape, base_shape) -> "GatherName":
        self = super().__new__(cls, f"{base}[{index}]")
        for k, v in (("base", str(base)), ("index", str(index)),
                     ("index_shape", tuple(int(n) for n in index_shape)),
                     ("base_shape", tuple(int(n) for n in base_shape))):
            object.__setattr__(self, k, v)
        return self

    def __setattr__(self, key, value):
        raise AttributeError("a GatherName is immutable")

    def __reduce__(self):
        return GatherName, (self.base, self.index, self.index_shape, self.base_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.index_shape + self.base_shape[1:]


class OneHotName(str):
    """The graph name of the one-hot rows of the stored integer tensor ``index``: of shape
    ``index_shape + (rows,)``, 1 (True) where the last coordinate is the row the index names
    (numpy's negative rows too), else 0: the matrix whose product with a gather's gradient is
    its scatter-add (plan/select.py). It prints as ``onehot(tok,50)``; the storage opens it as a
    reader that compares the index's box with the row numbers (storage/boxes.py).

    >>> h = OneHotName("tok", (2, 3), 50)
    >>> str(h), h.shape
    ('onehot(tok,50)', (2, 3, 50))
    """

    index: str
    index_shape: tuple[int, ...]
    rows: int

    def __new__(cls, index: str, index_shape, rows: int) -> "OneHotName":
        self = super().__new__(cls, f"onehot({index},{int(rows)})")
        for k, v in (("index", str(index)), ("index_shape", tuple(int(n) for n in index_shape)),
                     ("rows", int(rows))):
            object.__setattr__(self, k, v)
        return self

    def __setattr__(self, key, value):
        raise AttributeError("a OneHotName is immutable")

    def __reduce__(self):
        return OneHotName, (self.index, self.index_shape, self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.index_shape + (self.rows,)


class IotaName(str):
    """The graph name of ``numpy.arange(start, stop)`` (int64), a tensor no catalog stores: the
    positions a slice of an intermediate, or the gradient of a slice or a gather, compares
    (``where(I[i] == J[j], ...)``: a box as an equality join on positions). It prints as
    ``iota(3:7)``; the storage opens it as a reader that computes its values (storage/boxes.py).

    >>> i = IotaName(3, 7)
    >>> str(i), i.start, i.stop, i.shape
    ('iota(3:7)', 3, 7, (4,))
    """

    start: int
    stop: int

    def __new__(cls, start: int, stop: int) -> "IotaName":
        self = super().__new__(cls, f"iota({int(start)}:{int(stop)})")
        object.__setattr__(self, "start", int(start))
        object.__setattr__(self, "stop", int(stop))
        return self

    def __setattr__(self, key, value):
        raise AttributeError("an IotaName is immutable")

    def __reduce__(self):
        return IotaName, (self.start, self.stop)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.stop - self.start,)
