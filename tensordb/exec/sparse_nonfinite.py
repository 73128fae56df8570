"""SpGEMM of two sparse matrices of which one holds NaN or inf, on their entries: NumPy's answer
on the densified operands without densifying them (the kernel used to fall back to a dense
``tensordot`` of both: 7.28 TiB for a 10^6 x 10^6 ``G`` of 5 entries, one of them inf, planned
at 7.6 MiB).

Where both entries are present the product is scipy's (``inf * x`` is inf, ``inf - inf`` NaN,
as NumPy's); what skipping the absent entries loses is ``inf * 0``: a NaN at ``(i, k)`` wherever
a non-finite ``S[i,j]`` meets an absent ``D[j,k]`` (for some such ``j``), or an absent ``S[i,j]``
meets a non-finite ``D[j,k]``. So a row of ``S`` holding a non-finite value is a NaN row of the
output but where ``D`` has entries in every such ``j``'s row (a column of ``D`` likewise): these
rows and columns are as large as NumPy's answer, the rest is the product of the entries.

>>> import numpy as np
>>> si, sj, sv = np.array([0, 2]), np.array([1, 1]), np.array([np.inf, 2.0])
>>> dj, dk, dv = np.array([1]), np.array([0]), np.array([3.0])
>>> r, c, v = spgemm_nonfinite((si, sj, sv), (dj, dk, dv), (3, 2), np.float64)
>>> out = np.zeros((3, 2)); out[r, c] = v
>>> out.tolist()
[[inf, nan], [0.0, 0.0], [6.0, 0.0]]
"""
from __future__ import annotations

import numpy as np

__all__ = ["spgemm_nonfinite"]


def spgemm_nonfinite(s, d, shape, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``S @ D`` of ``s`` = (rows, shared ids, values) of ``S`` and ``d`` = (shared ids, columns,
    values) of ``D`` (coordinates unique within each) into the output of ``shape`` (rows,
    columns): its (rows, columns, values), each element once, in C order (see the module
    docstring). Only the occupied rows, shared ids and columns are numbered (no row pointers
    over a hypersparse operand's rows)."""
    import scipy.sparse as sp
    dtype = np.dtype(dtype)
    (si, sj, sv), (dj, dk, dv) = ([np.asarray(x) for x in t] for t in (s, d))
    sv, dv = sv.astype(dtype, copy=False), dv.astype(dtype, copy=False)
    mids, mid = np.unique(np.concatenate([sj, dj]).astype(np.int64), return_inverse=True)
    mid = mid.reshape(-1)
    ms, md = mid[:sj.size], mid[sj.size:]
    rows, r = np.unique(si.astype(np.int64), return_inverse=True)
    cols, c = np.unique(dk.astype(np.int64), return_inverse=True)
    r, c = r.reshape(-1), c.reshape(-1)
    A = sp.csr_array((sv, (r, ms)), shape=(rows.size, mids.size))
    B = sp.csr_array((dv, (md, c)), shape=(mids.size, cols.size))
    with np.errstate(invalid="ignore", over="ignore"):
        C = (A @ B).tocoo()
    ri, ci, vals = [rows[C.row]], [cols[C.col]], [np.asarray(C.data, dtype)]
    # a non-finite S[i,j] times every absent D[j,k]: NaN but where D's rows j all have k
    bad = ~np.isfinite(sv)
    if bad.any():
        nan_r, nan_c = _nan_lines(r[bad], ms[bad], (np.ones(dv.size, np.int8), (md, c)),
                                  (mids.size, cols.size), cols, int(shape[1]))
        ri.append(rows[nan_r]), ci.append(nan_c)
        vals.append(np.full(nan_r.size, np.nan, dtype))
    bad = ~np.isfinite(dv)  # an absent S[i,j] times a non-finite D[j,k]: by columns
    if bad.any():
        nan_c, nan_r = _nan_lines(c[bad], md[bad], (np.ones(sv.size, np.int8), (ms, r)),
                                  (mids.size, rows.size), rows, int(shape[0]))
        ri.append(nan_r), ci.append(cols[nan_c])
        vals.append(np.full(nan_c.size, np.nan, dtype))
    out = sp.coo_array((np.concatenate(vals), (np.concatenate(ri), np.concatenate(ci))),
                       shape=tuple(int(n) for n in shape))
    with np.errstate(invalid="ignore"):
        out.sum_duplicates()  # a NaN plus the entries' product is NaN; sorted in C order
    return np.asarray(out.row, np.int64), np.asarray(out.col, np.int64), out.data


def _nan_lines(line, at, pattern, pshape, other_ids, n_other):
    """(the local line ids, the global ids along the other axis) where a non-finite entry on
    line ``line[e]`` at shared id ``at[e]`` meets an absent entry of the other operand
    (``pattern``: its entries as (ones, (shared id, local id along the other axis)) of
    ``pshape``, the local ids ``other_ids`` global): every element of the line but those the
    other operand has at all of the line's non-finite shared ids."""
    import scipy.sparse as sp
    lines, li = np.unique(line, return_inverse=True)
    li = li.reshape(-1)
    need = np.bincount(li, minlength=lines.size)
    ind = sp.csr_array((np.ones(li.size, np.int64), (li, at)), shape=(lines.size, pshape[0]))
    P = sp.csr_array((pattern[0].astype(np.int64), pattern[1]), shape=pshape)
    met = (ind @ P).tocoo()  # per (line, other id): how many of its non-finite ids it meets
    mask = np.ones((lines.size, n_other), bool)
    full = met.data == need[met.row]
    mask[met.row[full], other_ids[met.col[full]]] = False
    nl, no = np.nonzero(mask)
    return lines[nl], no.astype(np.int64)
