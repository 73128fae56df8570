"""Matrix kernels on the entries of hypersparse boxes (a matrix's COO tiles, read as a
``CooTile``), never through CSR over the box's rows: the row pointers of a 10^10-row box of 5
entries are 80 GB whatever its entries.

- ``spjoin_matrix``: ``A * B``, ``A + B``, ``A - B`` of two sparse matrices of fill 0 (the
  ``spjoin`` kernel of rank 2) where either box is a ``CooTile``, or where the plan says the
  output is hypersparse (``KernelChoice.out_format`` 'coo'): computed on the union of their
  entries by ``sparse_nd_join.join_entries`` (NumPy's ufunc, so a NaN or inf meeting the
  other's absent 0 gives NumPy's NaN or inf), returned as COO, CSR or dense as the plan says.
  ``J[i,j] = G[i,j] * G[i,j]`` of a 10^10-row ``G`` of 5 entries is 5 entries.

>>> import numpy as np
>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.kernel import KernelChoice
>>> from tensordb.plan.scalar import parse_join
>>> op = EinOp.contraction("J", "ij", [("A", "ij"), ("B", "ij")], {"i": 10**10, "j": 10**10},
...                       join=parse_join("x0 * x1"))
>>> a = CooTile((10**10, 10**10), np.array([[5, 9 * 10**9], [1, 2]]), np.array([2.0, 3.0]))
>>> b = CooTile((10**10, 10**10), np.array([[9 * 10**9], [2]]), np.array([-1.0]))
>>> r = spjoin_matrix(op, KernelChoice("spjoin", sparse=0, out_format="coo", out_places=False),
...                   [a, b], [a.shape, b.shape], a.shape)
>>> r.coords.tolist(), r.values.tolist()
([[9000000000], [2]], [-3.0])
"""
from __future__ import annotations

import numpy as np

from ..storage.boxes import RowGather
from ..storage.sparse import CooTile, Filled, entries, is_sparse, stacked
from .sparse_nd_join import join_entries
from .sparse_out import csr_output

__all__ = ["spjoin_matrix", "on_entries"]


def _coo(x) -> CooTile | None:
    """A sparse matrix box of fill 0 as a ``CooTile`` (its entries); None otherwise."""
    x = x.take() if isinstance(x, RowGather) else x
    if isinstance(x, CooTile):
        return x
    if isinstance(x, Filled) or not is_sparse(x):
        return None
    csr = stacked(x).tocsr()
    lin, vals = entries(csr)
    rows, cols = np.divmod(lin, max(int(csr.shape[1]), 1))
    return CooTile(tuple(int(n) for n in csr.shape), np.stack([rows, cols]), np.asarray(vals))


def on_entries(choice, args: list) -> bool:
    """Whether an ``spjoin`` call of rank 2 runs here: a box read as a ``CooTile`` (hypersparse
    tiles) or COO output, and no operand whose absent entries are not 0."""
    return (choice.out_format == "coo" or any(isinstance(a, CooTile) for a in args)) and \
        not any(isinstance(a, Filled) for a in args)


def spjoin_matrix(op, choice, args: list, arg_shapes, out_shape):
    """One call of an ``spjoin`` kernel of rank 2 on the entries (see the module docstring):
    ``args`` the operands' boxes (None: absent, all 0), either a sparse box or a dense one."""
    dtype = np.dtype(op.dtype)
    ins = op.in_dtypes or (op.dtype,) * len(args)
    boxes = []
    for a, s, d in zip(args, arg_shapes, ins):
        if a is None:
            a = CooTile(tuple(int(n) for n in s), np.zeros((len(s), 0), np.int64),
                        np.zeros(0, d))
        boxes.append(_coo(a) if is_sparse(a) or isinstance(a, RowGather) else np.asarray(a))
    first = op.join.args[0].index
    order = [first, 1 - first]
    res = join_entries(op.join.fn, [boxes[k] for k in order],
                       [op.inputs[k].labels for k in order], op.out_labels, dtype,
                       tuple(int(n) for n in out_shape))
    if choice.out_format == "coo":
        return res
    if choice.out_format == "csr":
        import scipy.sparse as sp
        return csr_output(sp.csr_array((res.values, tuple(res.coords)), shape=res.shape),
                          (0, 1), (0, 1), dtype)
    return res.toarray()
