"""``cupyx.scipy.sparse`` standing in: scipy.sparse's matrices under cupyx's names, whose arrays
(``data``, ``indices``, ``indptr``; ``row``, ``col``) are the stand-in's device arrays (``Dev``).

What it keeps of cupyx, so that code right on it is right on CuPy and a host/device mix-up fails:
- a matrix is made from device arrays only (``csr_matrix((data, indices, indptr), shape=)``) or
  another device matrix; host arrays, scipy matrices or a dense array raise TypeError (cupyx
  would copy those itself; the executor must copy them through ``cupy.asarray``, which counts);
- only bool, float32, float64, complex64 and complex128 values (cupyx's rule: no integers);
- ``@`` with a device matrix or a device array (never a host one), ``multiply``, ``+``, ``-``,
  ``sum(axis)`` (a 2-D device array, as cupyx's matrices give), ``toarray``, ``tocoo``,
  ``tocsr``, ``tocsc``, ``T``, ``astype``, ``copy``, ``sum_duplicates``, ``nnz``;
- ``get()`` is the one copy to the host (a scipy matrix), recorded in the stand-in's ``d2h``
  (each array's bytes); no ``nbytes`` (cupyx's matrices have none); reading one as a NumPy
  array (``np.asarray``) raises.
Work done "on the device" (a product, a conversion) is scipy's on views of the arrays, and
copies nothing in the record."""
from __future__ import annotations

import types

import numpy as np
import scipy.sparse as sp

DTYPES = frozenset(np.dtype(t) for t in ("bool", "float32", "float64", "complex64",
                                           "complex128"))


class SparseXp(types.ModuleType):
    """The stand-in's ``cupyx.scipy.sparse``: ``csr_matrix``, ``csc_matrix``, ``coo_matrix``,
    ``issparse``; ``xp`` is the ``DeviceXp`` whose record the copies go to."""

    def __init__(self, xp, dev_type) -> None:
        super().__init__("cupyx.scipy.sparse")
        self.xp, self.Dev = xp, dev_type
        module = self

        def kind(fmt):
            return type(f"{fmt}_matrix", (_Matrix,), {"format": fmt, "_mod": module,
                                                       "__module__": "cupyx.scipy.sparse"})
        self.csr_matrix, self.csc_matrix, self.coo_matrix = (kind(f) for f in
                                                             ("csr", "csc", "coo"))

    def issparse(self, x) -> bool:
        return isinstance(x, _Matrix)

    def isspmatrix_csr(self, x) -> bool:
        return isinstance(x, _Matrix) and x.format == "csr"

    def _wrap(self, m):
        """A scipy result computed 'on the device' as a device matrix of its format."""
        m = sp.csr_matrix(m) if m.format not in ("csr", "csc", "coo") else m
        cls = {"csr": self.csr_matrix, "csc": self.csc_matrix, "coo": self.coo_matrix}[m.format]
        out = _Matrix.__new__(cls)
        out._m = m
        return out

    def _dev(self, a):
        return np.asarray(a).view(self.Dev)


class _Matrix:
    format = "csr"
    _mod: SparseXp

    def __init__(self, arg, shape=None, dtype=None) -> None:
        mod, Dev = self._mod, self._mod.Dev
        if isinstance(arg, _Matrix):
            m = arg._m.asformat(self.format, copy=True)
        elif isinstance(arg, tuple) and self.format in ("csr", "csc") and len(arg) == 3:
            if not all(isinstance(a, Dev) for a in arg):
                raise TypeError("the stand-in's sparse matrices are made of device arrays: "
                                "copy host arrays with cupy.asarray first")
            cls = sp.csr_matrix if self.format == "csr" else sp.csc_matrix
            m = cls(tuple(np.asarray(a) for a in arg), shape=shape)
        elif isinstance(arg, Dev) and arg.ndim == 2:  # a dense device array (cupyx: dense2csr)
            m = sp.csr_matrix(np.asarray(arg)).asformat(self.format)
        elif isinstance(arg, tuple) and self.format == "coo" and len(arg) == 2:
            data, (row, col) = arg
            if not all(isinstance(a, Dev) for a in (data, row, col)):
                raise TypeError("the stand-in's sparse matrices are made of device arrays")
            m = sp.coo_matrix((np.asarray(data), (np.asarray(row), np.asarray(col))),
                              shape=shape)
        else:
            raise TypeError(f"the stand-in's {self.format}_matrix takes device arrays or a "
                            f"device matrix, not {type(arg).__name__}")
        if dtype is not None:
            m = m.astype(dtype)
        if m.dtype not in DTYPES:
            raise ValueError("Only bool, float32, float64, complex64 and complex128 are "
                             "supported")
        self._m = m

    # -- what cupyx's matrices have ------------------------------------------------------------
    def __array__(self, *args, **kw):
        raise TypeError("a device sparse matrix read as a host array: copy it with .get()")

    @property
    def shape(self):
        return self._m.shape

    @property
    def dtype(self):
        return self._m.dtype

    @property
    def nnz(self) -> int:
        return int(self._m.nnz)

    ndim = 2

    def __getattr__(self, name):
        if name in ("data", "indices", "indptr", "row", "col") and "_m" in self.__dict__:
            m = self.__dict__["_m"]
            if hasattr(m, name):
                return self._mod._dev(getattr(m, name))
        raise AttributeError(name)

    @property
    def has_canonical_format(self) -> bool:
        return bool(self._m.has_canonical_format)

    def sum_duplicates(self) -> None:
        self._m.sum_duplicates()

    def copy(self):
        return self._mod._wrap(self._m.copy())

    def astype(self, dtype):
        if np.dtype(dtype) not in DTYPES:
            raise ValueError("Only bool, float32, float64, complex64 and complex128 are "
                             "supported")
        return self._mod._wrap(self._m.astype(dtype))

    def tocsr(self):
        return self if self.format == "csr" else self._mod._wrap(self._m.tocsr())

    def tocsc(self):
        return self if self.format == "csc" else self._mod._wrap(self._m.tocsc())

    def tocoo(self):
        return self._mod._wrap(self._m.tocoo())

    @property
    def T(self):
        return self._mod._wrap(self._m.T)

    def transpose(self):
        return self.T

    def toarray(self):
        return self._mod._dev(self._m.toarray())

    def get(self):
        """The one copy to the host: a scipy matrix of the same format (recorded)."""
        xp = self._mod.xp
        m = self._m.copy()
        parts = [m.data, m.row, m.col] if m.format == "coo" else [m.data, m.indices, m.indptr]
        with xp.lock:
            xp.d2h.extend(int(p.nbytes) for p in parts)
        return m

    def _other(self, other):
        if isinstance(other, _Matrix):
            return other._m
        if isinstance(other, self._mod.Dev):
            return np.asarray(other)
        if np.isscalar(other):
            return other
        raise TypeError(f"a device sparse matrix with a host {type(other).__name__}: copy it "
                        "to the device first")

    def __matmul__(self, other):
        res = self._m @ self._other(other)
        return self._mod._wrap(res) if sp.issparse(res) else self._mod._dev(res)

    def multiply(self, other):
        return self._mod._wrap(sp.csr_matrix(self._m.multiply(self._other(other))))

    def __add__(self, other):
        if not isinstance(other, _Matrix):
            raise TypeError("the stand-in adds device sparse matrices only")
        return self._mod._wrap(sp.csr_matrix(self._m + other._m))

    def __sub__(self, other):
        if not isinstance(other, _Matrix):
            raise TypeError("the stand-in subtracts device sparse matrices only")
        return self._mod._wrap(sp.csr_matrix(self._m - other._m))

    def sum(self, axis=None, dtype=None):
        res = self._m.sum(axis=axis, dtype=dtype)
        return self._mod._dev(np.asarray(res))
