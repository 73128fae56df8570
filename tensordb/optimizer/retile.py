"""What reading an input in another tiling than it has costs (cost.py's re-tiling term).

A stored input is compared with its stored grid: pieces that are unions of stored tiles which the
reader hands out as views (``storage.reader.box_view``) are free; cutting it off that grid, or
reading a piece made of several stored tiles that is no view, is a local copy, charged at a
fraction (``CostParams.stored_retile``) of its bytes. An earlier operation's result is re-cut
(``recut_bytes``) unless it was made in the tiling needed.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from ..geometry import Grid, even_bounds
from ..storage.reader import box_view

__all__ = ["edge_retile", "recut_bytes", "stored_aligned", "views", "REFINE_SHARE"]


@lru_cache(maxsize=65536)
def views(grid: Grid, shape: tuple[int, ...], need: tuple[int, ...], dense: bool = True) -> bool:
    """True when the reader hands out every piece of the even tiling ``need`` of a stored tensor
    as a view (``storage.reader.box_view``, the reader's own predicate). (A piece over an absent
    tile is no tile at all: nothing held.)

    >>> views(((0, 4, 8), (0, 4, 8)), (8, 8), (4, 2)), views(((0, 4, 8), (0, 4, 8)), (8, 8), (1, 2))
    (True, False)
    >>> views(((0, 4, 8), (0, 8)), (8, 8), (1, 2))     # a run of two row tiles
    True
    """
    return box_view(grid, [list(zip(c, c[1:])) for c in map(even_bounds, shape, need)], dense)


def stored_aligned(grid: Grid | None, shape: Sequence[int], need: Sequence[int]) -> bool:
    """True when every piece of the needed even tiling is a union of stored tiles.

    >>> stored_aligned(((0, 4, 8),), (8,), (2,)), stored_aligned(((0, 4, 8),), (8,), (4,))
    (True, False)
    """
    if grid is None:
        return True
    for bounds, n, d in zip(grid, shape, need):
        if not set(even_bounds(n, d)) <= set(bounds):
            return False
    return True


def edge_retile(model, which: int, d: Sequence[int], producer,
                producer_d: Sequence[int] | None, grid: Grid | None) -> float:
    """The re-tiling cost of input ``which`` of ``model`` (a cost.OpModel) under tiling ``d``,
    its input made by ``producer`` (an OpModel, None: stored) under ``producer_d``."""
    inp = model.inputs[which]
    need = model.need(d, which)
    if producer is None:
        # Pieces that are unions of stored tiles are free when the reader hands them out as
        # views; one cut off the stored grid, or made of several stored tiles that are not one
        # run of rows (a matrix stored in column tiles), is a copy on its worker.
        if stored_aligned(grid, inp.shape, need) and (
                grid is None or views(tuple(map(tuple, grid)), inp.shape, need,
                                      inp.presence is None)):
            return 0.0
        return model.params.stored_retile * inp.nbytes
    return recut_bytes(float(producer.out_bytes), producer.out_tiling(producer_d), need)


# Re-cutting a result into a finer tiling of the same labels (every piece needed lies in one tile
# made, on that tile's worker, and can run as soon as it exists) costs this share of its bytes:
# nothing is gathered from other tiles, and the tile made need not wait for others to be freed.
REFINE_SHARE = 0.5


def recut_bytes(nbytes: float, made: tuple, need: tuple) -> float:
    """The cost of reading a result tiled ``made`` (pieces per dimension) as ``need``."""
    if made == need:
        return 0.0
    if all(n % m == 0 for n, m in zip(need, made)):
        return REFINE_SHARE * nbytes
    return nbytes
