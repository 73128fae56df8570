"""The kernel choice: how each operation's tile kernel computes, decided once, when the plan is
lowered, and priced by the optimizer with the same function (``choose_kernel``).

The forms that a BLAS or sparse kernel computes as NumPy would (``blas_product``,
``matmul_layout``, ``sparse_kernel`` ...) are in plan/kernel_forms.py, re-exported here.
The executor's kernels (exec/kernels.py) read a ``KernelChoice`` and decide nothing; EXPLAIN
prints it (the ``kernel`` column); the memory model (plan/memory.py) reads its temporaries off it.
The methods:

- ``matmul``: a two-operand product-and-sum that one batched matmul computes in the output's C
  order (``MatmulLayout``: operand order, the transposes, and the label groups batch, free of the
  first operand, contracted, free of the second); ``copies``: the operands it casts, transposes
  or scales first;
- ``contract``: another product-and-sum, by opt_einsum's contract (BLAS where it can);
- ``spmm``: a two-operand product-and-sum whose operand ``sparse`` is a matrix stored with sparse
  tiles (or a sparse tensor of rank 3 or more, matricized: ``spmm_nd_operand``) and whose other
  operand is known to hold no NaN or inf: scipy.sparse's product
  (exec/sparse_kernels.py), the output dense, or CSR tiles where its estimated nonzeros make
  it sparse (``with_output``, as for the semiring, sampled and join kernels of
  plan/sparse_rules.py);
- ``spreduce``: a SUM, MAX or MIN of a matrix stored with sparse tiles, over one or both of its
  labels, with no function applied (``sparse_reduction``): scipy.sparse's reduction over the
  stored entries, absent ones counting as the zeros they are;
- ``broadcast``: any other join, evaluated with broadcasting NumPy in chunks of at most
  ``chunk_elements`` elements of the join space: along the aggregated label ``chunk`` (the
  largest one in the operation's tiles), or, for a join with nothing to aggregate, in slabs of the
  first axis (``chunk == "rows"``) when a tile is larger than that. ``chunk_elements`` is sized
  from the worker's memory budget (``chunk_elements``: the chunk's temporaries, ``element_bytes``
  per element, stay within a quarter of it), at most ``CHUNK_ELEMENTS``.

BLAS computes the product in the result dtype and applies the constant after it (``scale``;
``scale_first``: the operand a leading constant is applied to first, as NumPy does): that is
NumPy's answer only when NumPy computes every product of the join in that dtype, so only then is
the method ``matmul`` or ``contract``. Where NumPy's answer may still differ next to a NaN or an
inf, the choice carries its variant for that case (``fallback``, a chunked ``broadcast``) and
what the kernel tests before taking it (``fallback_on``): ``inputs`` (opt_einsum sums a label
that one operand alone has before multiplying: not NumPy's answer next to an inf; left out where
the catalog's facts say every operand is finite) or ``result`` (a trailing constant times a sum
that is not finite). The test is on the data; the variant and its chunks are the plan's.

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

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from ..errors import InternalError
from ..sparsity import choose_format, sparse_nbytes
from . import scalar, sparse_rules
from .aggregates import ARG_AGGS
from .ir import EinOp
from .kernel_forms import (MatmulLayout, blas_product, matmul_layout, merges, sparse_kernel,  # noqa: F401
                           sparse_reduction, spgemm_graphblas, spmm_nd_operand, spmm_operand)

__all__ = ["CHUNK_ELEMENTS", "TEMPORARY_SHARE", "METHODS", "MatmulLayout", "KernelChoice",
           "choose_kernel", "chunk_label", "chunk_elements", "element_bytes", "live_arrays", "blas_product",
           "matmul_layout", "sparse_kernel", "spmm_operand", "spgemm_graphblas", "sparse_reduction", "SPARSE_METHODS",
           "SPARSE_OUTPUT_METHODS", "with_output", "output_tile_bytes"]

CHUNK_ELEMENTS = 1 << 22  # the most join-space elements a broadcasting kernel materialises at once
TEMPORARY_SHARE = 4       # a chunked kernel's temporaries stay within 1/4 of a worker's budget
METHODS = ("matmul", "contract", "broadcast", "spmm", "spreduce") + sparse_rules.METHODS
SPARSE_METHODS = ("spmm", "spreduce") + sparse_rules.METHODS  # exec/sparse_kernels.py
# the sparse methods whose matrix output tiles may come back sparse (``with_output``)
SPARSE_OUTPUT_METHODS = ("spmm", "semiring", "sddmm", "spjoin", "spreduce")  # spreduce: of a
#                                        rank-3 or higher tensor into a matrix (sparse_nd.py)


# -- chunks: what a broadcasting kernel holds per element of its join space ---------------------

def live_arrays(expr) -> int:
    """The most arrays ``scalar.evaluate`` holds at once evaluating ``expr``: a function's
    arguments are evaluated in order and kept until it is applied, then its result is made.

    >>> from tensordb.plan.scalar import parse_join
    >>> live_arrays(parse_join("x0 + x1")), live_arrays(parse_join("exp(x0) * 2 + sin(x1) * x0"))
    (1, 3)
    """
    if not isinstance(expr, scalar.Call):
        return 0
    held = top = 0
    for a in expr.args:
        top = max(top, held + live_arrays(a))
        held += isinstance(a, scalar.Call)
    return max(top, held + 1)


def element_bytes(op: EinOp) -> int:
    """Bytes a broadcasting kernel holds per join-space element: the join's intermediate arrays
    alive at once (``live_arrays``) at the widest of the operands' and the result's itemsizes,
    and at least one element of each operand's slice, broadcast to the chunk.

    >>> from tensordb.plan.scalar import parse_join
    >>> op = EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], {"i": 8, "j": 8, "k": 8},
    ...                        join=parse_join("exp(x0) * 2 + sin(x1) * x0"), agg="max")
    >>> element_bytes(op)    # three float64 arrays alive at once
    24
    """
    ins = [np.dtype(d).itemsize for d in (op.in_dtypes or (op.dtype,) * len(op.inputs))]
    widest = max(ins + [np.dtype(op.dtype).itemsize])
    return max(sum(ins), live_arrays(op.join) * widest) or widest


def chunk_elements(budget: int | None, op: EinOp, per_element: int | None = None) -> int:
    """The join-space elements one chunk of ``op``'s broadcasting kernel materialises: at most
    ``CHUNK_ELEMENTS`` (larger chunks gain nothing), and few enough that the chunk's temporaries
    stay within ``1 / TEMPORARY_SHARE`` of the worker's ``budget``.

    >>> op = EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], {"i": 8, "j": 8, "k": 8})
    >>> chunk_elements(None, op) == CHUNK_ELEMENTS, chunk_elements(64 << 10, op)   # 16 B/element
    (True, 1024)

    ``per_element``: ``element_bytes(op)`` where the caller has it.
    """
    if budget is None:
        return CHUNK_ELEMENTS
    per_element = per_element or element_bytes(op)
    return max(1, min(CHUNK_ELEMENTS, int(budget) // TEMPORARY_SHARE // per_element))


# -- the choice -----------------------------------------------------------------------------------

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
    semiring: str | None = None         # method 'semiring': 'min_plus', 'max_times', ...;
    #                                     'spmm': 'plus_times', GraphBLAS's SpGEMM (CSR output)
    copies: tuple[bool, ...] = ()       # method 'matmul': per operand, copied first
    fallback: "KernelChoice | None" = None  # the variant next to a NaN or inf (not broadcast)
    fallback_on: tuple[str, ...] = ()   # when it is taken: 'inputs', 'result' (tests of the
    #                                     data), 'device' (a sparse method run dense, off the CPU)
    out_format: str = "dense"           # a sparse method's output tiles: 'dense', 'csr' or
    #                                     'coo' (a join of rank 3 or more)
    out_density: float = 1.0            # the estimated share of its output elements stored
    out_places: bool = True             # the output sink gives its tiles dense places (with_output)
    gathers: bool = False               # 'spjoin' of rank 3+: a dense partner gathered at the
    #                                     sparse operand's entries (plan/sparse_nd_rules.py)

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
        if bool(self.fallback_on) != (self.fallback is not None) or (
                self.fallback is not None and (self.method == "broadcast"
                                               or self.fallback.method != "broadcast")):
            raise InternalError("a NaN/inf variant is a broadcast, of another method, with its test")
        if self.out_format != "dense" and self.method not in SPARSE_OUTPUT_METHODS:
            raise InternalError(f"kernel method '{self.method}' returns dense output tiles")
        if self.out_format != "dense" and self.out_places:
            raise InternalError("a kernel returning sparse output tiles gets no dense places")

    def describe(self) -> str:
        """``matmul x0@x1`` (``x1@x0``: the operands swapped), ``contract``, ``broadcast by j``
        (chunks along aggregated label j) or ``broadcast by rows``; ``, chunks of N`` follows
        when the worker's memory budget made chunks smaller than ``CHUNK_ELEMENTS``."""
        if self.layout is not None:
            return f"matmul x{self.layout.first}@x{self.layout.second}"
        if self.method == "semiring":
            return f"semiring {self.semiring} x{self.sparse} sparse (GraphBLAS)"
        if self.method == "spjoin" and self.gathers:
            return f"spjoin x{self.sparse} sparse (x{1 - self.sparse} gathered)"
        if self.method == "spjoin":
            return "spjoin x0 x1 sparse"
        if self.method == "spmm" and self.semiring is not None and self.out_format != "dense":
            return f"spmm x{self.sparse} sparse (GraphBLAS {self.semiring})"  # SpGEMM, CSR out
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
        if self.out_format != "dense":
            out["output_format"] = self.out_format
            out["output_density"] = self.out_density
        if self.fallback is not None:
            key = "dense" if self.fallback_on == ("device",) else "nonfinite"  # off the CPU
            out[key] = {"test": list(self.fallback_on), "text": self.fallback.describe()}
        return out


def choose_kernel(op: EinOp, extents: Mapping[str, int] | None = None,
                  budget: int | None = None, sparse: Sequence[int] = (),
                  finite: Sequence[bool] = (), fills: Sequence[float] = ()) -> KernelChoice:
    """The kernel for ``op`` whose tiles have (at most) ``extents`` per label (default: the whole
    operation, one tile), on a worker with ``budget`` bytes (None: no limit): a broadcasting
    kernel's chunks are sized from it (``chunk_elements``). A diagonal write computes each
    output label once, then places the values: its choice is that one's. ``sparse``: the
    operands stored with sparse tiles (matrices); ``finite``: per operand, whether it is known
    to hold no NaN or inf. A product-and-sum of a sparse matrix with an operand known finite is
    a sparse kernel (``spmm``, exec/sparse_kernels.py): absent entries are skipped, which is
    NumPy's answer only where the partner holds no NaN or inf (0 * inf is NaN). ``fills``: per
    operand, its fill value (0 when left out): a semiring, masked or sampled kernel
    (plan/sparse_rules.py, exec/semiring.py) where one fits."""
    op, made, tests, per_element = _decide(op, tuple(sparse), tuple(finite), tuple(fills))
    ext = extents or op.size
    if made is None:
        return _broadcast(op, ext, budget, per_element)
    if not tests:
        return made
    return KernelChoice(**{**made.__dict__, "fallback": _broadcast(op, ext, budget, per_element),
                           "fallback_on": tests})


# The part of each choice that the tile extents and the budget do not steer, kept per operation
# (by identity: the optimizer prices and the lowering lowers the very same EinOp objects, and a
# statement group bound from the cache brings them again): op id -> (op, its key, decision).
_DECIDED: dict[int, tuple] = {}
_DECIDED_MAX = 8192


def _decide(op: EinOp, sparse: tuple, finite: tuple, fills: tuple):
    """(the operation without its diagonal, the choice without its NaN/inf variant or None for
    a broadcast, the variant's tests, a broadcast's ``element_bytes``): ``choose_kernel`` less
    what the extents and the budget steer (a broadcast's chunking)."""
    key = (sparse, finite, fills)
    kept = _DECIDED.get(id(op))
    if kept is not None and kept[0] is op and kept[1] == key:
        return kept[2]
    plain, made, tests = _decide_anew(op, sparse, finite, fills)
    decision = (plain, made, tests, element_bytes(plain) if made is None or tests else None)
    if len(_DECIDED) >= _DECIDED_MAX:
        _DECIDED.clear()
    _DECIDED[id(op)] = (op, key, decision)
    return decision


def _decide_anew(op: EinOp, sparse: tuple, finite: tuple, fills: tuple):
    # -- sparse kernels (scipy.sparse, GraphBLAS): exec/sparse_kernels.py, exec/semiring.py --
    special = sparse_rules.choose(op, sparse, finite, fills)
    zero_fill = tuple(k for k in sparse if not fills or fills[k] == 0)
    found = special or sparse_kernel(op, zero_fill, finite)
    op = op.without_diagonal()
    if found is not None:
        # Where it runs dense (a GPU): spmm as BLAS, tested as 'contract' is; the others as
        # their variant, a chunked broadcast ('device').
        tests = (("inputs",) if np.dtype(op.dtype).kind == "f" else ()) \
            if found[0] == "spmm" else ("device",)
        semiring = found[2] if len(found) > 2 else None
        gathers = semiring == "gather"  # a dense partner gathered at the entries (rank 3+)
        if gathers:
            semiring = None
        if found[0] == "spmm" and spgemm_graphblas(op, zero_fill):
            semiring = "plus_times"
        return op, KernelChoice(found[0], sparse=found[1], semiring=semiring,
                                gathers=gathers), tests
    prod = blas_product(op)
    if prod is None:
        return op, None, ()
    scale = prod[0]
    # NumPy applies a leading literal (c * x0 * x1) to x0 before any product, and the kernel
    # does the same, so overflow to inf and the NaN of 0 * inf happen where NumPy's happen. A
    # trailing one ((x0 * x1) * c) multiplies each product in NumPy and the sum here: where
    # that sum is not finite the kernel computes the join as NumPy does (the variant).
    first = prod[1][0] if prod[2] and scale != 1 else None
    layout = matmul_layout(op)
    float_kind = np.dtype(op.dtype).kind
    tests = []
    if layout is None and float_kind == "f" and not (len(finite) == len(op.inputs)
                                                    and all(finite)):
        tests.append("inputs")
    if scale != 1 and first is None and op.agg_labels and float_kind in "fc":
        tests.append("result")
    tests = tuple(tests)
    if layout is None:
        return op, KernelChoice("contract", scale, first, fallback_on=()), tests
    ins = op.in_dtypes or (op.dtype,) * len(op.inputs)
    lay = layout
    groups = {lay.first: (lay.perm_first, (len(lay.batch), len(lay.free_first))),
              lay.second: (lay.perm_second, (len(lay.batch), len(lay.contracted)))}
    copies = tuple(np.dtype(d) != np.dtype(op.dtype) or k == first or not merges(*groups[k])
                   for k, d in enumerate(ins))
    return op, KernelChoice("matmul", scale, first, layout, copies=copies), tests


def _broadcast(op: EinOp, ext: Mapping[str, int], budget: int | None,
               per_element: int | None = None) -> KernelChoice:
    if op.agg in ARG_AGGS:  # evaluated whole: the index needs every element of the label
        return KernelChoice("broadcast", chunk=op.agg_labels[0], index=op.agg)
    return KernelChoice("broadcast", chunk=chunk_label(op, ext),
                        chunk_elements=chunk_elements(budget, op, per_element))


def chunk_label(op: EinOp, extents: Mapping[str, int]) -> str:
    """What a broadcasting kernel of ``op`` on tiles of ``extents`` chunks along: the largest
    aggregated label (the first of equals), so one chunk stays near ``chunk_elements``; a join
    with nothing to aggregate is cut in slabs of its first axis (``rows``)."""
    return max(op.agg_labels, key=lambda l: extents[l]) if op.agg_labels else "rows"


# -- the output format of a sparse kernel -------------------------------------------------------

def with_output(choice: KernelChoice, op: EinOp, est_nnz: float | None) -> KernelChoice:
    """``choice`` with its output decided from the output's estimated nonzeros ``est_nnz``
    (``optimizer.sparse_cost.sparse_out_nnz``, spread evenly over its tiles), once for the
    optimizer, the lowering and the output sink, by the rule that picks a stored tile's format
    (``sparsity.choose_format`` of the whole output):

    - ``out_format``: a sparse kernel whose output is a matrix (``SPARSE_OUTPUT_METHODS``:
      SpGEMM, a semiring product, SDDMM, a sparse join) returns its output tiles as CSR
      (exec/sparse_kernels.py, exec/semiring.py) where the output is sparse; else dense; a
      ``spreduce`` whose output is a sparse vector (or of rank 3 and more) returns COO tiles
      (``sparse_nd.reduce_nd_coo``: the row sums of a hypersparse matrix), as does an ``spmm``
      of a sparse operand of rank 3 or more into an output that is not a matrix
      (``sparse_nd.contract_nd`` / ``sparse_nd_join.contract_coo`` with ``entries``);
    - ``out_places``: whether the output sink (physical/sink.py) gives the output's tiles dense
      places to be computed in (buffers in its payload file). Not where the output is sparse,
      whatever the kernel returns: a kernel returning dense tiles of a sparse output (a row
      sum of a sparse matrix) hands them to the commit, which stores each by the format rule.

    With no estimate (not a sparse kernel) the output is dense, computed in its places. The
    optimizer prices what this gives (its output bytes, ``output_tile_bytes``) and the lowering
    records the same choice, so the plan's memory and the run agree.

    >>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 1000, "j": 1000,
    ...                        "k": 1000})
    >>> c = KernelChoice("spmm", sparse=0)
    >>> with_output(c, op, 5000).out_format, with_output(c, op, 900_000).out_format
    ('csr', 'dense')
    >>> r = EinOp.contraction("r", "i", [("A", "ij")], {"i": 1000, "j": 1000})
    >>> c = with_output(KernelChoice("spreduce", sparse=0), r, 20)
    >>> c.out_format, c.out_places
    ('coo', False)
    >>> t = EinOp.contraction("R", "abk", [("T", "abc"), ("U", "ck")], {"a": 10**5, "b": 10**5,
    ...                       "c": 10**5, "k": 4})
    >>> with_output(KernelChoice("spmm", sparse=0), t, 4000).out_format
    'coo'
    """
    if est_nnz is None:
        return choice
    size = math.prod(op.out_shape)
    fmt = choose_format(op.out_shape, int(math.ceil(est_nnz)), op.dtype) if size else "dense"
    # the kernels return CSR tiles; the writer stores a hypersparse one COO (the format rule);
    # a join of rank 3 or more returns COO tiles (exec/sparse_nd_join.py)
    returns = "csr" if fmt != "dense" and choice.method in SPARSE_OUTPUT_METHODS and \
        len(op.out_labels) == 2 and not op.writes_diagonal else "dense"
    if fmt != "dense" and choice.method == "spjoin" and len(op.out_labels) > 2 and \
            not op.writes_diagonal:
        returns = "coo"
    if fmt == "coo" and choice.method == "spjoin" and len(op.out_labels) == 2:
        returns = "coo"  # a hypersparse matrix: its entries, no row pointers (sparse_hyper.py)
    if fmt == "coo" and choice.method == "spreduce" and len(op.out_labels) != 2:
        returns = "coo"  # a reduction's sparse vector (a hypersparse matrix's row sums)
    if fmt != "dense" and choice.method == "spmm" and len(op.out_labels) != 2 and \
            len(op.inputs[choice.sparse].labels) > 2 and not op.writes_diagonal:
        returns = "coo"  # a contraction of a rank 3+ tensor on its entries (sparse_nd.py)
    density = min(1.0, float(est_nnz) / size) if size and returns != "dense" else 1.0
    places = fmt == "dense"
    if (returns, density, places) == (choice.out_format, choice.out_density, choice.out_places):
        return choice
    return replace(choice, out_format=returns, out_density=density, out_places=places)


def output_tile_bytes(op: EinOp, choice: KernelChoice, out_shape: Sequence[int]) -> int:
    """The bytes of one output tile of ``out_shape`` that ``choice`` returns: dense, or its
    estimated entries in its sparse format (``sparsity.sparse_nbytes``) for a kernel whose output
    is sparse (``with_output``). The memory projection (plan/memory.py) and the executor's
    admission of a call (exec/runtime.py ``planned_bytes``) read it."""
    shape = tuple(int(n) for n in out_shape)
    dense = math.prod(shape) * np.dtype(op.dtype).itemsize
    if choice.out_format == "dense" or (len(shape) != 2 and choice.out_format != "coo"):
        return dense
    nse = int(math.ceil(choice.out_density * math.prod(shape)))
    return min(dense, sparse_nbytes(shape, nse, op.dtype, choice.out_format))
