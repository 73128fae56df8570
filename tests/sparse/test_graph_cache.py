"""The graph cache (exec/graphcache.py): a stored graph's GraphBLAS matrix kept between statements,
keyed by tensor, version and box of one database; dropped when its tensor is replaced or dropped,
counted and dropped by the memory budget; and the planner's GraphBLAS SpGEMM (plan/kernel.py).
Every answer is checked against an oracle computed here with numpy/scipy on the same graph."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec.graphcache import GRAPHS

pytest.importorskip("graphblas")

STEP = "CREATE OR REPLACE TENSOR dist[k] AS MIN(dist[j] + D[j,k])"


def _graph(n: int, m: int, seed: int):
    rng = np.random.default_rng(seed)
    D = sp.csr_array(sp.coo_array((rng.integers(1, 10, m).astype(np.float64),
                                    (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n)))
    D.sum_duplicates()
    return D


def _step(dist: np.ndarray, D) -> np.ndarray:
    """One min-plus step, ``new[k] = min_j dist[j] + D[j,k]`` over D's entries (absent: +inf)."""
    c = D.tocoo()
    new = np.full(D.shape[1], np.inf)
    np.minimum.at(new, c.col, dist[c.row] + c.data)
    return new


def _entries(name: str) -> list[tuple]:
    """The cache's keys of tensor ``name``: (name, version, starts, stops)."""
    return [w[0] for w in GRAPHS.names.get(name.lower(), ())]


@pytest.fixture(autouse=True)
def _empty_cache():
    GRAPHS.clear()
    yield
    GRAPHS.clear()


def test_steps_hit_the_cache_and_a_replaced_graph_leaves_it(tmp_path):
    D1, D2 = _graph(400, 3000, 1), _graph(400, 3000, 2)
    d0 = np.full(400, np.inf)
    d0[0] = 0.0
    with tensordb.connect(tmp_path / "g.tdb", workers=2) as con:
        con.load("D", D1, fill_value=np.inf)
        con.load("dist", d0)
        want = d0
        for s in range(3):
            con.execute(STEP)
            want = _step(want, D1)
            np.testing.assert_array_equal(con.tensor("dist"), want)
            if s == 0:
                hits = GRAPHS.hits
        assert GRAPHS.hits >= hits + 2  # the later steps found D's boxes
        v1 = con.describe("D")["version"]
        assert _entries("D") and all(k[1] == v1 for k in _entries("D"))
        assert "semiring min_plus" in con.explain(STEP.replace(
            "CREATE OR REPLACE TENSOR dist[k] AS", "x[k] ="))
        con.load("D", D2, fill_value=np.inf, replace=True)
        assert _entries("D") == []  # its commit retired version v1: gone before any read
        con.load("dist", d0, replace=True)
        want = d0
        for _ in range(3):
            con.execute(STEP)
            want = _step(want, D2)
            np.testing.assert_array_equal(con.tensor("dist"), want)
        v2 = con.describe("D")["version"]
        assert v2 != v1 and _entries("D") and all(k[1] == v2 for k in _entries("D"))
        con.execute("DROP TENSOR D")
        assert _entries("D") == []


def test_column_slabs_are_kept_and_stay_right_after_a_replace(tmp_path):
    D1, D2 = _graph(300, 2500, 3), _graph(300, 2500, 4)
    d0 = np.zeros(300)  # every node a source
    with tensordb.connect(tmp_path / "g.tdb", workers=2) as con:
        con.load("D", D1, fill_value=np.inf)
        sql = STEP + " WITH (PIECES k 2)"
        for D in (D1, D2, D1):
            con.load("D", D, fill_value=np.inf, replace=True)
            con.load("dist", d0, replace=True)
            want = d0
            for _ in range(2):
                con.execute(sql)
                want = _step(want, D)
                np.testing.assert_array_equal(con.tensor("dist"), want)
            boxes = {(k[2], k[3]) for k in _entries("D")}
            assert len(boxes) == 2  # the two column slabs, copies kept between statements


def test_two_databases_with_the_same_names_and_versions_do_not_share_entries(tmp_path):
    Da, Db = _graph(200, 1500, 5), _graph(200, 1500, 6)
    d0 = np.full(200, np.inf)
    d0[3] = 0.0
    with tensordb.connect(workers=2) as a, tensordb.connect(workers=2) as b:
        for con, D in ((a, Da), (b, Db)):
            con.load("D", D, fill_value=np.inf)
            con.load("dist", d0)
        assert a.describe("D")["version"] == b.describe("D")["version"]
        want = {id(a): d0, id(b): d0}
        for _ in range(3):
            for con, D in ((a, Da), (b, Db)):
                con.execute(STEP)
                want[id(con)] = _step(want[id(con)], D)
                np.testing.assert_array_equal(con.tensor("dist"), want[id(con)])


def test_the_budget_drops_idle_matrices_and_the_capacity_bounds_the_cache(monkeypatch):
    D = _graph(20_000, 100_000, 7)
    d0 = np.full(20_000, np.inf)
    d0[0] = 0.0
    # 2 MB: the cached matrix alone (1.6 MiB) leaves too little for a step's tasks, so the
    # pool's admission drops it (budget.py) before it spills or waits
    with tensordb.connect(workers=2, memory_limit="2MB") as con:
        con.load("D", D, fill_value=np.inf)
        con.load("dist", d0)
        want = d0
        evicted = GRAPHS.evicted
        for _ in range(3):
            con.execute(STEP)
            want = _step(want, D)
            np.testing.assert_array_equal(con.tensor("dist"), want)
        assert GRAPHS.evicted > evicted
    monkeypatch.setattr(GRAPHS, "capacity", 1 << 10)  # far less than one matrix
    with tensordb.connect(workers=2) as con:
        con.load("D", D, fill_value=np.inf)
        con.load("dist", d0)
        want = d0
        for _ in range(2):
            con.execute(STEP)
            want = _step(want, D)
            np.testing.assert_array_equal(con.tensor("dist"), want)
            assert GRAPHS.bytes <= 1 << 10


def test_spgemm_names_graphblas_in_explain_and_scipy_without_it(monkeypatch):
    G = sp.random(600, 600, density=0.004, format="csr", random_state=1)
    sql = "C[i,k] = SUM(G[i,j] * G[j,k])"
    with tensordb.connect(workers=2) as con:
        con.load("G", G)
        assert "spmm x0 sparse (GraphBLAS plus_times)" in con.explain(sql)
        con.execute(sql)
        np.testing.assert_allclose(con.sparse("C").toarray(), (G @ G).toarray(), rtol=1e-12)
    # python-graphblas not installed: scipy's product, named so, the same answer; a min-plus
    # step runs as the dense kernel
    import tensordb.exec.sparse_kernels as sk
    import tensordb.plan.sparse_rules as rules
    monkeypatch.setattr(rules, "have_graphblas", lambda: False)
    monkeypatch.setattr(sk, "have_graphblas", lambda: False)
    with tensordb.connect(workers=2) as con:
        con.load("G", G)
        text = con.explain(sql)
        assert "spmm x0 sparse" in text and "GraphBLAS" not in text
        con.execute(sql)
        np.testing.assert_allclose(con.sparse("C").toarray(), (G @ G).toarray(), rtol=1e-12)
        D = _graph(150, 900, 8)
        con.load("D", D, fill_value=np.inf)
        d0 = np.full(150, np.inf)
        d0[0] = 0.0
        con.load("dist", d0)
        assert "GraphBLAS" not in con.explain(STEP.replace(
            "CREATE OR REPLACE TENSOR dist[k] AS", "x[k] ="))
        want = d0
        for _ in range(2):
            con.execute(STEP)
            want = _step(want, D)
            np.testing.assert_array_equal(con.tensor("dist"), want)


def test_spgemm_keeps_its_operands_graphblas_copies_until_a_replace(tmp_path, monkeypatch):
    """``C = G @ G`` of a stored graph of fill 0: both operands (a band of G's rows a call, and
    G) are copied into GraphBLAS by the first statement only; a replaced G is copied afresh
    and the product is the new graph's."""
    import graphblas as gb
    G1 = sp.csr_array(sp.random(600, 600, density=0.004, format="csr", random_state=1))
    G2 = sp.csr_array(sp.random(600, 600, density=0.004, format="csr", random_state=2))
    sql = "C[i,k] = SUM(G[i,j] * G[j,k])"
    made = []
    real = gb.io.from_scipy_sparse
    monkeypatch.setattr(gb.io, "from_scipy_sparse",
                        lambda x, *a, **k: made.append(x.shape) or real(x, *a, **k))
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("G", G1)
        assert "GraphBLAS plus_times" in con.explain(sql)
        con.execute(sql)
        first = len(made)
        assert first >= 1 and _entries("G")  # (one box when the plan makes one call)
        for _ in range(2):
            con.execute(sql)
            np.testing.assert_allclose(con.sparse("C").toarray(), (G1 @ G1).toarray(),
                                       rtol=1e-12)
        assert len(made) == first, made  # no copy after the first statement
        con.load("G", G2, replace=True)
        con.execute(sql)
        assert len(made) > first
        np.testing.assert_allclose(con.sparse("C").toarray(), (G2 @ G2).toarray(), rtol=1e-12)
        version = con.store.meta("G").version
        assert _entries("G") and all(k[1] == version for k in _entries("G"))


def test_a_band_of_a_csr_tiles_rows_is_read_as_views_of_its_payload(tmp_path):
    """A box of whole rows of one stored CSR tile shares the tile's memory (scipy's constructor
    copied a band under half of the payload it views), so the graph cache keeps its slot."""
    from tensordb.exec.graphcache import source_of
    from tensordb.exec.tasks import run_load
    from tensordb.physical.plan import Load
    from tensordb.storage.sparse import read_sparse_box
    G = sp.csr_array(sp.random(600, 600, density=0.01, format="csr", random_state=3))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("G", G)
        reader = con.store.open("G")
        assert reader.meta.grid == ((0, 600), (0, 600))
        tile = reader.stored_tile((0, 0))
        for r0, r1 in ((0, 100), (100, 600), (250, 251), (0, 600)):
            box = read_sparse_box(reader, (r0, 0), (r1, 600))
            np.testing.assert_array_equal(box.toarray(), G[r0:r1].toarray())
            if box.nnz:
                assert np.shares_memory(box.data, tile.data)
                assert np.shares_memory(box.indices, tile.indices)
            loaded = run_load(Load(0, "G", (r0, 0), (r1, 600)), reader)
            assert source_of(loaded) is not None  # tagged with its cache entry's slot
            np.testing.assert_array_equal(loaded.toarray(), G[r0:r1].toarray())


def test_fill_0_view_boxes_entries_are_capped_least_recently_used_first(tmp_path, monkeypatch):
    """A fill-0 view box's entry holds 0 bytes, so the byte cap never dropped one: reading 30
    distinct bands of a stored graph left 30 entries until G's version left. Now at most
    ``max_entries`` stay, the least recently used leaving first; every box read is G's rows."""
    from tensordb.exec.graphcache import source_of
    from tensordb.exec.tasks import run_load
    from tensordb.physical.plan import Load
    monkeypatch.setattr(GRAPHS, "max_entries", 8)
    G = sp.csr_array(sp.random(600, 600, density=0.01, format="csr", random_state=4))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("G", G)
        reader = con.store.open("G")
        bands = [(20 * b, 20 * b + 20) for b in range(30)]
        for n, (r0, r1) in enumerate(bands):
            loaded = run_load(Load(0, "G", (r0, 0), (r1, 600)), reader)
            assert source_of(loaded) is not None
            np.testing.assert_array_equal(loaded.toarray(), G[r0:r1].toarray())
            if n >= 1:  # the first band, read again each time: the most recently used
                again = run_load(Load(0, "G", (0, 0), (20, 600)), reader)
                np.testing.assert_array_equal(again.toarray(), G[0:20].toarray())
            assert len(GRAPHS) <= 8
        kept = sorted((k[2][0], k[3][0]) for k in _entries("G"))
        assert len(kept) == 8
        assert kept == sorted([(0, 20)] + bands[-7:])  # the 7 latest and the one read again



def test_a_store_is_listened_to_once_however_many_runs_and_a_new_one_too():
    """Every run tells the cache its store (``GraphCache.listen``): the first run on a store
    adds the cache's commit listener, the later ones none; another database gets its own;
    and each keeps dropping a replaced graph's entries (the SpMV after a replace answers with
    the new graph, against scipy's)."""
    D1, D2 = _graph(300, 2000, 5), _graph(300, 2000, 6)
    x = np.random.default_rng(7).standard_normal(300)
    added = []
    for _ in range(2):
        with tensordb.connect(None) as con:
            con.load("D", D1)
            con.load("x", x)
            con.execute("y[i] = SUM(D[i,j] * x[j])")
            after_first = list(con.store.commit_listeners)
            for _ in range(3):
                con.execute("y[i] = SUM(D[i,j] * x[j])")
            assert con.store.commit_listeners == after_first
            np.testing.assert_allclose(con.tensor("y"), D1 @ x, rtol=1e-12)
            assert _entries("D")
            con.execute("DROP TENSOR D")
            con.load("D", D2)
            con.execute("y[i] = SUM(D[i,j] * x[j])")
            np.testing.assert_allclose(con.tensor("y"), D2 @ x, rtol=1e-12)
            assert con.store.commit_listeners == after_first
            added.append(len(after_first))
    assert added[0] == added[1] >= 1  # each store: its own listener, added at its first run
