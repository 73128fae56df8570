"""A fake CuPy: NumPy under CuPy's name, with device arrays of a type of their own (tagged with
the device current when they were made), two 'devices', the part of ``cupy.cuda`` the GPU
executor uses, and every copy recorded (its bytes), host -> device and device -> host. Each
stand-in has its own ``cupyx.scipy.sparse`` (``cupyx_sparse``, _sparse.py: scipy.sparse's
matrices holding its device arrays), which ``import cupyx.scipy.sparse`` is in a subprocess
(tests/fakecupy/cupyx).

Two uses, one stand-in:
- ``DeviceXp()`` objects, imported as ``tests.fakecupy.cupy`` by tests/exec/test_gpu_cache.py and
  tests/exec/test_gpu_lets.py and handed to the executor as its ``xp`` (each with its own record);
- this directory first on a subprocess's PYTHONPATH, so that ``import cupy`` there is this
  module (tests/exec/test_gpu_cache.py's run of the random corpora on executor="gpu"): the module
  is then one ``DeviceXp``'s functions.
pytest does not collect this directory (pyproject.toml ignores it): in the test process it
must never be imported as ``cupy``."""
from __future__ import annotations

import contextlib
import threading
import types

import numpy as np

from ._sparse import SparseXp

__version__ = "fake"


class _Current(threading.local):
    device = 0


_CURRENT = _Current()


class Dev(np.ndarray):
    """An array 'on a device': NumPy's, tagged with the device current when it was made."""

    def __array_finalize__(self, obj):
        self.dev = _CURRENT.device


class DeviceXp(types.ModuleType):
    """NumPy standing in for CuPy: arrays made through it are ``Dev``; ``asarray`` of a host
    array is a host -> device copy, ``asnumpy`` a device -> host copy, ``Dev.copy()`` under
    another device a copy between devices; each is recorded (its bytes)."""

    def __init__(self, name: str = "xp") -> None:
        super().__init__(name)
        self.lock = threading.Lock()
        self.h2d: list[int] = []
        self.d2h: list[int] = []
        self.cuda = types.SimpleNamespace(
            Device=self._device, Stream=lambda non_blocking=False: contextlib.nullcontext(),
            get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None),
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 2,
                                          memGetInfo=lambda: (1 << 34, 1 << 34)))
        self.cupyx_sparse = SparseXp(self, Dev)

    @contextlib.contextmanager
    def _device(self, d: int = 0):
        old, _CURRENT.device = _CURRENT.device, d
        try:
            yield
        finally:
            _CURRENT.device = old

    def __getattr__(self, name):
        attr = getattr(np, name)
        if callable(attr) and not isinstance(attr, (np.ufunc, type)):
            def made_here(*args, **kw):
                out = attr(*args, **kw)
                return out.view(Dev) if type(out) is np.ndarray else out
            return made_here
        return attr

    def asarray(self, a, dtype=None):
        if isinstance(a, Dev):
            return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
        host = np.array(a, dtype=dtype, copy=True)
        if not isinstance(a, np.generic):  # NumPy's reductions give scalars, CuPy's 0-d arrays
            with self.lock:
                self.h2d.append(int(host.nbytes))
        return host.view(Dev)

    def asnumpy(self, a):
        with self.lock:
            self.d2h.append(int(a.nbytes))
        return np.array(a, copy=True)

    def clear(self) -> None:
        self.h2d.clear()
        self.d2h.clear()


# ``import cupy`` in a subprocess: the module is one stand-in's functions
_XP = DeviceXp("cupy")
cuda, asarray, asnumpy = _XP.cuda, _XP.asarray, _XP.asnumpy


def __getattr__(name):
    return getattr(_XP, name)
