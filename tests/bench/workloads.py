"""The benchmark workload suite, shared by the benchmark scripts.

Each workload gives its input arrays, the tensordb graph that computes it, the same computation
in NumPy's formulations (``forms``: its operator form where the workload has one, ``A @ B`` or
``np.matmul``, written per workload; ``np.einsum(optimize=True)``; ``opt_einsum.contract``), of
which the benchmark takes the fastest, and in dask.array (with a few chunkings to pick the best
from). The first form is the reference the others and tensordb are checked against (``numpy``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import opt_einsum as oe

import tensordb

F32 = np.float32
F64 = np.float64


@dataclass
class Workload:
    name: str
    arrays: Callable[[np.random.Generator], dict[str, np.ndarray]]
    graph: Callable[[], tensordb.Graph]
    forms: dict[str, Callable[[dict], np.ndarray]]         # NumPy formulations, by name
    dask: Callable[[dict, object], object] | None = None   # (arrays, chunk) -> dask array
    chunks: list = field(default_factory=list)             # chunkings to try for dask
    output: str = "OUT"
    tile: dict[str, tuple] = field(default_factory=dict)   # stored tiling per input
    note: str = ""
    dense: bool = True   # counted in the dense geometric means
    blas: bool = True    # a product-and-sum (min-plus is not)

    @property
    def numpy(self) -> Callable[[dict], np.ndarray]:
        """The reference formulation (the first form)."""
        return next(iter(self.forms.values()))


def _rand(rng, *shape, dtype=F32):
    return rng.standard_normal(shape, dtype=dtype)


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


def _einsum_forms(spec: str, names: list[str], operator=None) -> dict:
    """NumPy's formulations of an einsum: opt_einsum.contract (the reference, as before: it also
    runs on CuPy arrays for bench_distributed), np.einsum(optimize=True), and ``operator`` (the
    workload's operator form, when it has one)."""
    forms = {"opt_einsum": lambda a: oe.contract(spec, *[a[n] for n in names]),
             "np.einsum": lambda a: np.einsum(spec, *[a[n] for n in names], optimize=True)}
    if operator is not None:
        forms[operator[0]] = operator[1]
    return forms


def _einsum_workload(name, spec, shapes, chunks, operator=None, dtype=F32, **kw) -> Workload:
    names = [f"T{i}" for i in range(len(shapes))]
    return Workload(
        name,
        arrays=lambda rng: {n: _rand(rng, *s, dtype=dtype) for n, s in zip(names, shapes)},
        graph=lambda: tensordb.Graph().einsum(spec, *names, into="OUT"),
        forms=_einsum_forms(spec, names, operator),
        dask=lambda a, c: _da().einsum(spec, *[_da().from_array(a[n], chunks=c) for n in names],
                                       optimize=True),
        chunks=chunks, **kw)


def _matmul_workload(name, m, k, n, chunks, dtype=F32) -> Workload:
    return Workload(
        name,
        arrays=lambda rng: {"A": _rand(rng, m, k, dtype=dtype), "B": _rand(rng, k, n, dtype=dtype)},
        graph=lambda: tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT"),
        forms={"A @ B": lambda a: a["A"] @ a["B"],
               "np.einsum": lambda a: np.einsum("ij,jk->ik", a["A"], a["B"], optimize=True),
               "opt_einsum": lambda a: oe.contract("ij,jk->ik", a["A"], a["B"])},
        dask=lambda a, c: _da().matmul(_da().from_array(a["A"], chunks=c),
                                       _da().from_array(a["B"], chunks=c)),
        chunks=chunks)


def _gram() -> Workload:
    m, n = 262144, 128
    return Workload(
        f"tall-skinny Gram X^T X {m}x{n}",
        arrays=lambda rng: {"X": _rand(rng, m, n)},
        graph=lambda: tensordb.Graph().einsum("ij,ik->jk", "X", "X", into="OUT"),
        forms={"X.T @ X": lambda a: a["X"].T @ a["X"],
               "np.einsum": lambda a: np.einsum("ij,ik->jk", a["X"], a["X"], optimize=True),
               "opt_einsum": lambda a: oe.contract("ij,ik->jk", a["X"], a["X"])},
        dask=lambda a, c: (lambda x: x.T @ x)(_da().from_array(a["X"], chunks=c)),
        chunks=[(16384, 128), (32768, 128), (65536, 128)])


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
        forms={"X @ W": lambda a: np.maximum(a["X"] @ a["W"] + a["c"], 0),
               "np.einsum": lambda a: np.maximum(
                   np.einsum("bh,hf->bf", a["X"], a["W"], optimize=True) + a["c"], 0),
               "opt_einsum": lambda a: np.maximum(
                   oe.contract("bh,hf->bf", a["X"], a["W"]) + a["c"], 0)},
        dask=dask_mlp, chunks=[(2048, 1024), (4096, 1024), (1024, 4096)])


def _mlp2() -> Workload:
    """A 2-layer MLP forward: relu(X W1 + c) W2, X 4096x1024, W1 1024x4096, W2 4096x1024."""
    b, h, f, o = 4096, 1024, 4096, 1024

    def forms():
        def layers(mm):
            return lambda a: mm(np.maximum(mm(a["X"], a["W1"]) + a["c"], 0), a["W2"])
        return {"X @ W": layers(np.matmul),
                "np.einsum": layers(lambda x, w: np.einsum("ij,jk->ik", x, w, optimize=True)),
                "opt_einsum": layers(lambda x, w: oe.contract("ij,jk->ik", x, w))}

    def dask_mlp2(a, c):
        da = _da()
        x = da.from_array(a["X"], chunks=c)
        w1, w2 = da.from_array(a["W1"], chunks=c), da.from_array(a["W2"], chunks=c)
        return da.maximum(x @ w1 + a["c"], 0) @ w2

    return Workload(
        f"2-layer mlp relu(XW1+c)W2 {b}x{h}x{f}x{o}",
        arrays=lambda rng: {"X": _rand(rng, b, h), "W1": _rand(rng, h, f) / 32,
                            "c": _rand(rng, f), "W2": _rand(rng, f, o) / 64},
        graph=lambda: (tensordb.Graph()
                       .einsum("bh,hf->bf", "X", "W1", into="Z", store=False)
                       .op("H", "bf", [("Z", "bf"), ("c", "f")], join="relu(x0 + x1)", store=False)
                       .einsum("bf,fo->bo", "H", "W2", into="OUT")),
        forms=forms(), dask=dask_mlp2, chunks=[(1024, 1024), (2048, 1024), (4096, 1024)])


def _network() -> Workload:
    """A 4-operand tensor network: the trace of a product of four 1024x1024 matrices."""
    n = 1024
    return _einsum_workload(
        f"tensor network ab,bc,cd,da-> {n}", "ab,bc,cd,da->", [(n, n)] * 4,
        [(256, 256), (512, 512), (1024, 1024)],
        operator=("(AB * (CD).T).sum()",
                  lambda a: ((a["T0"] @ a["T1"]) * (a["T2"] @ a["T3"]).T).sum()))


def _attention() -> Workload:
    h, t, d = 16, 1024, 64

    def softmax(s):
        e = np.exp(s - s.max(axis=2, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    forms = {"Q @ K^T": lambda a: softmax(a["Q"] @ a["K"].transpose(0, 2, 1) / 8),
             "np.einsum": lambda a: softmax(
                 np.einsum("htd,hsd->hts", a["Q"], a["K"], optimize=True) / 8),
             "opt_einsum": lambda a: softmax(oe.contract("htd,hsd->hts", a["Q"], a["K"]) / 8)}

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
        forms=forms, dask=dask_attn, chunks=[(2, 1024, 64), (4, 1024, 64), (8, 1024, 64)])


def _sparse(density: float) -> Workload:
    n, tile = 8192, 256
    return Workload(
        f"block-sparse matmul {n} tiles {tile} density {density:.0%}",
        arrays=lambda rng: {"A": _block_sparse(rng, n, tile, density),
                            "B": _block_sparse(rng, n, tile, density)},
        graph=lambda: tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT"),
        forms={"A @ B": lambda a: a["A"] @ a["B"]},
        dask=lambda a, c: _da().matmul(_da().from_array(a["A"], chunks=c),
                                       _da().from_array(a["B"], chunks=c)),
        chunks=[(2048, 2048), (4096, 4096)], dense=False,
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
        forms={"blocked broadcast": np_minplus}, dask=dask_minplus, chunks=[(128, 128), (256, 256)],
        blas=False)


def _batched() -> Workload:
    return _einsum_workload("batched bij,bjk->bik 32x512", "bij,bjk->bik",
                            [(32, 512, 512), (32, 512, 512)],
                            [(4, 512, 512), (8, 512, 512), (16, 512, 512)],
                            operator=("np.matmul", lambda a: np.matmul(a["T0"], a["T1"])))


def _chain(name, spec, shapes, chunks) -> Workload:
    n = len(shapes)
    return _einsum_workload(name, spec, shapes, chunks, operator=(
        "multi_dot", lambda a: np.linalg.multi_dot([a[f"T{i}"] for i in range(n)])))


def suite() -> list[Workload]:
    return [
        _matmul_workload("square matmul 4096", 4096, 4096, 4096, [(2048, 2048), (4096, 4096), (1024, 4096)]),
        _matmul_workload("float64 matmul 2048", 2048, 2048, 2048, [(1024, 1024), (2048, 2048), (1024, 2048)],
                         dtype=F64),
        _matmul_workload("skinny matmul 131072x256x256", 131072, 256, 256, [(16384, 256), (32768, 256), (65536, 256)]),
        _matmul_workload("inner-product matmul 256x131072x256", 256, 131072, 256, [(256, 16384), (256, 32768), (256, 65536)]),
        _gram(),
        _batched(),
        _chain("3-matrix chain 8192x1024x8192x1024", "ij,jk,kl->il",
               [(8192, 1024), (1024, 8192), (8192, 1024)],
               [(2048, 1024), (4096, 1024), (1024, 8192)]),
        _chain("5-matrix chain 4096/1024 alternating", "ij,jk,kl,lm,mn->in",
               [(4096, 1024), (1024, 4096), (4096, 1024), (1024, 4096), (4096, 1024)],
               [(1024, 1024), (2048, 1024), (4096, 4096)]),
        _network(),
        _mlp(),
        _mlp2(),
        _attention(),
        _sparse(0.01),
        _sparse(0.10),
        _min_plus(),
    ]
