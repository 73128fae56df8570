"""Ctrl-C during a large sparse kernel call (issue 26, item 6): the call runs in row bands of its
sparse operand with ``check`` between them (exec/sparse_bands.py), so a real KeyboardInterrupt
stops the statement within a band, stores nothing and leaves the connection usable; the banded
result is the one call's, bit for bit, for every sparse method and several dtypes (bands forced
small through ``FORCE_ROWS``), checked against numpy on the densified inputs too."""
from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec import sparse_bands
from tensordb.storage.sparse import Filled

ROOT = Path(__file__).parents[2]
INF = np.inf


def _graph(n, density, seed, dtype=np.float64, low=1, high=10):
    a = sp.random_array((n, n), density=density, rng=np.random.default_rng(seed), format="csr")
    a.data = np.round(a.data * (high - low)) + low  # integral values: exact sums, any order
    return a.astype(dtype)


def _method(con, sql):
    out = con.explain(sql, format="json")
    out = out if isinstance(out, dict) else json.loads(out)
    return out["nodes"][0]["kernel"]["method"]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.dtype, a.shape, a.tobytes()


@pytest.fixture
def bands(monkeypatch):
    """Counts the bands made; ``bands.force(rows)`` bands every call by ``rows``, ``bands.one()``
    makes every call one call."""
    made = []
    rows = sparse_bands._rows

    def counted(a, ax, r0, r1):
        made.append((r0, r1))
        return rows(a, ax, r0, r1)
    monkeypatch.setattr(sparse_bands, "_rows", counted)

    class Bands:
        count = made

        @staticmethod
        def force(n):
            monkeypatch.setattr(sparse_bands, "FORCE_ROWS", n)
            monkeypatch.setattr(sparse_bands, "SMALL_WORK", 1 << 21)

        @staticmethod
        def one():
            monkeypatch.setattr(sparse_bands, "FORCE_ROWS", None)
            monkeypatch.setattr(sparse_bands, "SMALL_WORK", 1 << 62)
    return Bands


N = 70


def _cases(dtype):
    """(sql, the kernel method the plan must choose, operands, numpy's answer)."""
    rng = np.random.default_rng(3)
    A = _graph(N, 0.05, 1, dtype)
    B = _graph(N, 0.05, 2, dtype)
    Ad, Bd = A.toarray(), B.toarray()
    M = np.round(rng.random((N, 5)) * 8).astype(dtype)
    x = np.round(rng.random(N) * 8).astype(dtype)
    U = np.round(rng.random((N, 4)) * 4).astype(dtype)
    V = np.round(rng.random((N, 4)) * 4).astype(dtype)
    ops = {"A": A, "B": B, "M": M, "x": x, "U": U, "V": V}
    cases = [
        ("Y[i,k] = SUM(A[i,j] * M[j,k])", "spmm", Ad @ M),
        ("w[i] = SUM(A[i,j] * x[j])", "spmm", Ad @ x),
        ("C[i,k] = SUM(A[i,j] * B[j,k])", "spmm", Ad @ Bd),
        ("T[k,i] = SUM(A[i,j] * B[j,k])", "spmm", (Ad @ Bd).T),
        ("X[i,k] = MAX(A[i,j] * B[j,k])", "semiring", (Ad[:, :, None] * Bd[None]).max(axis=1)),
        ("t = SUM(A[i,j] * A[j,k] * A[k,i])", "masked",
         np.einsum("ij,jk,ki->", Ad, Ad, Ad)),
        ("S[i,j] = SUM(A[i,j] * U[i,r] * V[j,r])", "sddmm", Ad * (U @ V.T)),
        ("J[i,j] = A[i,j] * B[i,j]", "spjoin", Ad * Bd),
        ("K[i,j] = A[i,j] + B[j,i]", "spjoin", Ad + Bd.T),
        ("r[i] = SUM(A[i,j])", "spreduce", Ad.sum(axis=1)),
        ("m[i] = MAX(A[i,j])", "spreduce", Ad.max(axis=1)),
    ]
    return ops, cases


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("tile", [None, (16, N)])
def test_banded_results_equal_the_one_call_bit_for_bit(tmp_path, bands, dtype, tile):
    """Every sparse method, bands of 7 rows (and of 16-row stored tiles: spmm's box of row
    tiles) against one call, and both against numpy on the dense operands."""
    ops, cases = _cases(dtype)
    seen = set()
    with tensordb.connect(tmp_path / "b.tdb", workers=2) as con:
        for name, a in ops.items():
            con.load(name, a, **({"tile": tile} if tile is not None and a.ndim == 2 and
                                 sp.issparse(a) else {}))
        for sql, method, expect in cases:
            assert _method(con, sql) == method, sql
            seen.add(method)
            name = sql.split("[")[0].split(" ")[0]
            bands.one()
            del bands.count[:]
            con.execute(sql)
            assert not bands.count, sql
            one = con.tensor(name)
            one_nnz = con.store.meta(name).nnz
            bands.force(7)
            con.execute(sql)
            assert len(bands.count) >= N // 7, sql  # it was banded
            banded = con.tensor(name)
            assert _bits(banded) == _bits(one), sql
            assert con.store.meta(name).nnz == one_nnz, sql
            np.testing.assert_allclose(np.asarray(banded, np.float64),
                                       np.asarray(expect, np.float64), rtol=1e-5, err_msg=sql)
    assert seen == {"spmm", "semiring", "masked", "sddmm", "spjoin", "spreduce"}


def test_banded_min_plus_keeps_the_fill_and_equals_numpy(tmp_path, bands):
    a = _graph(N, 0.06, 5)
    ref = np.full((N, N), INF)
    coo = a.tocoo()
    ref[coo.row, coo.col] = coo.data
    expect = (ref[:, :, None] + ref[None]).min(axis=1)
    sql = "P[i,k] = MIN(D[i,j] + D[j,k])"
    with tensordb.connect(tmp_path / "m.tdb", workers=2) as con:
        con.load("D", a, fill_value=INF, tile=(16, N))
        assert "semiring min_plus" in con.explain(sql)
        bands.one()
        con.execute(sql)
        one = con.tensor("P")
        bands.force(5)
        del bands.count[:]
        con.execute(sql)
        assert len(bands.count) >= N // 5
        assert _bits(con.tensor("P")) == _bits(one)
        np.testing.assert_array_equal(con.tensor("P"), expect)
        assert con.store.meta("P").fill == INF
        assert con.store.meta("P").nnz == np.count_nonzero(expect != INF)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_banded_csr_tiles_have_the_one_calls_entries(bands, dtype):
    """The kernel call itself: a SpGEMM's and a min-plus product's CSR output tile, banded,
    holds the same row pointers, column indices and values as the one call's (the bands'
    entry arrays concatenated, no sort)."""
    from tensordb.exec.sparse_kernels import sparse_call
    from tensordb.physical.choice import choose_kernel
    from tensordb.plan.ir import EinOp
    from tensordb.plan.kernel import with_output
    from tensordb.plan.scalar import parse_join
    n = 200
    A, B = _graph(n, 0.02, 7, dtype), _graph(n, 0.02, 8, dtype)
    sizes = {"i": n, "j": n, "k": n}
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], sizes, dtype=np.dtype(dtype))
    spgemm = with_output(choose_kernel(op, sparse=(0, 1), finite=(True, True)), op, 1000)
    mp = EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], sizes, join=parse_join(
        "x0 + x1"), agg="min", dtype=np.dtype(dtype))
    semi = with_output(choose_kernel(mp, sparse=(0, 1), finite=(False, False), fills=(INF, INF)),
                       mp, 1000)
    assert spgemm.out_format == semi.out_format == "csr" and semi.semiring == "min_plus"
    for o, c, args in ((op, spgemm, [A, B]), (mp, semi, [Filled(A, INF), Filled(B, INF)])):
        bands.one()
        one = sparse_call(o, c, args, [(n, n)] * 2, (n, n), check=lambda f=None: None)
        fractions = []
        bands.force(9)
        res = sparse_call(o, c, args, [(n, n)] * 2, (n, n), check=fractions.append)
        assert fractions == sorted(fractions) and 0 < fractions[0] and fractions[-1] < 1
        assert len(fractions) == -(-n // 9) - 1
        assert type(res) is type(one)
        x, y = (getattr(r, "csr", r) for r in (res, one))
        assert x.has_canonical_format
        np.testing.assert_array_equal(x.indptr, y.indptr)
        np.testing.assert_array_equal(x.indices, y.indices)
        assert _bits(x.data) == _bits(y.data)


def test_a_banded_triangle_sum_of_fractional_floats_rounds_as_one_call_does(tmp_path, bands):
    """The one reduction over the band label (masked SpGEMM to a scalar): the bands' sums are
    added, a float sum in another order: equal to the one call and numpy to rounding (exact
    for integers, above)."""
    a = sp.random_array((N, N), density=0.08, rng=np.random.default_rng(9), format="csr")
    d = a.toarray()
    sql = "t = SUM(A[i,j] * A[j,k] * A[k,i])"
    with tensordb.connect(tmp_path / "t.tdb") as con:
        con.load("A", a)
        assert _method(con, sql) == "masked"
        bands.one()
        con.execute(sql)
        one = float(con.tensor("t"))
        bands.force(6)
        del bands.count[:]
        con.execute(sql)
        assert bands.count
        assert float(con.tensor("t")) == pytest.approx(one, rel=1e-13)
        assert one == pytest.approx(float(np.einsum("ij,jk,ki->", d, d, d)), rel=1e-13)


def test_a_small_call_is_one_call(tmp_path, bands):
    """The common case: a product whose estimated work is small is not banded."""
    with tensordb.connect(tmp_path / "s.tdb") as con:
        con.load("A", _graph(300, 0.01, 1))
        con.load("X", np.ones((300, 8)))
        del bands.count[:]
        for sql in ("C[i,k] = SUM(A[i,j] * A[j,k])", "Y[i,k] = SUM(A[i,j] * X[j,k])"):
            assert "spmm x0" in con.explain(sql)
            con.execute(sql)
        assert bands.count == []


# -- a real Ctrl-C -------------------------------------------------------------------------------

def _interrupt(con, sql, after=1.0):
    """Runs ``sql`` with a KeyboardInterrupt ``after`` seconds in: the seconds it took to stop."""
    timer = threading.Timer(after, _thread.interrupt_main)
    finished = False
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            con.execute(sql)
            finished = True
            time.sleep(10)  # where the interrupt lands if the query was too quick for it
    finally:
        timer.cancel()
    assert not finished, f"{sql} ended before the interrupt: make it larger"
    return time.perf_counter() - t0 - after


def _big_graph(n, density, seed):
    return sp.random_array((n, n), density=density, rng=np.random.default_rng(seed),
                           format="csr")


LARGE = [
    # 30,000 nodes, 1.8M entries: one call of each of the two pieces took 4.5 s (11 s loaded)
    ("C[i,k] = SUM(G[i,j] * G[j,k])", "GraphBLAS plus_times", None),
    ("P[i,k] = MIN(G[i,j] + G[j,k])", "semiring min_plus", INF),
    ("Y[i,k] = SUM(G[i,j] * X[j,k])", "spmm x0", None),
]


@pytest.mark.slow
@pytest.mark.parametrize("sql,plan,fill", LARGE, ids=["spgemm", "min_plus", "spmm"])
def test_ctrl_c_stops_a_large_sparse_call_within_a_second(tmp_path, sql, plan, fill):
    db = tmp_path / "c.tdb"
    n = 30000
    with tensordb.connect(db, workers=2) as con:
        con.load("G", _big_graph(n, 0.002, 0), **({"fill_value": fill} if fill else {}))
        if "X" in sql:
            con.load("X", np.random.default_rng(1).random((n, 1024), np.float32))
        assert plan in con.explain(sql)
        files = sorted(os.listdir(db / "tiles"))
        stopped = _interrupt(con, sql)
        print(f"{sql}: stopped {stopped:.2f} s after Ctrl-C")
        assert stopped < 2.5, f"{sql}: stopped {stopped:.2f} s after Ctrl-C"
        assert not con.store.has(sql.split("[")[0])
        assert sorted(os.listdir(db / "tiles")) == files
        small = _graph(40, 0.1, 2)
        con.load("H", small)
        con.execute("HH[i,k] = SUM(H[i,j] * H[j,k])")
        np.testing.assert_allclose(con.tensor("HH"), small.toarray() @ small.toarray())
    with tensordb.connect(db) as con:
        assert sorted(t["name"] for t in con.tensors()) == sorted(
            ["G", "H", "HH"] + (["X"] if "X" in sql else []))


@pytest.mark.slow
def test_ctrl_c_stops_a_sparse_product_in_a_cli_script(tmp_path):
    """The CLI running a script of three SpGEMMs: a SIGINT in the first stops it within a
    second or so; nothing is stored and the database checks clean."""
    db = tmp_path / "g.tdb"
    with tensordb.connect(db) as con:
        con.load("G", _big_graph(30000, 0.002, 0))
    script = tmp_path / "q.sql"
    script.write_text("C[i,k] = SUM(G[i,j] * G[j,k]);\nD[i,k] = SUM(C[i,j] * G[j,k]);\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TENSORDB_DEBUG": "",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tensordb", str(db), "-f", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(4.0)  # the interpreter started, the catalog opened, inside the first product
        assert proc.poll() is None, proc.communicate()
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        stopped = time.perf_counter() - t0
    finally:
        proc.kill()
        proc.wait()
    assert stopped < 2.5, (stopped, err)
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert "interrupted" in err, err
    with tensordb.connect(db) as con:
        assert [t["name"] for t in con.tensors()] == ["G"]
        assert all(r[-1] == "ok" for r in con.execute("CHECK DATABASE").fetchall())
