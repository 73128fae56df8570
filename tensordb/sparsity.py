"""The one rule for storing a tile dense or sparse, and the sizes it rests on. Every stage may use
it: the writer chooses each tile's format with it, the loaders size sparse tensors' tiles with it,
and the planner reads the same sizes.

A sparse tile holds its stored entries (``nse``: its nonzeros, and any ``-0.0``) as values plus
indices: CSR for a matrix (row pointers, column indices), COO for any other rank (one index per
dimension per entry), and for a hypersparse matrix (CSR more than twice COO's bytes: many more
rows than entries). Indices are int32 where every extent and the entry count fit, int64
otherwise. A tile is stored sparse when that takes less than half the bytes of its dense form.
A sparse tensor's default tile holds at most ``MAX_TILE_ELEMENTS`` (2**62) elements, so an
entry's linear index within its tile is an int64 (``fit_elements``).

>>> choose_format((1000, 1000), 2000, "float32")
'csr'
>>> choose_format((10**8, 10**8), 5, "float64")
'coo'
>>> choose_format((1000, 1000), 400_000, "float32")
'dense'
>>> choose_format((10, 10, 10), 3, "float64")
'coo'
>>> sparse_tile_shape((50_000, 50_000), 500_000, "float32")
(50000, 50000)
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["FORMATS", "SPARSE_FORMATS", "HEADER_BYTES", "choose_format", "index_dtype",
           "sparse_nbytes", "dense_nbytes", "is_sparse_overall", "sparse_tile_shape",
           "TARGET_TILE_NSE", "MAX_TILE_ELEMENTS", "fit_elements"]

FORMATS = ("dense", "csr", "coo")
SPARSE_FORMATS = ("csr", "coo")
HEADER_BYTES = 8          # a sparse payload starts with its entry count (int64)
SPARSE_RATIO = 0.5        # sparse when its bytes are under this share of the dense bytes
TARGET_TILE_NSE = 1 << 21  # stored entries a sparse tensor's default tile aims at (about 16 MiB)
_INT32_MAX = np.iinfo(np.int32).max
COO_GAIN = 2  # a matrix tile is COO where CSR would take more than twice its bytes
MAX_TILE_ELEMENTS = 1 << 62  # a tile's C-order linear indices stay int64 (numpy's limit: 2**63-1)


def index_dtype(shape: Sequence[int], nse: int) -> np.dtype:
    """int32 when every extent, and the entry count (CSR's row pointers), fit; else int64."""
    return np.dtype(np.int32) if max(list(shape) + [nse]) <= _INT32_MAX else np.dtype(np.int64)


def _values_bytes(nse: int, itemsize: int) -> int:
    n = nse * itemsize
    return n + (-n % 8)  # indices start 8-byte aligned


def sparse_nbytes(shape: Sequence[int], nse: int, dtype, fmt: str) -> int:
    """Payload bytes of a sparse tile of ``shape`` holding ``nse`` entries in format ``fmt``:
    header, values (padded to 8 bytes), then the indices."""
    isz = index_dtype(shape, nse).itemsize
    values = _values_bytes(nse, np.dtype(dtype).itemsize)
    if fmt == "csr":
        return HEADER_BYTES + values + (shape[0] + 1 + nse) * isz
    if fmt == "coo":
        return HEADER_BYTES + values + len(shape) * nse * isz
    raise ValueError(f"unknown sparse format {fmt!r}")


def dense_nbytes(shape: Sequence[int], dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def choose_format(shape: Sequence[int], nse: int, dtype) -> str:
    """'dense', 'csr' (a matrix) or 'coo' (any rank of at least 1) for a tile of ``shape``
    with ``nse`` stored entries: sparse when its payload is under half its dense bytes; a matrix
    is CSR unless CSR's bytes are more than twice COO's (about three times more rows than
    entries: its row pointers would be most of its bytes, 381 MiB for 5 entries in 10^8
    rows); a tile that is nearly as small as CSR stays CSR, the format its kernels read."""
    shape = tuple(int(n) for n in shape)
    if not shape:
        return "dense"
    fmt = "coo"
    if len(shape) == 2 and sparse_nbytes(shape, nse, dtype, "csr") <= \
            COO_GAIN * sparse_nbytes(shape, nse, dtype, "coo"):
        fmt = "csr"  # the kernels' format; a hypersparse matrix (rows >> entries) is COO
    if sparse_nbytes(shape, nse, dtype, fmt) < SPARSE_RATIO * dense_nbytes(shape, dtype):
        return fmt
    return "dense"


def is_sparse_overall(shape: Sequence[int], nnz: int, dtype) -> bool:
    """Whether a tensor of ``shape`` with ``nnz`` nonzeros, taken whole, would be stored sparse:
    then its default tiles are sized by nonzeros (``sparse_tile_shape``), not by extent."""
    return choose_format(shape, nnz, dtype) != "dense"


def sparse_tile_shape(shape: Sequence[int], nnz: int, dtype,
                      target: int = TARGET_TILE_NSE) -> tuple[int, ...]:
    """Default tile extents of a sparse tensor: about ``target`` nonzeros per tile if they are
    spread evenly, cutting the first dimension only (row slabs: a matrix's tiles are CSR row
    blocks, whole rows each). A 1M x 1M graph of 10M edges is 5 tiles, not a million."""
    shape = tuple(int(n) for n in shape)
    if not shape:
        return ()
    pieces = max(1, math.ceil(max(nnz, 1) / target))
    first = max(1, math.ceil(max(shape[0], 1) / pieces))
    return fit_elements((min(first, max(shape[0], 1)),) + tuple(max(n, 1) for n in shape[1:]))


def fit_elements(tile: Sequence[int], limit: int = MAX_TILE_ELEMENTS) -> tuple[int, ...]:
    """``tile`` cut, first dimension first, until it holds at most ``limit`` elements, so that
    linear indices within a tile fit int64 (a 10^10 x 10^10 matrix's tiles are row slabs of
    4.6 x 10^8 rows; the tensor itself need not fit).

    >>> fit_elements((10**10, 10**10))
    (461168601, 10000000000)
    >>> fit_elements((10**7, 10**7, 10**7))
    (46116, 10000000, 10000000)
    >>> fit_elements((3, 4))
    (3, 4)
    """
    tile = [max(int(n), 1) for n in tile]
    for d in range(len(tile)):
        rest = math.prod(tile[d + 1:])
        if tile[d] * rest <= limit:
            break
        tile[d] = max(1, limit // rest)
    return tuple(tile)
