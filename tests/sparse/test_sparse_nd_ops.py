"""Elementwise joins of sparse tensors of rank 3 and more on their entries (issue 26 items 1 and
3; AUDIT26 row 3.13): ``T * U``, ``T + U``, ``T - U`` of two sparse tensors and ``T * D`` with a
dense operand known finite run as the ``spjoin`` kernel (exec/sparse_nd_join.py), their output
stored as COO tiles where the estimate says sparse. The oracle is NumPy on the densified
inputs; the large extent is checked entry by entry against a dict."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensordb
from tensordb.exec.sparse_nd_join import join_entries
from tensordb.storage.sparse import CooTile
from tests.sparse.test_sparse_hyper import _tensor

DTYPES = ["float64", "float32", "int64", "int32", "bool"]
OPS = {"*": np.multiply, "+": np.add, "-": np.subtract}



def _ref(x):
    return ",".join(x)


def _check(got, want, q):
    assert got.dtype == want.dtype, q
    assert got.shape == want.shape, q
    np.testing.assert_array_equal(got, want, err_msg=q)  # elementwise: exact, NaN at NaN


def _joins(labels, perms):
    """(statement, the second operand's labels, op) for every join and label order."""
    for fn in OPS:
        for perm in perms:
            yield fn, "".join(perm)


@pytest.mark.parametrize("dtype", DTYPES)
def test_joins_of_two_sparse_tensors_of_rank_3_and_4_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(40 + DTYPES.index(dtype))
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        for shape, tile in [((19, 17, 23), None), ((9, 8, 10, 7), (4, 8, 10, 7))]:  # bools: COO too
            labels = "abcd"[:len(shape)]
            t = _tensor(rng, shape, 30, dtype, special=True)
            con.load("T", t, tile=tile, replace=True) if tile else con.load("T", t, replace=True)
            perms = [labels, labels[::-1], labels[1:] + labels[0]]
            for fn, lu in _joins(labels, perms):
                if dtype == "bool" and fn == "-":
                    continue  # NumPy refuses the - of bools
                # U over its own label order: its array is T-shaped data transposed so
                u_full = _tensor(rng, shape, 25, dtype, special=True)
                # share some entries with T so the intersection is not empty
                common = np.argwhere(t != 0)[:5]
                for c in common:
                    u_full[tuple(c)] = u_full.dtype.type(3)
                u = np.ascontiguousarray(u_full.transpose([labels.index(l) for l in lu]))
                con.load("U", u, replace=True)
                for out in (labels, lu):
                    q = f"X[{_ref(out)}] = T[{_ref(labels)}] {fn} U[{_ref(lu)}]"
                    assert "spjoin x0 x1 sparse" in con.explain(q), q
                    con.execute(q)
                    with np.errstate(all="ignore"):
                        want = OPS[fn](t, u_full).transpose([labels.index(l) for l in out])
                    _check(con.tensor("X"), want, q)
                # the operands swapped: U first
                q = f"X[{_ref(labels)}] = U[{_ref(lu)}] {fn} T[{_ref(labels)}]"
                con.execute(q)
                with np.errstate(all="ignore"):
                    _check(con.tensor("X"), OPS[fn](u_full, t), q)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32"])
def test_a_sparse_tensor_times_a_dense_finite_one_keeps_its_pattern(tmp_path, dtype):
    rng = np.random.default_rng(140 + DTYPES.index(dtype))
    t = _tensor(rng, (9, 7, 11), 30, dtype, special=True)
    full = rng.integers(-4, 5, (9, 7, 11)).astype(dtype)
    bc = rng.integers(-4, 5, (7, 11)).astype(dtype)
    ca = rng.integers(-4, 5, (11, 9)).astype(dtype)
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        con.load("T", t, tile=(4, 7, 11))  # three COO tiles
        con.load("F", full)
        con.load("BC", bc)
        con.load("CA", ca)
        cases = [("X[a,b,c] = T[a,b,c] * F[a,b,c]", lambda: t * full, "x0 sparse (x1 gathered)"),
                 ("X[a,b,c] = T[a,b,c] * BC[b,c]", lambda: t * bc, "x0 sparse (x1 gathered)"),
                 ("X[c,b,a] = CA[c,a] * T[a,b,c]",
                  lambda: (ca.T[:, None, :] * t).transpose(2, 1, 0), "x1 sparse (x0 gathered)")]
        for q, want, text in cases:
            assert f"spjoin {text}" in con.explain(q), q
            con.execute(q)
            with np.errstate(all="ignore"):
                _check(con.tensor("X"), want(), q)
            stored = con.execute("SELECT DISTINCT format FROM tensordb.tiles WHERE tensor = 'X'"
                                 ).fetchall()
            assert stored and all(f == "coo" for (f,) in stored), (q, stored)


def test_a_dense_partner_that_may_hold_nan_or_inf_runs_dense_with_numpys_answer(tmp_path):
    rng = np.random.default_rng(3)
    t = _tensor(rng, (6, 5, 4), 12, "float64")
    d = rng.integers(-3, 4, (5, 4)).astype(float)
    d[0, 0], d[1, 2] = np.inf, np.nan  # 0 * inf is NaN where T is absent
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("T", t)
        con.load("D", d)
        q = "X[a,b,c] = T[a,b,c] * D[b,c]"
        assert "spjoin" not in con.explain(q)
        con.execute(q)
        with np.errstate(all="ignore"):
            want = t * d
        assert np.isnan(want).sum() > 1
        _check(con.tensor("X"), want, q)
        # a sum with a dense operand is dense: not the sparse join either
        q = "X[a,b,c] = T[a,b,c] + D[b,c]"
        assert "spjoin" not in con.explain(q)
        con.execute(q)
        _check(con.tensor("X"), t + d, q)


def test_nan_and_inf_of_two_sparse_operands_meet_the_others_zeros_as_in_numpy(tmp_path):
    t = np.zeros((3, 4, 5))
    u = np.zeros((3, 4, 5))
    t[0, 0, 0], t[1, 1, 1], t[2, 2, 2], t[0, 1, 2] = np.nan, np.inf, -np.inf, 2.0
    u[1, 1, 1], u[0, 1, 2], u[2, 3, 4] = np.inf, -0.0 - 1.0, 7.0
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("T", t)
        con.load("U", u)
        for fn in OPS:
            q = f"X[a,b,c] = T[a,b,c] {fn} U[a,b,c]"
            assert "spjoin x0 x1 sparse" in con.explain(q)
            con.execute(q)
            with np.errstate(all="ignore"):
                want = OPS[fn](t, u)
            _check(con.tensor("X"), want, q)
            if fn == "*":  # NaN * 0 and inf * 0 are NaN: outside the intersection
                assert np.isnan(con.tensor("X")[2, 2, 2])


def test_empty_operands_and_zero_extents(tmp_path):
    with tensordb.connect(str(tmp_path / "db")) as con:
        z = np.zeros((6, 5, 4))
        t = z.copy()
        t[1, 2, 3] = 4.0
        con.load("Z", z)
        con.load("T", t)
        for fn in OPS:
            con.execute(f"X[a,b,c] = T[a,b,c] {fn} Z[a,b,c]")
            _check(con.tensor("X"), OPS[fn](t, z), fn)
            con.execute(f"X[a,b,c] = Z[a,b,c] {fn} Z[a,b,c]")
            _check(con.tensor("X"), z, fn)
        e = np.zeros((6, 0, 4))
        con.load("E", e)
        con.load("E2", e)
        con.execute("X[a,b,c] = E[a,b,c] * E2[a,b,c]")
        _check(con.tensor("X"), e, "0 extent")


def test_join_entries_directly_past_int64_extents():
    big = (10**10, 10**10, 10**10)  # 10^30 elements: the ids are the occupied tuples
    rng = np.random.default_rng(9)
    ca = rng.integers(0, 3, (3, 40)) * 10**9
    ca = np.unique(ca, axis=1)
    cb = np.concatenate([ca[:, ::2], rng.integers(0, 3, (3, 10)) * 10**9 + 1], axis=1)
    cb = np.unique(cb, axis=1)
    va = rng.integers(1, 9, ca.shape[1]).astype(float)
    vb = rng.integers(1, 9, cb.shape[1]).astype(float)
    da = {tuple(c): v for c, v in zip(ca.T.tolist(), va)}
    db = {tuple(c): v for c, v in zip(cb.T.tolist(), vb)}
    for fn in OPS:
        res = join_entries(fn, [CooTile(big, ca, va), CooTile(big, cb, vb)], ["abc", "abc"],
                           "abc", np.float64)
        keys = set(da) | set(db)
        want = {k: OPS[fn](da.get(k, 0.0), db.get(k, 0.0)) for k in keys}
        want = {k: v for k, v in want.items() if v != 0}
        got = {tuple(c): v for c, v in zip(res.coords.T.tolist(), res.values.tolist())}
        assert got == want, fn
        assert list(got) == sorted(got)  # C order, as the storage expects
    # out of order: the output's labels reversed
    res = join_entries("+", [CooTile(big, ca, va), CooTile(big, cb[::-1], vb)],
                       ["abc", "cba"], "cba", np.float64)
    got = {tuple(c): v for c, v in zip(res.coords.T.tolist(), res.values.tolist())}
    want = {}
    for k, v in itertools.chain(((k[::-1], v) for k, v in da.items()),
                                ((k[::-1], v) for k, v in db.items())):
        want[k] = want.get(k, 0.0) + v
    assert got == want


def test_a_join_of_two_huge_sparse_tensors_stores_its_entries(tmp_path):
    ext = 10**5  # 10^15 elements, 8 PB dense: 1,000 entries each
    r = np.arange(1000)
    coords = {"T": ((r * 7919) % ext, (r * 31) % ext, (r * 17) % ext),
              "U": ((r * 7919) % ext, (r * 31) % ext, (r * 13) % ext)}
    with tensordb.connect(str(tmp_path / "db"), memory_limit="512MB") as con:
        for name, m in [("T", 17), ("U", 13)]:
            con.execute(f"CREATE TENSOR {name} FROM (SELECT (r * 7919) % {ext} AS a, "
                        f"(r * 31) % {ext} AS b, (r * {m}) % {ext} AS c, 1.0 + r AS v "
                        f"FROM range(1000) t(r)) INDEX (a, b, c) VALUE v "
                        f"SHAPE ({ext}, {ext}, {ext})")
        ents = {n: {tuple(int(x) for x in k): 1.0 + i for i, k in enumerate(zip(*c))}
                for n, c in coords.items()}
        for fn in OPS:
            q = f"X[a,b,c] = T[a,b,c] {fn} U[a,b,c]"
            text = con.explain(q)
            assert "spjoin x0 x1 sparse" in text and "coo tiles from the kernel" in text, text
            con.execute(q)
            keys = set(ents["T"]) | set(ents["U"])
            want = {k: OPS[fn](ents["T"].get(k, 0.0), ents["U"].get(k, 0.0)) for k in keys}
            want = {k: v for k, v in want.items() if v != 0}
            got = {(a, b, c): v for a, b, c, v in con.execute("SELECT * FROM X").fetchall()}
            assert got == want, fn
            info = next(t for t in con.tensors() if t["name"] == "X")
            assert info["nnz"] == len(want)
            assert info["bytes"] <= 64 * (len(want) + 1)  # its entries, not the extent
        assert con.check()[-1]["problem"] == "ok"


# -- contractions that keep a shared label; two sparse operands (SpGEMM on the entries) -------
BATCH = [("R[a,b,k] = SUM(T[a,b,c] * Y[a,c,k])", "abc,ack->abk"),
         ("R[k,a] = SUM(T[a,b,c] * Y[a,c,k])", "abc,ack->ka"),
         ("R[a,c,k] = SUM(Y[a,c,k] * T[a,b,c])", "ack,abc->ack"),
         ("R[b,a] = SUM(T[a,b,c] * V[a])", "abc,a->ba")]


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32"])
def test_contractions_keeping_a_shared_label_and_of_two_sparse_tensors_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(240 + DTYPES.index(dtype))
    t = _tensor(rng, (9, 6, 8), 30, dtype, special=True)
    tf = _tensor(rng, (9, 6, 8), 30, dtype)  # finite: a SpGEMM partner
    y = rng.integers(-4, 5, (9, 8, 3)).astype(dtype)
    v = rng.integers(-4, 5, 9).astype(dtype)
    u = _tensor(rng, (9, 8, 30), 40, dtype)
    for c in np.argwhere(tf != 0)[:10]:  # entries that meet
        u[c[0], c[2], rng.integers(0, 30)] = 2
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        con.load("T", t, tile=(4, 6, 8))
        con.load("TF", tf)
        con.load("Y", y)
        con.load("V", v)
        con.load("U", u)
        ops = {"T": t, "Y": y, "V": v}
        for q, eq in BATCH:
            names = [n for n in ("Y", "T", "V") if f"{n}[" in q]
            names.sort(key=q.index)
            assert "spmm x" in con.explain(q), q
            con.execute(q)
            with np.errstate(all="ignore"):
                want = np.einsum(eq, *(ops[n] for n in names))
            got = con.tensor("R")
            assert got.dtype == want.dtype, q
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=q) if dtype[0] == "f" \
                else np.testing.assert_array_equal(got, want, err_msg=q)
        for q, eq, a, b in [("R[a,b,k] = SUM(TF[a,b,c] * U[a,c,k])", "abc,ack->abk", tf, u),
                            ("R[k,b] = SUM(U[a,c,k] * TF[a,b,c])", "ack,abc->kb", u, tf),
                            ("R[a,b,k] = SUM(T[a,b,c] * U[a,c,k])", "abc,ack->abk", t, u)]:
            text = con.explain(q)
            # both finite: SpGEMM on the entries; a float T holds NaN (NaN * an absent 0): dense
            assert ("spmm x" in text) == ("TF" in q or dtype[0] == "i"), (q, text)
            con.execute(q)
            with np.errstate(all="ignore"):
                want = np.einsum(eq, a, b)
            got = con.tensor("R")
            assert got.dtype == want.dtype, q
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=q) if dtype[0] == "f" \
                else np.testing.assert_array_equal(got, want, err_msg=q)


def test_a_spgemm_of_two_large_rank_3_tensors_runs_on_their_entries(tmp_path):
    ext = 10**6  # T: 10^6 x 40 x 10^6, U: 10^6 x 40 x 3 (the contracted c, a batch a)
    r = np.arange(300)
    with tensordb.connect(str(tmp_path / "db"), memory_limit="512MB") as con:
        con.execute(f"CREATE TENSOR T FROM (SELECT (r * 7919) % 50 AS a, (r * 31) % {ext} AS b,"
                    f" r % 40 AS c, 1.0 + r AS v FROM range(300) t(r))"
                    f" INDEX (a, b, c) VALUE v SHAPE (50, {ext}, 40)")
        con.execute(f"CREATE TENSOR U FROM (SELECT (r * 7919) % 50 AS a, (r * 3) % 40 AS c,"
                    f" r % 3 AS k, 2.0 + r AS v FROM range(300) t(r))"
                    f" INDEX (a, c, k) VALUE v SHAPE (50, 40, 3)")
        q = "R[b,k] = SUM(T[a,b,c] * U[a,c,k])"  # U as a dense 50x40x3 would do; sparse here
        assert "spmm x0 sparse" in con.explain(q)
        con.execute(q)
        tv = {}
        for i in r:
            tv[(int(i * 7919 % 50), int(i * 31 % ext), int(i % 40))] = 1.0 + i
        uv = {}
        for i in r:
            uv[(int(i * 7919 % 50), int(i * 3 % 40), int(i % 3))] = 2.0 + i
        want = {}
        for (a, b, c), x in tv.items():
            for (a2, c2, k), y in uv.items():
                if a2 == a and c2 == c:
                    want[(b, k)] = want.get((b, k), 0.0) + x * y
        got = {(b, k): v for b, k, v in con.execute("SELECT * FROM R").fetchall()}
        assert set(got) == set(want)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-12)


def test_a_joins_coo_result_feeds_later_statements_of_its_group(tmp_path):
    rng = np.random.default_rng(17)
    t = _tensor(rng, (19, 17, 23), 60, "float64")
    u = _tensor(rng, (19, 17, 23), 60, "float64")
    u.reshape(-1)[np.flatnonzero(t)[:20]] = 2.0  # entries that meet
    x = rng.integers(-3, 4, (23, 4)).astype(float)
    script = ("Y[a,b,c] = T[a,b,c] + U[a,b,c]; Z[a,b,c] = Y[a,b,c] * T[a,b,c]; "
              "R[a] = SUM(Z[a,b,c]); Q[a,b,k] = SUM(Y[a,b,c] * XX[c,k]);")
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        con.load("T", t)
        con.load("U", u)
        con.load("XX", x)
        text = con.explain(script)
        assert "Y estimated" in text and "coo tiles from the kernel" in text, text
        assert text.count("spjoin x0 x1 sparse") == 2, text
        con.execute(script)
        y = t + u
        _check(con.tensor("Y"), y, "Y")
        _check(con.tensor("Z"), y * t, "Z")
        np.testing.assert_allclose(con.tensor("R"), (y * t).sum((1, 2)), rtol=1e-12)
        np.testing.assert_allclose(con.tensor("Q"), np.einsum("abc,ck->abk", y, x), rtol=1e-12)
