"""Sparse OUTPUT tiles (issue 26, items 3 and 5): a sparse kernel whose output the plan estimates
sparse (``plan.kernel.with_output``) returns CSR tiles (SpGEMM, min-plus and max-plus, max-times
and min-times, sparse elementwise joins, SDDMM); partial results of a split contracted label are
combined sparse; the writer stores them from their entries. Every answer is checked against numpy
on the densified inputs, every stored tile's format and bytes against the catalog, on real
on-disk catalogs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.sparsity import choose_format, sparse_nbytes
from tests.bench.bench_sparse_graph import stored_csr

INF = np.inf
PIECES = ["", " WITH (PIECES j 3)", " WITH (PIECES i 2, j 2, k 2)"]


def _graph(n, density, seed, dtype="float64", m=None, signed=False):
    a = sp.random(n, m or n, density=density, random_state=seed, format="csr")
    a.data = np.round(a.data * 9) + 1  # integral values 1..10: every sum is exact
    if signed:
        a.data *= np.where(np.random.default_rng(seed).random(a.nnz) < 0.5, -1, 1)
    return sp.csr_array(a.astype(dtype))


def _dense(a, fill=0.0):
    out = np.full(a.shape, fill, dtype=a.dtype)
    coo = a.tocoo()
    out[coo.row, coo.col] = coo.data
    return out


def _node(con, sql):
    out = con.explain(sql, format="json")
    return (out if isinstance(out, dict) else json.loads(out))["nodes"]


def _stored_csr(con, name):
    """A stored matrix as one scipy CSR array of its stored entries, from its CSR tiles read as
    they are (each must be CSR): never dense."""
    return stored_csr(con, name, sp)


def _assert_sparse_tiles(con, name, dtype, fill=0.0):
    """Every stored tile of ``name`` is sparse in the format the rule gives (CSR; COO where it
    is hypersparse), its bytes exactly that payload of its entries (proportional to its nnz),
    and the catalog's nnz counts the entries that are not the fill."""
    reader = con.store.open(name)
    assert reader.entries, f"{name} stored no tile"
    for e in reader.entries.values():
        assert e.format == choose_format(e.shape, e.nnz, dtype), (name, e.coords, e.format)
        assert e.nbytes == sparse_nbytes(e.shape, e.nnz, dtype, e.format)
    got = con.tensor(name)
    assert con.store.meta(name).nnz == int(np.count_nonzero(got != fill))
    assert con.check(name)[0]["problem"] == "ok"


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32"])
def test_spgemm_returns_csr_tiles_whole_and_with_j_split(tmp_path, dtype):
    a, b = _graph(90, 0.03, 1, dtype), _graph(90, 0.03, 2, dtype)
    ref = _dense(a) @ _dense(b)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
        (node,) = _node(con, sql)
        assert node["kernel"]["method"] == "spmm"
        assert node["kernel"]["output_format"] == "csr"
        assert node["output_nnz"]["format"] == "csr"
        for pieces in PIECES:
            con.execute(sql + pieces)
            got = con.tensor("C")
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got, ref)
            _assert_sparse_tiles(con, "C", dtype)


def test_spgemm_into_the_transposed_output_and_a_sparse_partner_transposed(tmp_path):
    a, b = _graph(70, 0.04, 3), _graph(70, 0.04, 4)
    ad, bd = _dense(a), _dense(b)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("B", b)
        for sql, ref in [("C[k,i] = SUM(A[i,j] * B[j,k])", (ad @ bd).T),
                         ("E[i,k] = SUM(A[i,j] * B[k,j])", ad @ bd.T)]:
            for pieces in PIECES:
                con.execute(sql + pieces)
                np.testing.assert_array_equal(con.tensor(sql[0]), ref)
                _assert_sparse_tiles(con, sql[0], "float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("agg,fill", [("MIN", INF), ("MAX", -INF)])
def test_min_plus_and_max_plus_keep_their_fill_in_csr_tiles(tmp_path, dtype, agg, fill):
    a = _graph(80, 0.03, 5, dtype)
    d = _dense(a, fill)
    red = np.min if agg == "MIN" else np.max
    ref = red(d[:, :, None] + d[None], axis=1)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", a, fill_value=fill)
        sql = f"P[i,k] = {agg}(D[i,j] + D[j,k])"
        (node,) = _node(con, sql)
        assert node["kernel"]["method"] == "semiring"
        assert node["kernel"]["output_format"] == "csr"
        for pieces in PIECES + [" WITH (PIECES j 4)"]:
            con.execute(sql + pieces)
            got = con.tensor("P")
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, ref)
            assert con.store.meta("P").fill == fill
            _assert_sparse_tiles(con, "P", dtype, fill)
        con.execute(f"Q[k,i] = {agg}(D[i,j] + D[j,k]) WITH (PIECES j 2)")  # transposed
        np.testing.assert_array_equal(con.tensor("Q"), ref.T)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_max_times_and_min_times_take_the_absent_zeros_in_csr_tiles(tmp_path, dtype):
    """MAX of products some of which are absent (fill 0) takes their 0 too: a row of negative
    products is 0, within a tile (the structural count) and across the pieces of a split j
    (a partial with no entry there is 0 and takes part)."""
    a, b = _graph(80, 0.03, 6, dtype, signed=True), _graph(80, 0.03, 7, dtype, signed=True)
    ad, bd = _dense(a), _dense(b)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        for agg, red in (("MAX", np.max), ("MIN", np.min)):
            sql = f"M[i,k] = {agg}(A[i,j] * B[j,k])"
            (node,) = _node(con, sql)
            assert node["kernel"]["method"] == "semiring"
            assert node["kernel"]["output_format"] == "csr"
            ref = red(ad[:, :, None] * bd[None], axis=1)
            for pieces in PIECES:
                con.execute(sql + pieces)
                np.testing.assert_array_equal(con.tensor("M"), ref)
                _assert_sparse_tiles(con, "M", dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_sparse_elementwise_joins_store_csr_tiles(tmp_path, dtype):
    """A product keeps the intersection, a sum and a difference the union; tiles as CSR."""
    a, b = _graph(100, 0.03, 8, dtype), _graph(100, 0.03, 9, dtype)
    ad, bd = _dense(a), _dense(b)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        for sql, ref in [("X[i,j] = A[i,j] * B[i,j]", ad * bd),
                         ("Y[i,j] = A[i,j] + B[i,j]", ad + bd),
                         ("Z[i,j] = A[i,j] - B[i,j]", ad - bd),
                         ("W[j,i] = A[i,j] + B[i,j]", (ad + bd).T)]:
            (node,) = _node(con, sql)
            assert node["kernel"]["method"] == "spjoin"
            assert node["kernel"]["output_format"] == "csr"
            for pieces in ("", " WITH (PIECES i 2, j 2)"):
                con.execute(sql + pieces)
                got = con.tensor(sql[0])
                assert got.dtype == ref.dtype
                np.testing.assert_array_equal(got, ref)
                if np.count_nonzero(ref):
                    _assert_sparse_tiles(con, sql[0], dtype)


def test_sddmm_returns_the_masks_structure_as_csr(tmp_path):
    rng = np.random.default_rng(10)
    m = _graph(120, 0.02, 11)
    u = rng.integers(-3, 4, (120, 4)).astype("float64")
    v = rng.integers(-3, 4, (120, 4)).astype("float64")
    with tensordb.connect(tmp_path / "db") as con:
        con.load("M", m)
        con.load("U", u)
        con.load("V", v)
        sql = "S[i,j] = M[i,j] * SUM(U[i,r] * V[j,r])"
        (node,) = _node(con, sql)
        assert node["kernel"]["method"] == "sddmm"
        assert node["kernel"]["output_format"] == "csr"
        con.execute(sql)
        np.testing.assert_array_equal(con.tensor("S"), _dense(m) * (u @ v.T))
        _assert_sparse_tiles(con, "S", "float64")


def test_empty_outputs_store_nothing_or_empty_filled_tiles(tmp_path):
    """A product with no pair: fill 0 stores no tile (zeros); fill +inf stores every tile
    empty (all +inf), as any tensor of that fill."""
    n = 60
    left = sp.random(n, n // 2, density=0.1, random_state=12, format="csr")
    a = sp.csr_array(sp.hstack([left, sp.csr_array((n, n // 2))]))   # columns < n/2 only
    b = sp.csr_array(sp.vstack([sp.csr_array((n // 2, n)), left.T]))  # rows >= n/2 only
    a.data[:], b.data[:] = 2.0, 3.0
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("B", b)
        for pieces in PIECES:
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])" + pieces)
            np.testing.assert_array_equal(con.tensor("C"), np.zeros((n, n)))
            assert con.store.meta("C").nnz == 0 and not con.store.open("C").entries
        con.load("D", a, fill_value=INF)
        con.load("E", b, fill_value=INF)
        for pieces in PIECES:
            con.execute("P[i,k] = MIN(D[i,j] + E[j,k])" + pieces)
            np.testing.assert_array_equal(con.tensor("P"), np.full((n, n), INF))
            entries = con.store.open("P").entries.values()
            # no entry: the smallest sparse payload, COO's (CSR would be its row pointers)
            assert entries and all(e.format == "coo" and e.nnz == 0 for e in entries)


def test_a_sparse_output_read_by_a_later_statement_and_returned_as_an_array(tmp_path):
    """A CSR output tile consumed within the same group (a dense kernel densifies it) and
    assembled into an array by ``con.einsum`` without ``into``."""
    a = _graph(80, 0.03, 13)
    ad = _dense(a)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("G", a)
        con.execute("C[i,k] = SUM(G[i,j] * G[j,k]) WITH (PIECES j 2); "
                    "deg[i] = SUM(C[i,k] * C[i,k])")
        np.testing.assert_array_equal(con.tensor("C"), ad @ ad)
        np.testing.assert_array_equal(con.tensor("deg"), ((ad @ ad) ** 2).sum(axis=1))
        np.testing.assert_array_equal(con.einsum("ij,jk->ik", "G", "G"), ad @ ad)


def test_explain_shows_the_output_format_and_the_memory_of_csr_tiles(tmp_path):
    a = _graph(400, 0.005, 14)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("G", a)
        sql = "C[i,k] = SUM(G[i,j] * G[j,k])"
        text = con.explain(sql)
        assert "output nnz: C estimated" in text and "(csr tiles from the kernel)" in text
        (node,) = _node(con, sql)
        # the projection holds the output tile at its estimated CSR bytes, not 400^2 * 8
        est = node["output_nnz"]["estimated"]
        assert sparse_nbytes((400, 400), est - 1, "float64", "csr") <= node["memory"]["output"] \
            <= sparse_nbytes((400, 400), est + 1, "float64", "csr")   # (the estimate rounded)
        assert node["memory"]["output"] < 400 * 400 * 8 / 4
        con.execute(sql)
        analyzed = con.explain(sql, analyze=True, format="json")
        analyzed = analyzed if isinstance(analyzed, dict) else json.loads(analyzed)
        assert analyzed["nodes"][0]["output_nnz"]["measured"] == con.store.meta("C").nnz


def test_a_graph_whose_dense_output_tiles_would_not_fit_runs_sparse(tmp_path):
    """200,000 nodes, 3 edges each: G @ G's dense output would be 320 GB (its tiles 160 GB
    each), under a 1 GB memory_limit. The kernel returns CSR tiles, stored as such: the answer
    is scipy's, and its bytes are those of its entries."""
    n, m = 200_000, 600_000
    rng = np.random.default_rng(15)
    a = sp.csr_array(sp.coo_array((rng.integers(1, 10, m).astype(np.float64),
                                   (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n)))
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.execute("SET memory_limit = '1GB'")
        con.load("G", a)
        con.execute("C[i,k] = SUM(G[i,j] * G[j,k])")
        ref = a @ a
        got = _stored_csr(con, "C")
        assert got.nnz == ref.nnz and abs(got - ref).max() == 0
        meta = con.store.meta("C")
        assert meta.nnz == ref.nnz
        assert meta.nbytes <= 1.2 * (ref.data.nbytes + ref.indices.nbytes + ref.indptr.nbytes)
        con.execute("C2[i,k] = SUM(G[i,j] * G[j,k]) WITH (PIECES j 2)")  # partials summed sparse
        assert abs(_stored_csr(con, "C2") - ref).max() == 0


def test_min_plus_of_a_graph_whose_dense_output_would_not_fit_runs_sparse(tmp_path):
    """Two-hop distances of a 100,000-node graph (fill +inf) under a 1 GB memory_limit: the
    GraphBLAS product's CSR tiles are stored as they are (a dense tile would be 40 GB); the
    answer is GraphBLAS's own ``min_plus`` product of the same matrix."""
    gb = pytest.importorskip("graphblas")
    n, m = 100_000, 200_000
    rng = np.random.default_rng(16)
    a = sp.csr_array(sp.coo_array((rng.integers(1, 10, m).astype(np.float64),
                                   (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n)))
    a.sum_duplicates()
    G = gb.io.from_scipy_sparse(a)
    ref = gb.io.to_scipy_sparse(G.mxm(G, gb.semiring.min_plus).new(), format="csr")
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.execute("SET memory_limit = '1GB'")
        con.load("D", a, fill_value=INF)
        for pieces in ("", " WITH (PIECES j 2)"):
            con.execute("P[i,k] = MIN(D[i,j] + D[j,k])" + pieces)
            assert con.store.meta("P").nnz == ref.nnz
            got = _stored_csr(con, "P")
            # the same entries and values (+inf, the fill, where neither has one)
            assert np.array_equal(got.indptr, ref.indptr)
            assert np.array_equal(got.indices, ref.indices)
            assert np.array_equal(got.data, ref.data)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_each_sparse_kernel_returns_the_format_its_choice_says(fmt):
    """The kernels (exec/) follow the plan's ``out_format``: a CSR tile (a ``Filled`` one for
    min-plus's +inf), or a dense array, with the same values."""
    from dataclasses import replace
    from tensordb.exec.sparse_kernels import sparse_call
    from tensordb.physical.choice import choose_kernel
    from tensordb.plan.ir import EinOp
    from tensordb.plan.scalar import parse_join
    from tensordb.storage.sparse import Filled, densify, is_sparse
    a, b = _graph(40, 0.05, 17), _graph(40, 0.05, 18)
    size = {"i": 40, "j": 40, "k": 40}
    cases = [
        (EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], size), (0.0, 0.0),
         [a, b], _dense(a) @ _dense(b)),
        (EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], size,
                           join=parse_join("x0 + x1"), agg="min"), (INF, INF),
         [Filled(a, INF), Filled(b, INF)],
         np.min(_dense(a, INF)[:, :, None] + _dense(b, INF)[None], axis=1)),
        (EinOp.contraction("X", "ij", [("A", "ij"), ("B", "ij")], size,
                           join=parse_join("x0 * x1"), agg=None), (0.0, 0.0),
         [a, b], _dense(a) * _dense(b)),
    ]
    for op, fills, args, ref in cases:
        c = choose_kernel(op, sparse=(0, 1), finite=(True, True), fills=fills)
        assert c.method in ("spmm", "semiring", "spjoin")
        if fmt != "dense":
            c = replace(c, out_format=fmt, out_density=0.1, out_places=False)
        out = sparse_call(op, c, args, [(40, 40), (40, 40)], (40, 40))
        assert is_sparse(out) == (fmt == "csr")
        np.testing.assert_array_equal(densify(out), ref)


@pytest.mark.distributed
def test_a_dask_cluster_stores_the_same_csr_tiles_as_the_local_pool(tmp_path):
    """On a Dask cluster (workers that see the database) the CSR output tiles come back to the
    client and are stored from their entries: the same bytes, nnz and checksums as the local
    pool's, for SpGEMM with j split (partials summed on a worker) and min-plus."""
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    a = _graph(90, 0.03, 19)
    with local_cluster(2, local_directory=str(tmp_path / "dask")) as cluster, \
            tensordb.connect(tmp_path / "d", workers=2, storage="shared",
                             executor=f"dask://{cluster.scheduler_address}") as d, \
            tensordb.connect(tmp_path / "l", workers=2) as local:
        for con in (d, local):
            con.load("G", a)
            con.load("D", a, fill_value=INF)
            con.execute("C[i,k] = SUM(G[i,j] * G[j,k]) WITH (PIECES i 2, j 3); "
                        "P[i,k] = MIN(D[i,j] + D[j,k]) WITH (PIECES j 2)")
        for name in ("C", "P"):
            r, q = d.store.open(name), local.store.open(name)
            assert {c: (e.nnz, e.crc32, e.format) for c, e in r.entries.items()} == \
                {c: (e.nnz, e.crc32, e.format) for c, e in q.entries.items()}
            assert all(e.format == "csr" for e in r.entries.values())
            np.testing.assert_array_equal(d.tensor(name), local.tensor(name))
        np.testing.assert_array_equal(d.tensor("C"), _dense(a) @ _dense(a))


def test_a_piece_computed_densely_meets_csr_partials(tmp_path):
    """A NaN in one piece of j makes that partial's kernel compute densely (numpy's answer):
    it is combined with the other pieces' CSR partials (densified with their fill +inf) into
    numpy's MIN, NaN where numpy has one."""
    a = _graph(60, 0.05, 20)
    d = _dense(a, INF)
    r, c = a.nonzero()
    bad = int(np.flatnonzero(c >= 30)[0])       # an entry in the second half of j
    a = a.copy()
    a.data[bad] = np.nan
    d[r[bad], c[bad]] = np.nan
    with np.errstate(invalid="ignore"):
        ref = np.min(d[:, :, None] + d[None], axis=1)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", a, fill_value=INF)
        for pieces in ("", " WITH (PIECES j 2)", " WITH (PIECES i 2, j 2)"):
            con.execute("P[i,k] = MIN(D[i,j] + D[j,k])" + pieces)
            np.testing.assert_array_equal(con.tensor("P"), ref)
            assert np.isnan(ref).any()


@pytest.mark.parametrize("sql,density,sparse", [
    ("r[i] = SUM(G[i,j])", 2e-4, True),                 # spreduce: dense tiles of a sparse r
    ("C[i,k] = SUM(G[i,j] * G[j,k])", 2e-4, True),      # SpGEMM: CSR tiles
    ("C[i,k] = SUM(G[i,j] * G[j,k])", 0.05, False),     # SpGEMM of a dense result
    ("Y[i,k] = SUM(G[i,j] * X[j,k])", 0.05, False)])    # SpMM: dense
def test_the_plan_decides_once_whether_an_output_gets_dense_places(tmp_path, sql, density,
                                                                   sparse):
    """One decision (``KernelChoice.out_places``, plan.kernel.with_output, from the estimated
    nonzeros) that the output sink reads: a sink opened on the plan alone (as an executor's
    test opens one) gives a sparse output no dense places, whether its kernel returns CSR
    tiles (SpGEMM) or dense ones (a row sum of a very sparse matrix); a dense output its
    places. The stored result, against numpy, is stored as the format rule says."""
    from tensordb.physical import CatalogSink
    from tensordb.sparsity import is_sparse_overall
    a = _graph(400, density, 31)
    X = np.arange(4000.0).reshape(400, 10) / 7
    want = {"r": lambda d: d.sum(axis=1), "C": lambda d: d @ d, "Y": lambda d: d @ X}
    with tensordb.connect(tmp_path / "db") as con:
        con.load("G", a)
        con.load("X", X)
        con.execute(sql)
        name = sql.split("[")[0]
        got = con.tensor(name)
        np.testing.assert_allclose(got, want[name](_dense(a)), rtol=1e-12, atol=1e-12)
        plan = con.last_plan
        (n_op,) = [n for n, op in enumerate(plan.ops) if op.output == name]
        choice = plan.kernels[n_op]
        est = _node(con, sql)[0].get("output_nnz", {}).get("estimated")
        assert sparse is (est is not None and is_sparse_overall(got.shape, int(np.ceil(est)),
                                                                  got.dtype))
        assert choice.out_places is (not sparse)
        sink = CatalogSink(con.store, plan, replace=True)
        try:
            places = sink.open()
            keys = set(plan.outputs[name].tiles.values())
            assert bool(keys & set(places)) is choice.out_places
        finally:
            sink.abort()
        formats = {f for (f,) in con.execute(
            "SELECT DISTINCT format FROM tensordb.tiles WHERE tensor = ?", [name]).fetchall()}
        assert formats and formats <= ({"csr", "coo"} if sparse else {"dense"})
