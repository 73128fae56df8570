"""The kernel choice: how each operation's tile kernel computes, decided when the plan is lowered.

The executor's kernels (exec/kernels.py) read a ``KernelChoice`` and decide nothing; EXPLAIN
prints it (the ``kernel`` column). Three methods:

- ``matmul``: a two-operand product-and-sum that one batched matmul computes in the output's C
  order (``MatmulLayout``: operand order, the transposes, and the label groups batch, free of the
  first operand, contracted, free of the second);
- ``contract``: another product-and-sum, by opt_einsum's contract (BLAS where it can);
- ``broadcast``: any other join, evaluated with broadcasting NumPy in chunks of at most
  ``chunk_elements`` elements of the join space: along the aggregated label ``chunk`` (the
  largest one in the operation's tiles), or, for a join with nothing to aggregate, in slabs of the
  first axis (``chunk == "rows"``) when a tile is larger than that.

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
from typing import Mapping

from ..errors import InternalError
from ..plan import scalar
from ..plan.ir import EinOp

__all__ = ["CHUNK_ELEMENTS", "METHODS", "MatmulLayout", "KernelChoice", "choose_kernel"]

CHUNK_ELEMENTS = 1 << 22  # the most join-space elements a broadcasting kernel materialises at once
METHODS = ("matmul", "contract", "broadcast")


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


@dataclass(frozen=True)
class KernelChoice:
    """How one operation's kernel computes (see the module docstring)."""

    method: str
    scale: object = 1                   # the join's constant (BLAS methods)
    scale_first: int | None = None      # the operand a leading constant is applied to first
    layout: MatmulLayout | None = None  # method 'matmul' only
    chunk: str | None = None            # method 'broadcast': an aggregated label, or 'rows'
    chunk_elements: int = CHUNK_ELEMENTS

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InternalError(f"unknown kernel method '{self.method}' (methods: {', '.join(METHODS)})")
        if (self.layout is not None) != (self.method == "matmul"):
            raise InternalError("a matmul layout goes with method 'matmul' and only with it")
        if (self.chunk is not None) != (self.method == "broadcast"):
            raise InternalError("chunking goes with method 'broadcast' and only with it")
        if self.chunk_elements < 1:
            raise InternalError(f"chunks of {self.chunk_elements} elements")

    def describe(self) -> str:
        """``matmul x0@x1`` (``x1@x0``: the operands swapped), ``contract``, ``broadcast by j``
        (chunks along aggregated label j) or ``broadcast by rows``."""
        if self.layout is not None:
            return f"matmul x{self.layout.first}@x{self.layout.second}"
        return f"broadcast by {self.chunk}" if self.method == "broadcast" else self.method

    def summary(self) -> dict:
        """The choice as plain data (EXPLAIN's JSON form)."""
        out: dict = {"method": self.method, "text": self.describe()}
        if self.layout is not None:
            lay = self.layout
            out["layout"] = {"operands": [lay.first, lay.second], "batch": list(lay.batch),
                             "m": list(lay.free_first), "k": list(lay.contracted),
                             "n": list(lay.free_second)}
        if self.method == "broadcast":
            out["chunk"] = self.chunk
            out["chunk_elements"] = self.chunk_elements
        elif self.scale != 1:
            out["scale"] = self.scale if isinstance(self.scale, (int, float)) else float(self.scale)
        return out


def choose_kernel(op: EinOp, extents: Mapping[str, int] | None = None,
                  chunk_elements: int | None = None) -> KernelChoice:
    """The kernel for ``op`` whose tiles have (at most) ``extents`` per label (default: the whole
    operation, one tile)."""
    in_dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
    prod = scalar.product_of(op.join)
    blas = (op.agg in ("sum", None) and prod is not None
            and sorted(prod[1]) == list(range(len(op.inputs)))
            and scalar.uniform_dtype(op.join, in_dtypes, op.dtype))
    if blas:
        scale = prod[0]
        # NumPy applies a leading literal (c * x0 * x1) to x0 before any product, and a trailing
        # one ((x0 * x1) * c) to the product: the kernel does the same, so overflow to inf and
        # the NaN of 0 * inf happen where NumPy's happen.
        first = prod[1][0] if prod[2] and scale != 1 else None
        layout = _matmul_layout(op)
        return KernelChoice("matmul" if layout else "contract", scale, first, layout)
    ext = extents or op.size
    # Chunk along the largest aggregated label (the first of equals), so one chunk stays near
    # chunk_elements; a join with nothing to aggregate is cut in slabs of its first axis.
    chunk = max(op.agg_labels, key=lambda l: ext[l]) if op.agg_labels else "rows"
    return KernelChoice("broadcast", chunk=chunk,
                        chunk_elements=CHUNK_ELEMENTS if chunk_elements is None else chunk_elements)


def _matmul_layout(op: EinOp) -> MatmulLayout | None:
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
