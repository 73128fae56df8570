"""The benchmark workload suite, shared by the benchmark scripts.

Each workload gives its input arrays, the tensordb graph that computes it, and the same
computation in NumPy/opt_einsum and in dask.array (with a few chunkings to pick the best from).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import opt_einsum as oe

import tensordb

F32 = np.float32


@dataclass
class Workload:
    name: str
    arrays: Callable[[np.random.Generator], dict[str, np.ndarray]]
    graph: Callable[[], tensordb.Graph]
    numpy: Callable[[dict], np.ndarray]
    dask: Callable[[dict, object], object] | None = None   # (arrays, chunk) -> dask array
    chunks: list = field(default_factory=list)             # chunkings to try for dask
    output: str = "OUT"
    tile: dict[str, tuple] = field(default_factory=dict)   # stored tiling per input
    note: str = ""


def _rand(rng, *shape):
    return rng.standard_normal(shape, dtype=F32)


def _block_sparse(rng, n, tile, density):
    t = n // tile
    mask = rng.random((t, t)) < density
    if not mask.any():
        mask[0, 0] = True
    a = np.zeros((n, n), F32)
    for i, j in zip(*np.nonzero(mask)):
        a[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile] = _rand(rng, tile, tile)
    return a


def _da():
    import dask.array as da
    return da


def _einsum_workload(name, spec, shapes, chunks, **kw) -> Workload:
    names = [f"T{i}" for i in range(len(shapes))]
    return Workload(
        name,
        arrays=lambda rng: {n: _rand(rng, *s) for n, s in zip(names, shapes)},
        graph=lambda: tensordb.Graph().einsum(spec, *names, into="OUT"),
        numpy=lambda a: oe.contract(spec, *[a[n] for n in names]),
        dask=lambda a, c: _da().einsum(spec, *[_da().from_array(a[n], chunks=c) for n in names],
                                       optimize=True),
        chunks=chunks, **kw)


def _matmul_workload(name, m, k, n, chunks) -> Workload:
    return Workload(
        name,
        arrays=lambda rng: {"A": _rand(rng, m, k), "B": _rand(rng, k, n)},
        graph=lambda: tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT"),
        numpy=lambda a: a["A"] @ a["B"],
        dask=lambda a, c: _da().matmul(_da().from_array(a["A"], chunks=c),
                                       _da().from_array(a["B"], chunks=c)),
        chunks=chunks)


def _mlp() -> Workload:
    def dask_mlp(a, c):
        da = _da()
        x, w = da.from_array(a["X"], chunks=c), da.from_array(a["W"], chunks=c)
        return da.maximum(x @ w + a["c"], 0)
    return Workload(
        "mlp layer relu(XW+c) 8192x1024x4096",
        arrays=lambda rng: {"X": _rand(rng, 8192, 1024), "W": _rand(rng, 1024, 4096),
                            "c": _rand(rng, 4096)},
        graph=lambda: (tensordb.Graph()
                       .einsum("bh,hf->bf", "X", "W", into="Z", store=False)
                       .op("OUT", "bf", [("Z", "bf"), ("c", "f")], join="relu(x0 + x1)")),
        numpy=lambda a: np.maximum(a["X"] @ a["W"] + a["c"], 0),
        dask=dask_mlp, chunks=[(2048, 1024), (4096, 1024), (1024, 4096)])


def _attention() -> Workload:
    h, t, d = 16, 1024, 64

    def np_attn(a):
        s = np.einsum("htd,hsd->hts", a["Q"], a["K"], optimize=True) / 8
        e = np.exp(s - s.max(axis=2, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    def dask_attn(a, c):
        da = _da()
        q, k = da.from_array(a["Q"], chunks=c), da.from_array(a["K"], chunks=c)
        s = da.einsum("htd,hsd->hts", q, k, optimize=True) / 8
        e = da.exp(s - s.max(axis=2, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    return Workload(
        "attention softmax(QK^T/8) h16 t1024 d64",
        arrays=lambda rng: {"Q": _rand(rng, h, t, d), "K": _rand(rng, h, t, d)},
        graph=lambda: (tensordb.Graph()
                       .op("S", "hts", [("Q", "htd"), ("K", "hsd")], join="x0 * x1 / 8", store=False)
                       .op("M", "ht", [("S", "hts")], join="x0", agg="max", store=False)
                       .op("E", "hts", [("S", "hts"), ("M", "ht")], join="exp(x0 - x1)", store=False)
                       .op("Z", "ht", [("E", "hts")], join="x0", agg="sum", store=False)
                       .op("OUT", "hts", [("E", "hts"), ("Z", "ht")], join="x0 / x1")),
        numpy=np_attn, dask=dask_attn, chunks=[(2, 1024, 64), (4, 1024, 64), (8, 1024, 64)])


def _sparse(density: float) -> Workload:
    n, tile = 8192, 256
    return Workload(
        f"block-sparse matmul {n} tiles {tile} density {density:.0%}",
        arrays=lambda rng: {"A": _block_sparse(rng, n, tile, density),
                            "B": _block_sparse(rng, n, tile, density)},
        graph=lambda: tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT"),
        numpy=lambda a: a["A"] @ a["B"],
        dask=lambda a, c: _da().matmul(_da().from_array(a["A"], chunks=c),
                                       _da().from_array(a["B"], chunks=c)),
        chunks=[(2048, 2048), (4096, 4096)],
        tile={"A": (tile, tile), "B": (tile, tile)},
        note="numpy and dask compute the same matmul dense")


def _min_plus() -> Workload:
    n = 1024

    def np_minplus(a):
        d = a["D"]
        out = np.full((n, n), np.inf, F32)
        for k0 in range(0, n, 16):
            blk = d[:, k0:k0 + 16, None] + d[None, k0:k0 + 16, :]
            np.minimum(out, blk.min(axis=1), out=out)
        return out

    def dask_minplus(a, c):
        da = _da()
        d = da.from_array(a["D"], chunks=c)
        return (d[:, :, None] + d[None, :, :]).min(axis=1)

    return Workload(
        f"min-plus product {n}",
        arrays=lambda rng: {"D": np.abs(_rand(rng, n, n))},
        graph=lambda: tensordb.Graph().op("OUT", "ij", [("D", "ik"), ("D", "kj")],
                                          join="x0 + x1", agg="min"),
        numpy=np_minplus, dask=dask_minplus, chunks=[(128, 128), (256, 256)])


def suite() -> list[Workload]:
    return [
        _matmul_workload("square matmul 4096", 4096, 4096, 4096, [(2048, 2048), (4096, 4096), (1024, 4096)]),
        _matmul_workload("skinny matmul 131072x256x256", 131072, 256, 256, [(16384, 256), (32768, 256), (65536, 256)]),
        _matmul_workload("inner-product matmul 256x131072x256", 256, 131072, 256, [(256, 16384), (256, 32768), (256, 65536)]),
        _einsum_workload("batched bij,bjk->bik 32x512", "bij,bjk->bik", [(32, 512, 512), (32, 512, 512)],
                         [(4, 512, 512), (8, 512, 512), (16, 512, 512)]),
        _einsum_workload("3-matrix chain 8192x1024x8192x1024", "ij,jk,kl->il",
                         [(8192, 1024), (1024, 8192), (8192, 1024)],
                         [(2048, 1024), (4096, 1024), (1024, 8192)]),
        _einsum_workload("5-matrix chain 4096/1024 alternating", "ij,jk,kl,lm,mn->in",
                         [(4096, 1024), (1024, 4096), (4096, 1024), (1024, 4096), (4096, 1024)],
                         [(1024, 1024), (2048, 1024), (4096, 4096)]),
        _mlp(),
        _attention(),
        _sparse(0.01),
        _sparse(0.10),
        _min_plus(),
    ]
