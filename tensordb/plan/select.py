"""Boxes and gathers as extended einsums over positions: a slice of an intermediate, and the
gradients of slices and gathers.

A stored tensor's slice or gather is read by a reader of its own (storage/boxes.py). What is not
stored (a LET, an earlier statement's result, a gradient flowing back) is selected by an
operation that compares positions: ``geometry.IotaName`` tensors hold ``arange`` values, and

    Z[j, c] for j in lo:hi       = SUM over i of  WHERE(I[i] == J[j], Z[i, c], 0)
    dX[i, c] (X[lo:hi] was read) = SUM over j of  WHERE(I[i] == J[j], dXbox[j, c], 0)
    dE[r, d] (E[tok[b], d] read) = SUM over b of  dG[b, d] * H[b, r]
    Z[tok[b], c] (Z not stored)  = SUM over r of  WHERE(H[b, r], Z[r, c], 0)

with ``I = arange(0, n)``, ``J = arange(lo, hi)``: an equality join on the positions, aggregated;
``H = onehot(tok)`` (``geometry.OneHotName``: ``H[b, r]`` is ``tok[b] == r``, numpy's negative
rows included), so a gather's gradient is a matrix product (the scatter-add as BLAS computes it:
where a gradient row holds inf or NaN, ``0 * inf`` spreads NaN to every row, where numpy's
``np.add.at`` keeps it to the rows the index names; a training step that got there has
diverged, and the NonFiniteWarning says so). Each is one operation, planned and tiled like
every other, differentiable like every other (WHERE's derivative is the branch it chose), so a
slice of a LET has a gradient for free. A box's kernel evaluates the comparison densely per
tile: its cost is the join space (rows x box x the other axes), not the box's size; a stored
tensor's slice needs none of this.

>>> s = box_select((10, 4), ((2, 5), (0, 4)), "float64")
>>> s.out_labels, s.inputs, s.sizes
(('a0', 'a1'), (('x', ('s0', 'a1')), ('iota(0:10)', ('s0',)), ('iota(2:5)', ('a0',))), {'s0': 10, 'a1': 4, 'a0': 3})
"""
from __future__ import annotations

from dataclasses import dataclass

from ..geometry import IotaName, OneHotName
from .scalar import Call, Const, Expr, Input

__all__ = ["Selection", "box_select", "box_scatter", "gather_select", "gather_scatter"]


@dataclass(frozen=True)
class Selection:
    """One operation ``out[out_labels] = agg(join(inputs))``; the first input is named ``x``
    (the caller puts its tensor there), the others are ``IotaName`` positions or the index."""

    out_labels: tuple[str, ...]
    inputs: tuple[tuple[str, tuple[str, ...]], ...]
    join: Expr
    sizes: dict[str, int]
    agg: str

    def with_source(self, name: str) -> "Selection":
        return Selection(self.out_labels, ((name, self.inputs[0][1]),) + self.inputs[1:],
                         self.join, self.sizes, self.agg)


def _box(shape, box, dtype: str, scatter: bool) -> Selection:
    inputs: list = [None]
    src, dst, sizes = [], [], {}
    cond = []
    for a, ((lo, hi), n) in enumerate(zip(box, shape)):
        if (lo, hi) == (0, n):
            src.append(f"a{a}")
            dst.append(f"a{a}")
            continue
        src.append(f"s{a}")
        dst.append(f"a{a}")
        inputs.append((IotaName(0, n), (f"s{a}",)))
        inputs.append((IotaName(lo, hi), (f"a{a}",)))
        cond.append(Call("==", (Input(len(inputs) - 2), Input(len(inputs) - 1))))
    for l, (lo, hi), n in zip(src, box, shape):
        sizes[l] = n
    for l, (lo, hi) in zip(dst, box):
        sizes[l] = hi - lo
    body: Expr = Input(0)
    for c in reversed(cond):
        body = Call("where", (c, body, Const(False if dtype == "bool" else 0)))
    labels_in, labels_out = (dst, src) if scatter else (src, dst)
    inputs[0] = ("x", tuple(labels_in))
    agg = "max" if dtype == "bool" else "sum"  # at most one term is not 0
    return Selection(tuple(labels_out), tuple(inputs), body, sizes, agg)


def box_select(shape, box, dtype: str) -> Selection:
    """``x[box]`` of a tensor ``x`` of ``shape`` (one ``(start, stop)`` per axis)."""
    return _box(shape, box, dtype, scatter=False)


def box_scatter(shape, box, dtype: str = "float64") -> Selection:
    """The tensor of ``shape`` holding ``x`` (of the box's shape) in ``box``, zeros elsewhere:
    the gradient of a slice."""
    return _box(shape, box, dtype, scatter=True)


def gather_scatter(base_shape, index: str, index_shape) -> Selection:
    """The gradient of ``base[index]`` from ``x`` (of ``index_shape + base_shape[1:]``): the
    scatter-add of x's rows onto the rows of ``base`` the index names, as the product of x with
    the index's one-hot rows (``OneHotName``), a contraction over the lookups (BLAS)."""
    n = base_shape[0]
    b = tuple(f"b{k}" for k in range(len(index_shape)))
    rest = tuple(f"a{k}" for k in range(1, len(base_shape)))
    sizes = dict(zip(b, index_shape)) | {"r": n} | dict(zip(rest, base_shape[1:]))
    inputs = (("x", b + rest), (OneHotName(index, index_shape, n), b + ("r",)))
    return Selection(("r",) + rest, inputs, Call("*", (Input(0), Input(1))), sizes, "sum")


def gather_select(base_shape, index: str, index_shape, dtype: str) -> Selection:
    """``x[index]`` of a tensor ``x`` of ``base_shape`` that is not stored (a LET, an earlier
    result), by the stored integer tensor ``index``: an equality join of x's rows with the
    index's one-hot rows (``OneHotName``), the one matching row kept by WHERE (exact: the
    other rows' values, NaN and inf too, never take part; an index out of range is a
    DataError, as numpy's IndexError)."""
    n = base_shape[0]
    b = tuple(f"b{k}" for k in range(len(index_shape)))
    rest = tuple(f"a{k}" for k in range(1, len(base_shape)))
    sizes = dict(zip(b, index_shape)) | {"r": n} | dict(zip(rest, base_shape[1:]))
    inputs = (("x", ("r",) + rest), (OneHotName(index, index_shape, n), b + ("r",)))
    join = Call("where", (Input(1), Input(0), Const(False if dtype == "bool" else 0)))
    return Selection(b + rest, inputs, join, sizes, "max" if dtype == "bool" else "sum")
