"""What a GPU runs for a sparse kernel the plan chose (plan/kernel.py): the sparse method on
cupyx.scipy.sparse (exec/gpu_sparse.py runs it), or the dense form on the densified tiles, and
EXPLAIN's text for it on the GPU executor."""
from __future__ import annotations

import numpy as np

from .ir import EinOp
from .kernel import SPARSE_METHODS, KernelChoice, choose_kernel  # noqa: F401 - the doctest's

__all__ = ["DEVICE_SPARSE_DTYPES", "device_method", "device_describe"]

# the dtypes a GPU keeps sparse tiles in (cuSPARSE's real ones: cupyx.scipy.sparse takes no
# integers); a tile of another dtype is densified when it is copied to the device
DEVICE_SPARSE_DTYPES = ("float32", "float64")


def device_method(op: EinOp, choice: KernelChoice) -> str | None:
    """The sparse method a GPU runs on cupyx.scipy.sparse for ``choice`` (exec/gpu_sparse.py),
    or None where the GPU runs it dense (its dense kernel on the densified tiles, as before):

    - ``spmm`` of two operands: SpMM, SpMV (``S @ D``), SpGEMM (``S @ T``, CSR out where
      ``out_format`` says so); GRAD's three-operand scaled scatter-add runs dense;
    - ``spreduce`` with SUM: the row or column sums of the stored entries; MAX and MIN dense
      (and any reduction of a sparse tensor of rank 3 or more);
    - ``sddmm``: by its definition over the mask's stored coordinates (cupyx has no SDDMM);
    - ``spjoin``: cupyx's elementwise ``multiply``, ``+`` and ``-`` of two CSR tiles (a join
      of rank 3 or more runs dense there);
    - ``masked`` (the triangle count's ``SUM(A * B * C)``): ``(X @ Y).multiply(M).sum()``,
      the unmasked SpGEMM then M's entries of it (scipy's form without GraphBLAS);
    - ``semiring`` (min-plus, max-times: no GPU library has them): dense, its broadcast variant
      (``fallback``, tested ``device``), exactly NumPy's answer.

    Only float32 and float64 tiles stay sparse on a device (``DEVICE_SPARSE_DTYPES``)."""
    if choice.method not in SPARSE_METHODS or \
            np.dtype(op.dtype).name not in DEVICE_SPARSE_DTYPES:
        return None
    if choice.method == "spmm":
        return "spmm" if len(op.inputs) == 2 and len(op.inputs[choice.sparse].labels) == 2 \
            else None
    if choice.method == "spreduce":
        return "spreduce" if op.agg == "sum" and len(op.inputs[0].labels) == 2 else None
    if choice.method == "spjoin" and len(op.out_labels) != 2:
        return None  # rank 3 or more (exec/sparse_nd_join.py): dense on a GPU, its variant
    return choice.method if choice.method in ("sddmm", "spjoin", "masked") else None


def device_describe(op: EinOp, choice: KernelChoice) -> str:
    """EXPLAIN's kernel text on the GPU executor: the sparse method on cupyx.scipy.sparse
    (``device_method``), or what runs there dense.

    >>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 3, "j": 4, "k": 2})
    >>> device_describe(op, choose_kernel(op, sparse=(0,), finite=(True, True)))
    'spmm x0 sparse (cupyx)'
    >>> device_describe(op, choose_kernel(op))
    'matmul x0@x1'
    """
    method = device_method(op, choice)
    if method is not None:
        sides = "x0 x1" if method == "spjoin" else f"x{choice.sparse}"
        how = "cupyx, at the mask's entries" if method == "sddmm" else "cupyx"
        return f"{method} {sides} sparse ({how})"
    if choice.method not in SPARSE_METHODS:
        return choice.describe()
    dense = choice.fallback.describe() if "device" in choice.fallback_on else \
        "contract" if choice.method == "spmm" else choice.describe()
    return f"{dense} (densified on the GPU)"
