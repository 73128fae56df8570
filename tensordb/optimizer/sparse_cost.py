"""What the optimizer knows of sparse stored inputs, and how a sparse kernel is priced on it
(docs/explain.md, "Sparse inputs are priced by their nonzeros"): the catalog's formats, nonzeros
and payload bytes of a stored input (``StoredStats``), the flops of a sparse kernel
(``sparse_flops``) and its output's estimated nonzeros (``sparse_out_nnz``). cost.py reads them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..plan.ir import EinOp

__all__ = ["StoredStats", "read_sparse", "sparse_flops", "sparse_out_nnz", "spmm_rows",
           "product_reach", "reach_nnz", "made_stats"]


@dataclass(frozen=True)
class StoredStats:
    """What the catalog knows of a stored input's tiles, summed over them: their formats
    ('dense', 'csr', 'coo'), nonzeros and payload bytes. An operation whose kernel reads a
    stored input sparse (``plan.kernel.sparse_kernel``) is priced on these, not on extents: it
    reads ``nbytes``, and its flops are ``2 * nnz * columns`` (spmm) or ``nnz`` (spreduce)."""

    formats: tuple[str, ...]
    nnz: int
    nbytes: int
    fill: float = 0.0  # the value of its absent entries (TensorMeta.fill)
    # A matrix's nonzeros before each row (rows + 1 counts, the CSR row pointers of the whole
    # matrix), made when first asked (optimizer/balance.py cuts row slabs of equal nonzeros by
    # it); None where the snapshot offers none (not a matrix, or not sparse).
    row_profile: Callable | None = field(default=None, compare=False, repr=False)
    # Given a count per column, each row's sum of them over its stored entries (snapshot.py's
    # ``row_reach``): with another matrix's entries per row, the products each row forms in a
    # product with it (``product_reach``); None where the snapshot offers none.
    row_reach: Callable | None = field(default=None, compare=False, repr=False)
    # An earlier operation's output that its kernel returns as CSR tiles (``made_stats``):
    # ``nnz`` and ``nbytes`` are the optimizer's estimate, not the catalog's.
    made: bool = False

    @property
    def sparse(self) -> bool:
        return any(f != "dense" for f in self.formats)

    @property
    def format(self) -> str:
        """One format, or several joined by '+' (a tensor with dense and sparse tiles)."""
        return "+".join(self.formats) if self.formats else "dense"


def read_sparse(op: EinOp, kern: tuple, st: dict) -> set[int]:
    """The operands a sparse kernel holds as their entries (its call's working set counts them
    at their payload's share of the dense bytes; any other operand is densified): the sparse
    operand; for ``spmm``, the other one too where it is a sparse stored matrix (SpGEMM);
    for ``masked``, every sparse stored one (each arrives as CSR and stays so); for
    ``semiring``, every sparse stored one whose fill is the sparse operand's."""
    method, k = kern[0], kern[1]
    if method in ("masked", "spjoin"):
        return set(st)
    if method == "spmm":  # SpGEMM: a sparse matrix partner arrives as CSR and stays so (two
        # sparse tensors of rank 3 or more: both as their entries, exec/sparse_nd_join.py)
        nd = len(op.inputs[k].labels) > 2
        return {k} | {n for n in st if len(op.inputs[n].labels) == 2 or
                      (nd and len(op.inputs[n].labels) > 2)}
    if method == "semiring":
        return {n for n in st if st[n].fill == st[k].fill}
    return {k}


def sparse_flops(op: EinOp, kern: tuple, nnz: int, other: int | None = None) -> int:
    """The flops of a sparse kernel on a sparse operand of ``nnz`` stored entries: a multiply
    and an add per entry and column of the other operand (spmm, semiring), or, where the other
    is a stored sparse matrix of ``other`` entries (SpGEMM), per entry and the entries of a row
    of it, ``other / J`` spread evenly; one add per entry
    (spreduce); per entry of the mask, a dot product of the third label's extent (sddmm) or
    of the mask's density times it (masked: the entries of a row of A @ B that meet the mask).

    >>> op = EinOp.contraction("C", "ik", [("S", "ij"), ("X", "jk")], {"i": 9, "j": 9, "k": 4})
    >>> sparse_flops(op, ("spmm", 0), 10)
    80
    """
    method, k = kern
    if method in ("masked", "sddmm"):
        m = op.inputs[k].labels
        (c,) = [l for l in op.labels if l not in m]
        n_m = math.prod(op.size[l] for l in m)
        share = 1.0 if method == "sddmm" else min(1.0, nnz / n_m) if n_m else 0.0
        return int(2 * nnz * max(1.0, op.size[c] * share))
    if method not in ("spmm", "semiring"):
        return nnz
    s, d = op.inputs[k].labels, op.inputs[1 - k].labels
    cols = math.prod(op.size[l] for l in d if l not in s)
    if other is not None and len(d) == 2:  # SpGEMM: an entry S[i,j] meets row j's entries
        shared = math.prod(op.size[l] for l in s if l in d)
        cols = min(cols, other / shared) if shared else 0
    return int(2 * nnz * cols)


def product_reach(op: EinOp, kern: tuple, stats: dict):
    """For a product of two stored sparse matrices ``A[i,j] * B[j,k]`` summed over ``j`` (an
    ``spmm`` or ``semiring`` kernel; ``stats``: input position -> StoredStats), the number of
    products each row ``i`` of A forms, ``f_i = sum over A's entries (i,j) of B's entries in
    row j`` (A's pattern times B's row counts, from the catalog's CSR tiles), and the extent of
    ``k``; None where the operation is another shape or either profile is missing."""
    if kern is None or kern[0] not in ("spmm", "semiring") or len(op.inputs) != 2 \
            or len(stats) != 2:
        return None
    a, b = op.inputs
    if len(a.labels) != 2 or len(b.labels) != 2 or a.labels[1] != b.labels[0] or \
            len(set(a.labels + b.labels)) != 3 or set(op.out_labels) != {a.labels[0], b.labels[1]}:
        return None
    if stats[0].row_reach is None or stats[1].row_profile is None:
        return None
    counts = np.diff(stats[1].row_profile())
    if len(counts) != op.size[a.labels[1]]:
        return None
    reach = stats[0].row_reach(counts)
    return None if reach is None else (reach, op.size[b.labels[1]])


def reach_nnz(reach: np.ndarray, width: int) -> float:
    """The estimated nonzeros of a product whose row ``i`` forms ``reach[i]`` products over
    ``width`` columns, each landing in a column drawn evenly and independently:
    ``sum_i width * (1 - (1 - 1/width)**reach[i])``. It never passes the products, ``sum_i
    reach[i]`` (an upper bound, exact where no two products of a row meet: an outer product),
    nor ``width`` a row (the dense size). A power-law graph's products gather on its hub
    columns, so it errs high (R-MAT: 1.3-1.5x; docs/benchmarks.md).

    >>> reach_nnz(np.array([1.0, 0.0, 3.0]), 1000)   # 4 products: 4 entries, about
    3.997
    >>> reach_nnz(np.array([5000.0]), 10)             # at most the row's 10 columns
    10.0
    """
    if width <= 0:
        return 0.0
    reach = np.asarray(reach, np.float64)
    per = -np.expm1(reach * np.log1p(-1.0 / width)) if width > 1 else (reach > 0) * 1.0
    return round(float(width * per.sum()), 3)


def sparse_out_nnz(op: EinOp, kern: tuple, nnz: int, other: int | None,
                   reach=None) -> float:
    """The estimated nonzeros of a sparse kernel's output, taking the stored entries of each
    operand as independent and uniformly spread (an earlier result, ``other`` None, as full):
    for ``spmm`` (and a ``semiring`` product, whose output entry exists where a pair does)
    of ``S[i,j]`` (density ``ps``) and ``D[j,r]`` (density ``pd``), an output element is
    nonzero when one of its ``J`` products is, ``I*R*(1 - (1 - ps*pd)**J)``; for
    ``spreduce`` over ``j``, ``I*(1 - (1 - ps)**J)``. Cancellation (a sum of products that is 0)
    is not foreseen, so it errs high; EXPLAIN ANALYZE shows it beside the measured nnz. Where
    both operands are stored sparse matrices whose rows the catalog profiles (``reach``: the
    ``product_reach`` of the operation), the estimate is ``reach_nnz`` instead: the
    independent uniform one assumes every row and column alike and was 4-18x low on power-law
    graphs, whose hub rows meet hub columns.

    >>> op = EinOp.contraction("C", "ik", [("S", "ij"), ("X", "jk")], {"i": 10, "j": 10, "k": 3})
    >>> round(sparse_out_nnz(op, ("spmm", 0), 10, None), 2)   # a tenth of S times a full X
    19.54
    """
    method, k = kern
    s = op.inputs[k].labels
    n_s = math.prod(op.size[l] for l in s)
    ps = min(1.0, nnz / n_s) if n_s else 0.0
    out = math.prod(op.size[l] for l in op.out_labels)
    if method == "masked":
        return 1.0
    if method == "sddmm":  # at most the mask's entries
        return float(nnz)
    if method == "spjoin" and other is not None:
        a, b = op.inputs
        if a.tensor == b.tensor and a.labels == b.labels:  # E * E, E + E: E's own entries
            return float(min(out, nnz))
        # a product keeps the intersection (at most the smaller), a sum the union (at most both)
        return float(min(nnz, other) if op.join.fn == "*" else min(out, nnz + other))
    if method not in ("spmm", "semiring"):
        along = math.prod(op.size[l] for l in s if l not in op.out_labels)
        return out * (1.0 - (1.0 - ps) ** along)
    if reach is not None:
        return min(float(out), reach_nnz(*reach))
    d = op.inputs[1 - k].labels
    n_d = math.prod(op.size[l] for l in d)
    pd = 1.0 if other is None or not n_d else min(1.0, other / n_d)
    shared = math.prod(op.size[l] for l in s if l in d and l not in op.out_labels)
    reached = math.prod(op.size[l] for l in d if l not in s)  # the elements one entry reaches
    # a kept shared label (a batch) is not summed: each entry of S meets its own batch only,
    # and reaches at most ``reached`` output elements (an upper bound, whatever the spread)
    return min(out * (1.0 - (1.0 - ps * pd) ** shared), float(nnz) * reached)


def spmm_rows(kern: tuple | None, positions) -> tuple[int | None, tuple[int, ...]]:
    """For an ``spmm`` kernel ``kern`` (method, sparse operand): its dense operand and the
    label positions of the sparse matrix that the dense operand lacks (its rows), given each
    operand's label ``positions``; else (None, ()). Every row slab of the sparse matrix gathers
    from the same box of the dense operand (a view, not a copy per slab), so the cost model
    counts that box once across the row pieces: splitting the rows re-reads only the sparse
    slabs, while splitting the dense operand's columns re-reads the whole sparse matrix per
    column piece (and copies a strided box).

    >>> spmm_rows(("spmm", 0), [(0, 2), (2, 1)])
    (1, (0,))
    """
    if kern is None or kern[0] != "spmm":
        return None, ()
    s, dense = kern[1], 1 - kern[1]
    return dense, tuple(p for p in positions[s] if p not in positions[dense])


def made_stats(op: EinOp, choice, out_nnz: float, stats=None) -> StoredStats | None:
    """What the later operations of a statement group know of ``op``'s output where its kernel
    returns it as CSR tiles (``choice.out_format``, plan.kernel.with_output, from its estimated
    nonzeros ``out_nnz``): a sparse input, priced by those nonzeros and their CSR bytes, as a
    stored sparse matrix is (docs/explain.md, "Sparse intermediates"); None where it is dense.
    Its fill: a semiring product keeps its sparse operand's (min-plus: +inf; ``stats``: what
    is known of the operands), every other kernel's output is 0 where absent.

    >>> from tensordb.plan.kernel import KernelChoice, with_output
    >>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 1000, "j": 1000,
    ...                        "k": 1000})
    >>> st = made_stats(op, with_output(KernelChoice("spmm", sparse=0), op, 5000), 5000)
    >>> st.formats, st.nnz, st.made
    (('csr',), 5000, True)
    """
    from ..sparsity import sparse_nbytes
    if choice is None or choice.out_format == "dense" or (len(op.out_labels) != 2
                                                         and choice.out_format != "coo"):
        return None  # (a join of rank 3 or more returns COO tiles: sparse too)
    nnz = int(math.ceil(out_nnz))
    fill = 0.0
    if choice.method == "semiring":
        src = (stats or {}).get(op.inputs[choice.sparse].tensor)
        fill = src.fill if src is not None else 0.0
    return StoredStats((choice.out_format,), nnz,
                       sparse_nbytes(op.out_shape, nnz, op.dtype, choice.out_format), fill,
                       made=True)
