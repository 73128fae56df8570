"""A stored output tile written by a worker in another process, straight into its place in the
new payload file on the declared storage (``storage='shared'``): the client lays the file out
(``TensorWriter.reserve(..., remote=True)``: every tile's offset, the file's blocks allocated),
hands each worker the ``TileSlot`` of the tiles it computes, and gets back only their
``TileFacts`` (bytes, nonzeros, NaN/inf flag, CRC-32), which its catalog commit records as the
local pool's would. The bytes are the tile's C-ordered bytes at the slot's offset, the facts
those of ``tilestats.tile_stats``: the same file and rows the local pool writes.

A worker checks the database's id before it opens the file (identity.py), opens it without
creating it (a query the client gave up has deleted it: the write fails and leaves nothing),
and, where the commit fsyncs, starts the write-back of what it wrote (writeback.py) and closes
the file: on one machine the pages are the file's, which the client's fsync at commit writes;
on NFS a close sends the data to the server and the client's fsync (a COMMIT) makes the server
write all of the file's. An fdatasync per tile here cost 5 ms a tile (256 KiB, this machine).

    >>> slot = TileSlot("/db/tiles/7-0123456789abcdef.bin", 0, (2, 2), "<f8", None, False, "C")
    >>> write_slot(slot, np.eye(2)).nnz                  # doctest: +SKIP
    2
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import DataError, OperationalError
from .identity import check_database
from .tilestats import has_negative_zero, tile_stats
from .writeback import start_writeback

__all__ = ["TileSlot", "TileFacts", "write_slot"]


@dataclass(frozen=True)
class TileSlot:
    """Where one output tile goes: ``offset`` in payload file ``path``, its ``shape`` and
    ``dtype`` (a NumPy dtype string), the database's id (None: an older database), whether the
    commit fsyncs, and the tensor's name (for messages)."""

    path: str
    offset: int
    shape: tuple
    dtype: str
    database: str | None
    fsync: bool
    tensor: str


@dataclass(frozen=True)
class TileFacts:
    """What a tile's catalog row records, from the worker that wrote it. ``keep``: whether it
    gets a row (not all zero, or a ``-0.0`` among its zeros, as the writer's rule)."""

    nbytes: int
    nnz: int
    nonfinite: bool
    crc32: int
    keep: bool


def flat_tile(slot, tile, where: str) -> tuple:
    """``tile`` checked against its place ``slot`` (a DataError naming the tensor, the shapes and
    ``where`` the place is) and flattened to the place's dtype: (the bytes, nnz, NaN/inf flag,
    CRC-32, whether it is stored at all: an all-zero tile without a -0.0 is absent)."""
    a = np.asarray(tile)
    if a.shape != tuple(slot.shape):
        raise DataError(f"tensor '{slot.tensor}': a tile of shape {a.shape} for a place of "
                        f"shape {tuple(slot.shape)} in {where}")
    flat = np.ascontiguousarray(a, dtype=np.dtype(slot.dtype)).reshape(-1)
    nnz, nonfinite, crc = tile_stats(flat)
    return flat, nnz, nonfinite, crc, bool(nnz) or has_negative_zero(flat)


def write_slot(slot: TileSlot, tile) -> TileFacts:
    """Write ``tile`` into ``slot`` (on the worker that computed it) and return its facts."""
    flat, nnz, nonfinite, crc, keep = flat_tile(slot, tile, slot.path)
    facts = TileFacts(int(flat.nbytes), int(nnz), bool(nonfinite), int(crc), keep)
    if not keep:  # no row: its place stays as allocated (zeros), as the local pool leaves it
        return facts
    check_database(slot.path, slot.database, slot.tensor)
    try:
        fd = os.open(slot.path, os.O_WRONLY)  # never O_CREAT: a dropped query's file stays gone
    except OSError as exc:
        raise OperationalError(f"cannot write a tile of '{slot.tensor}' to {slot.path}: "
                               f"{exc.strerror or exc} (the query was given up, or the storage "
                               f"is not where it was declared)") from None
    try:
        view = memoryview(flat).cast("B")
        at = 0
        while at < len(view):
            at += os.pwrite(fd, view[at:], slot.offset + at)
        if slot.fsync:
            start_writeback(fd, slot.offset, flat.nbytes)
    except OSError as exc:
        raise OperationalError(f"cannot write a tile of '{slot.tensor}' to {slot.path}: "
                               f"{exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return facts
