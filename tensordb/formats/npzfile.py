"""The members of a .npz archive as arrays the loader can cut into tiles without holding them.

A member stored uncompressed (``np.savez``) is a .npy stream at a known place in the archive:
it is memory-mapped there (npyfile.NpyFile), as a .npy file is. A compressed member
(``np.savez_compressed``) is inflated as it is read: in C order the loader asks for the tiles of
one slab of rows after another, so ``SlabArray`` reads one slab at a time with ``readinto`` and
keeps only that slab. When a slab would be much larger than a tile (Fortran order, or rows so long
that tiles cut them) the member is inflated into a temporary file next to the database and
memory-mapped from there, then deleted.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import struct
import tempfile
import zipfile
import zlib

import numpy as np

from ..errors import DataError
from ..geometry import default_tile_shape
from ..storage.meta import check_tile_shape
from .npyfile import NpyFile, read_header
from ..storage.directory import MEMBER_PREFIX

__all__ = ["member_info", "open_member"]

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra length
_PIECE = 1 << 20  # bytes inflated per read
_SLAB_FLOOR = 64 << 20  # bytes: a slab up to this (or 4 tiles) is read whole; beyond, a file


def member_info(z: zipfile.ZipFile, member: str) -> zipfile.ZipInfo:
    names = z.namelist()
    return z.getinfo(member + ".npy" if member + ".npy" in names else member)


@contextlib.contextmanager
def open_member(z: zipfile.ZipFile, path: str, member: str, *, tile, name: str, scratch: str):
    """Yield ``(array, tile_shape, after_tile)`` for member ``member`` of the open archive ``z``
    (the file at ``path``); the header was checked (load._check_member). ``scratch``: a
    directory for the temporary file a member may need."""
    what = f"{path}['{member}']"
    info = member_info(z, member)
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        start = _data_start(path, info)
        with NpyFile(path, start=start, end=start + info.file_size, what=what) as npy:
            yield npy.array, _tile_shape(tile, npy.array, name), npy.release
        return
    with z.open(info) as f:
        shape, fortran, dtype = read_header(f, what)
        tile_shape = _tile_shape(tile, np.empty((0,) * len(shape), dtype), name, shape)
        slab = _slab_bytes(shape, dtype, tile_shape)
        tile_bytes = math.prod(tile_shape) * dtype.itemsize
        if not fortran and slab <= max(_SLAB_FLOOR, 4 * tile_bytes):
            yield SlabArray(f, shape, dtype, what), tile_shape, None
            return
    # Inflate into a file and map it; the file goes when the load ends, loaded or not.
    fd, tmp = tempfile.mkstemp(prefix=MEMBER_PREFIX, suffix=".npy", dir=scratch)
    try:
        with os.fdopen(fd, "wb") as out, z.open(info) as f:
            _copy(f, out, what)
        with NpyFile(tmp, what=what) as npy:
            yield npy.array, tile_shape, npy.release
    finally:
        os.unlink(tmp)


def _tile_shape(tile, arr, name, shape=None):
    shape = arr.shape if shape is None else shape
    return (check_tile_shape(tile, shape, name) if tile is not None
            else default_tile_shape(shape, arr.dtype))


def _slab_bytes(shape, dtype, tile_shape) -> int:
    if not shape:
        return dtype.itemsize
    return min(tile_shape[0], shape[0]) * math.prod(shape[1:]) * dtype.itemsize


def _data_start(path: str, info: zipfile.ZipInfo) -> int:
    """Where an uncompressed member's bytes begin: after its local header, whose extra field
    may differ in length from the central directory's."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        raw = f.read(_LOCAL_HEADER.size)
    if len(raw) < _LOCAL_HEADER.size:
        raise DataError(f"{path} is truncated: member '{info.filename}' has no local header")
    sig, name_len, extra_len = _LOCAL_HEADER.unpack(raw)
    if sig != b"PK\x03\x04":
        raise DataError(f"{path}: member '{info.filename}' has a corrupt local header")
    return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len


def _copy(f, out, what: str) -> None:
    try:
        shutil.copyfileobj(f, out, 8 << 20)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(f"cannot read {what}: {exc}") from None


class SlabArray:
    """A C-ordered array read forward from a stream, one slab of leading-dimension rows at a time:
    ``arr[rows, ...]`` for slabs in increasing order (what load_array asks for). Only the
    current slab is held; a slab is read when first asked for."""

    def __init__(self, f, shape, dtype, what: str) -> None:
        self.f, self.shape, self.dtype, self.what = f, tuple(shape), np.dtype(dtype), what
        self.ndim = len(self.shape)
        self._row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize if self.shape else 0
        self._lo = self._hi = 0  # rows held in self._slab
        self._slab = None

    def __getitem__(self, key):
        if not self.ndim:
            return self._read(1).reshape(())
        rows, rest = key[0], key[1:]
        a, b = rows.start, rows.stop
        if not self._lo <= a or not b <= self._hi or self._slab is None:
            if a < self._hi:
                raise DataError(f"{self.what}: a compressed member is read forward only")
            if a > self._hi:
                self._read(a - self._hi)  # skipped rows (the loader skips none)
            self._slab = None  # free the previous slab before reading the next
            self._slab = self._read(b - a).reshape((b - a,) + self.shape[1:])
            self._lo, self._hi = a, b
        return self._slab[(slice(a - self._lo, b - self._lo),) + tuple(rest)]

    def _read(self, rows: int) -> np.ndarray:
        n = rows * self._row_bytes if self.ndim else self.dtype.itemsize
        buf = np.empty(n // self.dtype.itemsize, self.dtype)
        view, got = memoryview(buf).cast("B"), 0
        try:
            while got < n:
                # Bounded pieces: a zip member's readinto reads into a temporary bytes object.
                k = self.f.readinto(view[got:got + _PIECE])
                if not k:
                    raise DataError(f"{self.what} is truncated: the member ends before its data")
                got += k
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise DataError(f"cannot read {self.what}: {exc}") from None
        return buf
