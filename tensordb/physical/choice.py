"""The kernel choice: how each operation's tile kernel computes, decided when the plan is lowered.

The executor's kernels (exec/kernels.py) read a ``KernelChoice`` and decide nothing; EXPLAIN
prints it (the ``kernel`` column). The methods:

- ``matmul``: a two-operand product-and-sum that one batched matmul computes in the output's C
  order (``MatmulLayout``: operand order, the transposes, and the label groups batch, free of the
  first operand, contracted, free of the second);
- ``contract``: another product-and-sum, by opt_einsum's contract (BLAS where it can);
- ``spmm``: a two-operand product-and-sum whose operand ``sparse`` is a matrix stored with sparse
  tiles and whose other operand is known to hold no NaN or inf: scipy.sparse's product
  (exec/sparse_kernels.py), the output dense;
- ``spreduce``: a SUM, MAX or MIN of a matrix stored with sparse tiles, over one or both of its
  labels, with no function applied (``sparse_reduction``): scipy.sparse's reduction over the
  stored entries, absent ones counting as the zeros they are;
- ``broadcast``: any other join, evaluated with broadcasting NumPy in chunks of at most
  ``chunk_elements`` elements of the join space: along the aggregated label ``chunk`` (the
  largest one in the operation's tiles), or, for a join with nothing to aggregate, in slabs of the
  first axis (``chunk == "rows"``) when a tile is larger than that. ``chunk_elements`` is sized
  from the worker's memory budget (``plan.memory.chunk_elements``: the chunk's temporaries stay
  within a quarter of it), at most ``CHUNK_ELEMENTS``.

BLAS computes the product in the result dtype and applies the constant after it (``scale``;
``scale_first``: the operand a leading constant is applied to first, as NumPy does): that is
NumPy's answer only when NumPy computes every product of the join in that dtype, so only then is
the method ``matmul`` or ``contract``.

>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 4, "j": 3, "k": 2})
>>> choose_kernel(op).describe()
'matmul x0@x1'
>>> from tensordb.plan.scalar import parse_join
>>> mp = EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], {"i": 4, "j": 3, "k": 2},
...                        join=parse_join("x0 + x1"), agg="min")
>>> choose_kernel(mp).describe()
'broadcast by j'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import InternalError
from ..plan import scalar, sparse_rules
from ..plan.aggregates import ARG_AGGS
from ..plan.ir import EinOp
from ..plan.memory import (CHUNK_ELEMENTS, MatmulLayout, blas_product, chunk_elements, matmul_layout,
                           sparse_kernel, sparse_reduction, spmm_operand)

__all__ = ["CHUNK_ELEMENTS", "METHODS", "MatmulLayout", "KernelChoice", "choose_kernel",
           "spmm_operand", "sparse_reduction"]

METHODS = ("matmul", "contract", "broadcast", "spmm", "spreduce") + sparse_rules.METHODS
SPARSE_METHODS = ("spmm", "spreduce") + sparse_rules.METHODS  # exec/sparse_kernels.py


@dataclass(frozen=True)
class KernelChoice:
    """How one operation's kernel computes (see the module docstring)."""

    method: str
    scale: object = 1                   # the join's constant (BLAS methods)
    scale_first: int | None = None      # the operand a leading constant is applied to first
    layout: MatmulLayout | None = None  # method 'matmul' only
    chunk: str | None = None            # method 'broadcast': an aggregated label, or 'rows'
    chunk_elements: int = CHUNK_ELEMENTS
    sparse: int | None = None           # method 'spmm': the operand stored sparse (a matrix)
    index: str | None = None            # 'argmax' / 'argmin': the whole label in one call
    semiring: str | None = None         # method 'semiring': 'min_plus', 'max_times', ...

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InternalError(f"unknown kernel method '{self.method}' (methods: {', '.join(METHODS)})")
        if (self.layout is not None) != (self.method == "matmul"):
            raise InternalError("a matmul layout goes with method 'matmul' and only with it")
        if (self.chunk is not None) != (self.method == "broadcast"):
            raise InternalError("chunking goes with method 'broadcast' and only with it")
        if self.chunk_elements < 1:
            raise InternalError(f"chunks of {self.chunk_elements} elements")
        if (self.sparse is not None) != (self.method in SPARSE_METHODS):
            raise InternalError("a sparse operand goes with the sparse methods and only with them")

    def describe(self) -> str:
        """``matmul x0@x1`` (``x1@x0``: the operands swapped), ``contract``, ``broadcast by j``
        (chunks along aggregated label j) or ``broadcast by rows``; ``, chunks of N`` follows
        when the worker's memory budget made chunks smaller than ``CHUNK_ELEMENTS``."""
        if self.layout is not None:
            return f"matmul x{self.layout.first}@x{self.layout.second}"
        if self.method == "semiring":
            return f"semiring {self.semiring} x{self.sparse} sparse (GraphBLAS)"
        if self.method == "spjoin":
            return "spjoin x0 x1 sparse"
        if self.method in SPARSE_METHODS:
            return f"{self.method} x{self.sparse} sparse"
        if self.method != "broadcast":
            return self.method
        if self.index is not None:
            return f"{self.index} over {self.chunk} (one piece)"
        # The chunk is shown when the memory budget made it smaller than the default.
        small = f", chunks of {self.chunk_elements}" if self.chunk_elements < CHUNK_ELEMENTS else ""
        return f"broadcast by {self.chunk}{small}"

    def summary(self) -> dict:
        """The choice as plain data (EXPLAIN's JSON form)."""
        out: dict = {"method": self.method, "text": self.describe()}
        if self.layout is not None:
            lay = self.layout
            out["layout"] = {"operands": [lay.first, lay.second], "batch": list(lay.batch),
                             "m": list(lay.free_first), "k": list(lay.contracted),
                             "n": list(lay.free_second)}
        if self.method in SPARSE_METHODS:
            out["sparse_operand"] = self.sparse
        if self.semiring is not None:
            out["semiring"] = self.semiring
        if self.method == "broadcast":
            out["chunk"] = self.chunk
            out["chunk_elements"] = self.chunk_elements
            if self.index is not None:
                out["index"] = self.index
        elif self.scale != 1:
            out["scale"] = self.scale if isinstance(self.scale, (int, float)) else float(self.scale)
        return out


def choose_kernel(op: EinOp, extents: Mapping[str, int] | None = None,
                  budget: int | None = None, sparse: Sequence[int] = (),
                  finite: Sequence[bool] = (), fills: Sequence[float] = ()) -> KernelChoice:
    """The kernel for ``op`` whose tiles have (at most) ``extents`` per label (default: the whole
    operation, one tile), on a worker with ``budget`` bytes (None: no limit): a broadcasting
    kernel's chunks are sized from it (``plan.memory.chunk_elements``). A diagonal write
    computes each output label once, then places the values: its choice is that one's.
    ``sparse``: the operands stored with sparse tiles (matrices); ``finite``: per operand,
    whether it is known to hold no NaN or inf. A product-and-sum of a sparse matrix with an
    operand known finite is a sparse kernel (``spmm``, exec/sparse_kernels.py): absent entries
    are skipped, which is NumPy's answer only where the partner holds no NaN or inf
    (0 * inf is NaN). ``fills``: per operand, its fill value (0 when left out): a semiring,
    masked or sampled kernel (plan/sparse_rules.py, exec/semiring.py) where one fits."""
    # -- sparse kernels (scipy.sparse, GraphBLAS): exec/sparse_kernels.py, exec/semiring.py --
    special = sparse_rules.choose(op, sparse, finite, fills)
    if special is not None:
        return KernelChoice(special[0], sparse=special[1],
                            semiring=special[2] if len(special) > 2 else None)
    found = sparse_kernel(op, tuple(k for k in sparse if not fills or fills[k] == 0), finite)
    if found is not None:
        return KernelChoice(found[0], sparse=found[1])
    op = op.without_diagonal()
    prod = blas_product(op)
    if prod is not None:
        scale = prod[0]
        # NumPy applies a leading literal (c * x0 * x1) to x0 before any product, and the
        # kernel does the same, so overflow to inf and the NaN of 0 * inf happen where NumPy's
        # happen. A trailing one ((x0 * x1) * c) multiplies each product in NumPy and the sum
        # here: where that sum is not finite the kernel computes the join as NumPy does.
        first = prod[1][0] if prod[2] and scale != 1 else None
        layout = matmul_layout(op)
        return KernelChoice("matmul" if layout else "contract", scale, first, layout)
    ext = extents or op.size
    if op.agg in ARG_AGGS:  # evaluated whole: the index needs every element of the label
        return KernelChoice("broadcast", chunk=op.agg_labels[0], index=op.agg)
    # Chunk along the largest aggregated label (the first of equals), so one chunk stays near
    # chunk_elements; a join with nothing to aggregate is cut in slabs of its first axis.
    chunk = max(op.agg_labels, key=lambda l: ext[l]) if op.agg_labels else "rows"
    return KernelChoice("broadcast", chunk=chunk, chunk_elements=chunk_elements(budget, op))
