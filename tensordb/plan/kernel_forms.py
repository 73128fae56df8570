"""The forms of an operation that a BLAS or sparse kernel computes as NumPy would (split off
plan/kernel.py, which decides with them): ``blas_product`` (a sum of products in one dtype),
``matmul_layout`` (one batched matmul in the output's C order), and the sparse kernels' rules
beside plan/sparse_rules.py: ``sparse_kernel`` (``spmm``, ``spreduce``), ``spmm_operand`` (a
sparse matrix), ``spmm_nd_operand`` (a sparse tensor of rank 3 or more, on its entries:
exec/sparse_nd.py, exec/sparse_nd_join.py), ``sparse_reduction``, ``spgemm_graphblas``.

>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 4, "j": 3, "k": 2})
>>> matmul_layout(op).contracted
('j',)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import InternalError
from ..geometry import OneHotName
from . import scalar, sparse_rules
from .ir import EinOp

__all__ = ["MatmulLayout", "blas_product", "matmul_layout", "sparse_kernel", "spmm_operand",
           "spmm_nd_operand", "sparse_reduction", "spgemm_graphblas", "merges"]


# -- BLAS and sparse kernels: when they give NumPy's answer ---------------------------------------

@dataclass(frozen=True)
class MatmulLayout:
    """``matmul(X(b, m, k), Y(b, k, n))`` with X = operand ``first`` transposed by ``perm_first``
    and Y = operand ``second`` by ``perm_second``; the groups name the labels of b, m, k and n."""

    first: int
    second: int
    perm_first: tuple[int, ...]
    perm_second: tuple[int, ...]
    batch: tuple[str, ...]
    free_first: tuple[str, ...]
    contracted: tuple[str, ...]
    free_second: tuple[str, ...]

    def __post_init__(self) -> None:
        if {self.first, self.second} != {0, 1}:
            raise InternalError(f"a matmul layout takes operands 0 and 1, not {self.first}, {self.second}")
        n_first = len(self.batch + self.free_first + self.contracted)
        n_second = len(self.batch + self.contracted + self.free_second)
        if sorted(self.perm_first) != list(range(n_first)) or \
                sorted(self.perm_second) != list(range(n_second)):
            raise InternalError(f"matmul permutations {self.perm_first}, {self.perm_second} do not "
                                "match the label groups")


def blas_product(op: EinOp):
    """``scalar.product_of(op.join)`` when BLAS computes ``op`` as NumPy would (a sum of products
    of every input, each once, in one dtype), else None."""
    in_dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
    prod = scalar.product_of(op.join)
    if (op.agg in ("sum", None) and prod is not None
            and sorted(prod[1]) == list(range(len(op.inputs)))
            and scalar.uniform_dtype(op.join, in_dtypes, op.dtype)):
        return prod
    return None


def matmul_layout(op: EinOp) -> MatmulLayout | None:
    """How to run a two-operand product as one batched matmul that yields the output in C order.

    Labels are batch (both operands and the output), contracted (both, not the output) or free
    (one operand and the output). When the output reads batch + free(first) + free(second), for
    one order of the operands, the product is ``matmul(A(b,m,k), B(b,k,n))`` with no transpose of
    the result. None when there is no such order.
    """
    if len(op.inputs) != 2:
        return None
    a, b = (o.labels for o in op.inputs)
    if not a or not b or len(set(a)) != len(a) or len(set(b)) != len(b):
        return None  # a scalar operand or a diagonal: the general path handles those
    if any(l not in b and l not in op.out_labels for l in a) or \
            any(l not in a and l not in op.out_labels for l in b):
        return None  # a label summed inside one operand
    out = op.out_labels
    batch = [l for l in out if l in a and l in b]
    contracted = [l for l in a if l in b and l not in out]
    if list(out[:len(batch)]) != batch:
        return None
    rest = list(out[len(batch):])
    if batch and rest and not contracted:
        # a batch of outer products (``g[n] * G[n,f]``, GRAD's rows of a gather): matmul makes
        # one tiny BLAS call per batch element, numpy's broadcasting multiply (``contract``)
        # one pass, five to ten times faster at 500,000 rows
        return None
    for first, second, x, y in ((0, 1, a, b), (1, 0, b, a)):
        free_x = [l for l in rest if l in x]
        free_y = [l for l in rest if l in y]
        if rest != free_x + free_y:
            continue
        perm_x = tuple(x.index(l) for l in batch + free_x + contracted)
        perm_y = tuple(y.index(l) for l in batch + contracted + free_y)
        return MatmulLayout(first, second, perm_x, perm_y, tuple(batch), tuple(free_x),
                            tuple(contracted), tuple(free_y))
    return None


def sparse_kernel(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> tuple[str, int] | None:
    """The sparse kernel ``op`` runs as, (method, the sparse operand), or None: ``spmm`` or
    ``spreduce`` (physical/choice.py). ``sparse``: the operands stored as matrices with sparse
    tiles; ``finite``: per operand, whether it is known to hold no NaN or inf. The lowering
    chooses the kernel with it, and the optimizer prices the same kernel (optimizer/cost.py)."""
    if not sparse or op.writes_diagonal:
        return None
    # a sparse operand of rank 3 or more first: taking its matrix partner as the sparse one
    # would densify it (``R[a,b,k] = SUM(T[a,b,c] * U[c,k])`` of a 10^5-cubed T, both sparse)
    k = spmm_nd_operand(op, sparse, finite)
    if k is None:
        k = spmm_operand(op, sparse, finite)
    if k is not None:
        return "spmm", k
    if sparse_reduction(op, sparse):
        return "spreduce", 0
    return None


def spmm_operand(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> int | None:
    """The operand a sparse kernel takes as its sparse matrix, or None: ``op`` is a SUM of the
    product of two operands (no constant, one dtype that is not bool), the sparse one a matrix
    with one label contracted with the other operand and one kept in the output, the other
    operand known finite, with distinct labels, all kept but the contracted one. The one-hot
    rows of an index (``geometry.OneHotName``: GRAD's scatter-add of a gather) take any
    partner: skipping their absent entries is the scatter-add itself (numpy's ``np.add.at``,
    which adds a NaN or inf only to the rows the index names). GRAD's scatter-add of a row-scaled
    gradient, ``SUM_n X[n,f] * H[n,r] * g[n]`` (X, the one-hot H, then g, in that order), is the
    one three-operand form: H's entries are scaled by g, then multiplied by X."""
    prod = blas_product(op)
    if prod is None or op.agg != "sum" or len(op.inputs) not in (2, 3) or prod[0] != 1 or \
            np.dtype(op.dtype).kind not in "iuf" or len(finite) != len(op.inputs):
        return None
    for k in sparse:
        if len(op.inputs) == 3 and (k != 1 or not isinstance(op.inputs[1].tensor, OneHotName)):
            continue  # three operands: only GRAD's scaled scatter-add (plan/grad.py), in order
        s, d = op.inputs[k].labels, op.inputs[1 - k].labels
        if not (finite[1 - k] or isinstance(op.inputs[k].tensor, OneHotName)) or len(s) != 2 \
                or len(set(s)) != 2 or len(set(d)) != len(d):
            continue
        if len(op.inputs) == 3 and not (len(op.inputs[2].labels) == 1 and
                                        op.inputs[2].labels[0] in s and
                                        op.inputs[2].labels[0] in d):
            continue  # the third operand: a vector on the contracted label (scales S's entries)
        shared = [l for l in s if l in d]
        if len(shared) != 1 or shared[0] in op.out_labels:
            continue
        kept = [l for l in s if l != shared[0]]
        if kept[0] not in op.out_labels or any(
                l != shared[0] and l not in op.out_labels for l in d):
            continue
        return k
    return None


def spmm_nd_operand(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> int | None:
    """The sparse operand of rank 3 or more of a ``SUM`` of the product of two operands (no
    constant, one numeric dtype) that an ``spmm`` kernel computes on its entries
    (exec/sparse_nd.py ``contract_nd``), or None: the other operand known finite, each operand's
    labels distinct, the labels they share summed or kept (a kept one, a batch label, is in the
    rows and the columns both: each entry meets only its own batch of the other operand), every
    other label of the other operand kept. Where the other operand is a stored sparse tensor
    too (a matrix, or of rank 3 or more: a SpGEMM on the entries), both must be known finite (a
    NaN times an absent 0 is NumPy's NaN)."""
    prod = blas_product(op)
    if prod is None or op.agg != "sum" or len(op.inputs) != 2 or prod[0] != 1 or \
            np.dtype(op.dtype).kind not in "iuf" or len(finite) != 2:
        return None
    for k in sparse:
        s, d = op.inputs[k].labels, op.inputs[1 - k].labels
        if len(s) < 3 or len(set(s)) != len(s) or len(set(d)) != len(d) or not finite[1 - k] \
                or isinstance(op.inputs[k].tensor, OneHotName):
            continue
        shared = [l for l in s if l in d]
        if (1 - k) in sparse and not finite[k]:  # SpGEMM on the entries: both finite
            continue
        if shared and all(l in s or l in op.out_labels for l in d):
            return k
    return None


def sparse_reduction(op: EinOp, sparse: Sequence[int]) -> bool:
    """Whether ``op`` is ``AGG(S[i,j])`` over ``j``, ``i`` or both, for a stored sparse matrix
    ``S`` (or a sparse tensor of higher rank over any of its labels, exec/sparse_nd.py) read as it is (no function, no constant, no cast) and AGG SUM, MAX or MIN: a
    reduction of the stored entries that counts absent ones as zeros is then NumPy's answer."""
    if list(sparse) != [0] or len(op.inputs) != 1 or op.agg not in ("sum", "max", "min"):
        return False
    labels = op.inputs[0].labels
    prod = scalar.product_of(op.join)
    in_dtype = (op.in_dtypes or (op.dtype,))[0]
    return (len(labels) >= 2 and len(set(labels)) == len(labels)
            and len(op.out_labels) < len(labels) and len(set(op.out_labels)) == len(op.out_labels)
            and set(op.out_labels) <= set(labels) and prod is not None and prod[0] == 1
            and tuple(prod[1]) == (0,) and np.dtype(in_dtype) == np.dtype(op.dtype))


def spgemm_graphblas(op: EinOp, sparse: Sequence[int]) -> bool:
    """Whether an ``spmm`` of ``op`` is a SpGEMM that GraphBLAS computes where its output
    tiles are CSR (``with_output``): both operands stored sparse matrices, a numeric dtype,
    python-graphblas installed. Its ``plus_times`` ``mxm`` (threaded) is then the product
    (exec/semiring.py ``plus_times_csr``): scipy's, single-threaded, was 1.5-2.3x its time on
    R-MAT graphs; else scipy's (exec/sparse_out.py ``sorted_product``)."""
    return (len(op.inputs) == 2 and {0, 1} <= set(sparse)
            and all(len(o.labels) == 2 for o in op.inputs)
            and np.dtype(op.dtype).kind in "iuf" and sparse_rules.have_graphblas())


def merges(perm: tuple[int, ...], cuts: tuple[int, int]) -> bool:
    """Whether an operand whose axes ``perm`` lays out as three groups (the first two of
    ``cuts`` axes) reshapes to 3-d as a view: each group's axes are adjacent and in order (a
    transposed matrix is a view too; BLAS reads it transposed, nothing is copied).

    >>> merges((1, 0), (0, 1)), merges((0, 1, 2), (0, 2)), merges((0, 2, 1), (0, 2))
    (True, True, False)
    """
    a, b = cuts
    return all(list(g) == list(range(g[0], g[0] + len(g)))
               for g in (perm[:a], perm[a:a + b], perm[a + b:]) if g)
