"""A fake ``cupyx.scipy.sparse``: the sparse stand-in of the process's fake ``cupy``
(tests/fakecupy/cupy/_sparse.py), its copies recorded in that stand-in's record."""
import cupy as _cupy

_S = _cupy.cupyx_sparse
csr_matrix, csc_matrix, coo_matrix = _S.csr_matrix, _S.csc_matrix, _S.coo_matrix
issparse, isspmatrix_csr = _S.issparse, _S.isspmatrix_csr
