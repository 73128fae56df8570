"""The dtypes tensordb stores, and the check every dtype goes through (a stored tensor's, a
file's, an operation's result). Every stage may use it.

>>> check_dtype("float32", "A").name
'float32'
>>> check_dtype("complex128", "A")
Traceback (most recent call last):
  ...
tensordb.errors.DataError: A: unsupported dtype complex128
HINT: supported dtypes: bool, float32, float64, int32, int64
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .errors import DataError

__all__ = ["SUPPORTED_DTYPES", "check_dtype"]

SUPPORTED_DTYPES = ("bool", "float32", "float64", "int32", "int64")


def check_dtype(dtype, what: str) -> np.dtype:
    """Return ``np.dtype(dtype)`` if tensordb supports it, else raise a DataError naming ``what``."""
    try:
        try:
            dt, name = _named(dtype)
        except TypeError:  # unhashable (not a dtype either, most likely): ask NumPy itself
            dt = np.dtype(dtype)
            name = dt.name
    except TypeError:
        raise DataError(f"{what}: unknown dtype {dtype!r}") from None
    if name not in SUPPORTED_DTYPES:
        raise DataError(f"{what}: unsupported dtype {name}",
                        hint=f"supported dtypes: {', '.join(SUPPORTED_DTYPES)}")
    return dt


@lru_cache(maxsize=256)
def _named(dtype) -> tuple[np.dtype, str]:
    """The dtype and its name, kept: NumPy builds a dtype's name anew on each ask, and binding a
    training step asks thousands of times."""
    dt = np.dtype(dtype)
    return dt, dt.name
