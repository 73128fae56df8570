"""The kernel choice of each operation, as the lowering records it in the plan (``TilePlan.kernels``).

The decision itself is ``plan.kernel.choose_kernel``: one function, which the optimizer prices
(optimizer/cost.py, through plan/memory.py) and the lowering records (physical/lower.py), so
that the kernel the plan was costed with is the kernel that runs. It lives in plan/ because the
optimizer sits below physical/ in the import rules. The executor's kernels (exec/kernels.py)
read the choice and decide nothing.

>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 4, "j": 3, "k": 2})
>>> choose_kernel(op).describe()
'matmul x0@x1'
"""
from __future__ import annotations

from ..plan.kernel import (CHUNK_ELEMENTS, METHODS, SPARSE_METHODS, SPARSE_OUTPUT_METHODS,
                           KernelChoice, MatmulLayout, choose_kernel, sparse_reduction,
                           spmm_operand, with_output)

__all__ = ["CHUNK_ELEMENTS", "METHODS", "SPARSE_METHODS", "SPARSE_OUTPUT_METHODS", "MatmulLayout",
           "KernelChoice", "choose_kernel", "spmm_operand", "sparse_reduction", "with_output"]
