"""Cuts of equal nonzeros: where a sparse matrix's row label is split, the pieces are row slabs
holding equal shares of its nonzeros rather than equal extents, so that a power-law graph's dense
rows do not leave one worker with most of the work (docs/explain.md, "Row slabs of equal
nonzeros").

The decomposition still says how many pieces each label has; ``balance`` adds where the pieces
of such a label are cut (``details["cuts"]``: output name -> {label: bounds}), which the
lowering follows instead of even extents, and what the cut achieves (``details["balance"]``,
shown by EXPLAIN: each piece's nonzeros, and those of the even cuts it replaced). A label is
cut by nonzeros in an operation that a sparse kernel computes (``details["output_nnz"]`` names
it) when a stored sparse matrix that it reads has that label as its rows and the snapshot
offers the matrix's row profile (``StoredStats.row_profile``: its nonzeros before each row),
and only where even cuts would be unbalanced (the largest piece more than ``TOLERANCE`` above
the mean) and do not fall on the matrix's stored row tiles (then its pieces are its tiles;
``optimizer.balanced`` also keeps even cuts where the widest slab would pass a worker's budget); a later operation that reads such a result with the same pieces of that label takes
the same cuts (its tiles then need no re-cut).

>>> import numpy as np
>>> profile = np.cumsum([0, 90, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])   # one hub row, ten light rows
>>> nnz_cuts(profile, 2)
(0, 1, 11)
>>> piece_nnz(profile, (0, 1, 11)), piece_nnz(profile, (0, 6, 11))
([90, 10], [95, 5])
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..geometry import even_bounds
from ..plan.ir import EinGraph
from .sparse_cost import StoredStats

__all__ = ["TOLERANCE", "nnz_cuts", "piece_nnz", "balance"]

TOLERANCE = 0.05  # even cuts are kept while their largest piece is within 5% of the mean


def nnz_cuts(profile: np.ndarray, pieces: int) -> tuple[int, ...]:
    """Bounds of ``pieces`` row slabs of about equal nonzeros, from ``profile`` (the nonzeros
    before each row: rows + 1 counts, non-decreasing): every slab at least one row."""
    n = len(profile) - 1
    pieces = max(1, min(int(pieces), max(n, 1)))
    total = int(profile[-1])
    if total == 0 or pieces == 1:
        return even_bounds(n, pieces)
    targets = np.arange(1, pieces) * (total / pieces)
    cuts = np.searchsorted(profile, targets, side="left")
    # a cut just past the target row when that row's entries are closer to the target there
    below = np.maximum(cuts - 1, 0)
    closer = np.abs(profile[below] - targets) < np.abs(profile[cuts] - targets)
    cuts = np.where(closer, below, cuts)
    out = [0]
    for p, c in enumerate(cuts.tolist(), start=1):
        out.append(int(min(max(c, out[-1] + 1), n - (pieces - p))))
    out.append(n)
    return tuple(out)


def piece_nnz(profile: np.ndarray, bounds) -> list[int]:
    """The nonzeros of each piece ``bounds`` cut."""
    at = np.asarray(profile)[list(bounds)]
    return [int(x) for x in np.diff(at)]


def _unbalanced(nnz: list[int]) -> bool:
    mean = sum(nnz) / len(nnz) if nnz else 0
    return mean > 0 and max(nnz) > (1 + TOLERANCE) * mean


def balance(graph: EinGraph, pieces_by_op: Mapping[str, Mapping[str, int]],
            stats: Mapping[str, StoredStats] | None, sparse_ops,
            grids: Mapping | None = None) -> tuple[dict, dict]:
    """(cuts, balance) of the module docstring for ``graph`` at ``pieces_by_op``; ``sparse_ops``:
    the outputs of the operations a sparse kernel computes; ``grids``: the stored inputs' grids
    (even cuts on a matrix's stored row bounds are kept: its pieces are then its tiles, read as
    they are stored, and a block-sparse matrix's absent tiles make no kernel call)."""
    cuts: dict[str, dict[str, tuple[int, ...]]] = {}
    shown: dict[str, dict] = {}
    produced = {op.output for op in graph.ops}
    for op in graph.ops:
        pieces = pieces_by_op.get(op.output, {})
        mine: dict[str, tuple[int, ...]] = {}
        if op.output in sparse_ops:
            for o in op.inputs:
                st = (stats or {}).get(o.tensor)
                if st is None or not st.sparse or st.row_profile is None or \
                        o.tensor in produced or len(o.labels) != 2 or len(set(o.labels)) != 2:
                    continue
                row = o.labels[0]
                d = int(pieces.get(row, 1))
                if d <= 1 or row in mine:
                    continue
                profile = st.row_profile()
                if profile is None or len(profile) != op.size[row] + 1:
                    continue
                even = even_bounds(op.size[row], d)
                stored = (grids or {}).get(o.tensor)
                if stored is not None and set(even) <= set(stored[0]):
                    continue
                got = nnz_cuts(profile, d)
                if got == even or not _unbalanced(piece_nnz(profile, even)):
                    continue
                mine[row] = got
                shown[op.output] = {"label": row, "tensor": o.tensor, "bounds": list(got),
                                    "nnz": piece_nnz(profile, got),
                                    "even_nnz": piece_nnz(profile, even)}
        # an earlier result read with the same pieces of a cut label: the same cuts
        for o in op.inputs:
            if o.tensor not in cuts:
                continue
            src = next(s for s in graph.ops if s.output == o.tensor)
            for pos, l in enumerate(o.labels):
                lab = src.out_labels[pos] if pos < len(src.out_labels) else None
                b = cuts[o.tensor].get(lab)
                if b is not None and l not in mine and int(pieces.get(l, 1)) == len(b) - 1 \
                        and op.size[l] == b[-1]:
                    mine[l] = b
        if mine:
            cuts[op.output] = mine
    return cuts, shown
