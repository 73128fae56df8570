"""Open a .npy file as a read-only memory-mapped array, with clear errors for bad files.

The mapping is ours (not ``np.load(mmap_mode='r')``) so the loader can release the pages it has
already copied (``madvise(DONTNEED)``): a file larger than memory streams through in tiles and
the process's resident set stays about one tile.
"""
from __future__ import annotations

import math
import mmap
import os

import numpy as np

from ..dtypes import SUPPORTED_DTYPES
from ..errors import DataError, OperationalError
from ..storage.meta import supported_dtype

__all__ = ["NpyFile", "open_input", "read_header"]


def open_input(path: str):
    """Open an input file for reading; a missing or unreadable file is an OperationalError."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise OperationalError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise OperationalError(f"{path} is a directory, not a file") from None
    except OSError as exc:
        raise OperationalError(f"cannot open {path}: {exc.strerror or exc}") from None


def read_header(f, path: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The (shape, fortran order, dtype) of the .npy stream ``f``, checked: numpy's reader accepts
    headers such as shape (-1, 100) that no array can have."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    except Exception as exc:  # numpy raises ValueError, EOFError, SyntaxError...
        raise DataError(f"cannot read {path} as a .npy file: {exc}") from None
    if not isinstance(shape, tuple) or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise DataError(f"{path} has a corrupt .npy header: shape {shape!r} is not a tuple of "
                        "non-negative integers")
    if dtype.hasobject:
        raise DataError(f"{path}: unsupported dtype object",
                        hint=f"supported dtypes: {', '.join(SUPPORTED_DTYPES)}")
    supported_dtype(dtype, path)
    return shape, bool(fortran), dtype


class NpyFile:
    """``with NpyFile(path) as npy: npy.array ...; npy.release()`` after each chunk is copied."""

    def __init__(self, path: str, *, start: int = 0, end: int | None = None,
                 what: str | None = None) -> None:
        """``start``/``end``: where the .npy stream lies in the file (an uncompressed member of
        a .npz archive); the whole file by default. ``what`` names it in errors."""
        self.path = path
        what = what or path
        self._map: mmap.mmap | None = None
        with open_input(path) as f:
            f.seek(start)
            shape, fortran, dtype = read_header(f, what)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size if end is None else end
            need = math.prod(shape) * dtype.itemsize
            if size - offset < need:
                raise DataError(f"{what} is truncated: shape {shape} of {dtype.name} needs {need} "
                                f"bytes of data, the file has {max(size - offset, 0)}")
            if need == 0:
                self.array = np.zeros(shape, dtype)
                return
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.array = np.ndarray(shape, dtype, buffer=self._map, offset=offset,
                                order="F" if fortran else "C")

    def release(self) -> None:
        """Drop the pages read so far from this process (they stay in the page cache)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.array = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still exists; the mapping goes with it
                pass
            self._map = None

    def __enter__(self) -> "NpyFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
