"""A fake CuPy, for tests/test_gpu_cache.py's run of the random corpora on executor="gpu"
without a GPU: NumPy under CuPy's name, with device arrays of a type of their own (tagged with
the device current when they were made), two 'devices', and the part of ``cupy.cuda`` the
GPU executor uses. Only that test's subprocess puts this directory on its PYTHONPATH."""
import contextlib, threading, types
import numpy as np

__version__ = "fake"

class _Cur(threading.local):
    device = 0
_CUR = _Cur()

class ndarray_dev(np.ndarray):  # noqa: N801 - a device array
    def __array_finalize__(self, obj):
        self.dev = _CUR.device

H2D = [0]

@contextlib.contextmanager
def _device(d=0):
    old, _CUR.device = _CUR.device, d
    try:
        yield
    finally:
        _CUR.device = old

class _Dev:
    def __init__(self, d=0): self.d = d
    def __enter__(self): self.old = _CUR.device; _CUR.device = self.d
    def __exit__(self, *a): _CUR.device = self.old
    def synchronize(self): pass

_stream = types.SimpleNamespace(synchronize=lambda: None)
cuda = types.SimpleNamespace(
    Device=_Dev, Stream=lambda non_blocking=False: contextlib.nullcontext(),
    get_current_stream=lambda: _stream,
    runtime=types.SimpleNamespace(getDeviceCount=lambda: 2, memGetInfo=lambda: (1 << 34, 1 << 34)))

def asarray(a, dtype=None):
    if isinstance(a, ndarray_dev):
        return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
    H2D[0] += 1
    return np.array(a, dtype=dtype, copy=True).view(ndarray_dev)

def asnumpy(a):
    return np.array(a, copy=True)

def __getattr__(name):
    attr = getattr(np, name)
    if callable(attr) and not isinstance(attr, (np.ufunc, type)):
        def made_here(*args, **kw):
            out = attr(*args, **kw)
            return out.view(ndarray_dev) if type(out) is np.ndarray else out
        return made_here
    return attr
