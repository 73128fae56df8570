"""Small queries cost their kernels plus a few catalog statements (issue 12): what the fast path
keeps. Checked on real catalogs (a DuckDB file on disk) against numpy and against the catalog
itself: a user table of the result's name is still refused, planned afresh or with the plan
cached; a replaced tensor leaves exactly its new rows and payload file; a tiny plan, run on the
calling thread, gives numpy's answer, and Ctrl-C there stores nothing; a zero keeps its sign."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tensordb
from tests.files import payload_files

MATMUL = "C[i,k] = SUM(A[i,j] * B[j,k])"


def _catalog_files(con) -> set[str]:
    return {r[0] for r in con.store.duck.execute("SELECT DISTINCT file FROM tensordb.tiles").fetchall()}


@pytest.fixture
def con(tmp_path):
    rng = np.random.default_rng(0)
    with tensordb.connect(tmp_path / "db", workers=2) as c:
        c.load("A", rng.standard_normal((64, 64), dtype=np.float32))
        c.load("B", rng.standard_normal((64, 64), dtype=np.float32))
        yield c


def test_a_replaced_result_leaves_exactly_its_new_rows_and_file(con):
    a, b = con.tensor("A"), con.tensor("B")
    for _ in range(3):  # planned, then twice with the plan cached
        con.execute(MATMUL)
    np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-5, atol=1e-5)
    meta = con.store.meta("C")
    rows = con.store.duck.execute("SELECT name, version, tile_count, nnz FROM tensordb.tensors "
                                  "WHERE lower(name) = 'c'").fetchall()
    assert rows == [("C", meta.version, meta.tile_count, int(np.count_nonzero(a @ b)))]
    tiles = con.store.duck.execute("SELECT DISTINCT version FROM tensordb.tiles "
                                   "WHERE tensor = 'C'").fetchall()
    assert tiles == [(meta.version,)]
    # Every payload file is referenced by the catalog, and every referenced one is there.
    assert set(payload_files(con.store)) == _catalog_files(con)
    assert [r["problem"] for r in con.check()] == ["ok"]  # checksums, counts, no orphans


@pytest.mark.parametrize("cached", [False, True])
def test_a_result_named_like_a_user_table_is_refused_and_nothing_changes(con, cached):
    con.execute(MATMUL)
    if not cached:
        con._plan_cache.clear()
    con.drop("C")
    con.sql("CREATE TABLE c (x INTEGER)")
    con.sql("INSERT INTO c VALUES (7)")
    files = payload_files(con.store)
    hits = con.plan_cache_stats["hits"]
    with pytest.raises(tensordb.CatalogError, match="a table named 'c' exists"):
        con.execute(MATMUL)
    assert con.plan_cache_stats["hits"] == hits + (1 if cached else 0)
    assert not con.store.has("C")
    assert con.sql("SELECT x FROM c").fetchall() == [(7,)]
    assert payload_files(con.store) == files
    con.execute("D[i,k] = SUM(A[i,j] * B[j,k])")  # the connection goes on
    np.testing.assert_allclose(con.tensor("D"), con.tensor("A") @ con.tensor("B"), rtol=1e-5,
                               atol=1e-5)


def test_a_large_new_statement_is_refused_before_it_runs(con):
    """A statement planned afresh whose kernels are more than EARLY_CHECK_FLOPS looks for a user
    table of its output's name before the run: a refused name costs no compute. A small one
    leaves that to its commit (the test above): the same error, nothing stored."""
    from tensordb.driver.sink import EARLY_CHECK_FLOPS
    big = np.random.default_rng(2).standard_normal((512, 512))
    assert 2 * 512 ** 3 > EARLY_CHECK_FLOPS
    con.load("G", big, tile=(128, 128))
    con.sql("CREATE TABLE h (x INTEGER)")
    ran = con.last_run
    with pytest.raises(tensordb.CatalogError, match="a table named 'h' exists"):
        con.execute("H[i,k] = SUM(G[i,j] * G[j,k])")
    assert con.last_run is ran and not con.store.has("H")


def test_a_new_version_of_a_tensor_does_not_look_for_user_tables(con, monkeypatch):
    """Replacing a stored tensor leaves the shared namespace as it was: its commit makes no
    catalog query for user tables (1-1.5 ms of a training step). A new name still does, and
    a table named like a tensor is still refused by SQL."""
    from tensordb.storage import catalog
    asked = []
    real = catalog.tables_named
    monkeypatch.setattr(catalog, "tables_named", lambda duck, names: asked.append(
        sorted(names)) or real(duck, names))
    con.execute(MATMUL)  # C is new: looked for
    assert asked == [["C"]]
    asked.clear()
    con.execute(MATMUL)  # a new version of C, plan cached
    con._plan_cache.clear()
    con.execute(MATMUL)  # and planned afresh
    assert asked == []
    np.testing.assert_allclose(con.tensor("C"), con.tensor("A") @ con.tensor("B"), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(tensordb.CatalogError, match="a tensor named 'C' exists"):
        con.sql("CREATE TABLE c (x INTEGER)")


def test_a_tiny_plan_runs_on_the_calling_thread_with_numpys_answer(con):
    threads = set()
    con.progress_callback = lambda done, total: threads.add(threading.get_ident())
    # Two pieces of j: two kernel calls and the aggregation that adds them.
    con.execute("E[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 1, j 2, k 1)")
    np.testing.assert_allclose(con.tensor("E"), con.tensor("A") @ con.tensor("B"), rtol=1e-5,
                               atol=1e-5)
    assert con.last_run.kernel_calls == 2
    assert threads == {threading.get_ident()}
    # A plan too large to run inline goes to the workers, with the same answer.
    rng = np.random.default_rng(1)
    big = rng.standard_normal((512, 512))
    con.load("G", big, tile=(128, 128))
    threads.clear()
    con.execute("H[i,k] = SUM(G[i,j] * G[j,k])")
    np.testing.assert_allclose(con.tensor("H"), big @ big, rtol=1e-10, atol=1e-9)
    from tensordb.exec.pool import _tiny
    assert not _tiny(con.last_plan) and not _tiny(con.last_plan, fast=True)  # the workers ran it
    # progress is reported on the calling thread only (the workers count, it reports): a
    # callback may use the connection, whose calls wait for the one running the plan
    assert threads == {threading.get_ident()}


def test_ctrl_c_in_a_tiny_plan_stores_nothing(con):
    con.execute(MATMUL)
    before = con.tensor("C").copy()
    files = payload_files(con.store)

    def interrupt(done, total):
        raise KeyboardInterrupt

    con.progress_callback = interrupt
    with pytest.raises(KeyboardInterrupt):
        con.execute("C[i,k] = SUM(A[i,j] * A[j,k])")
    con.progress_callback = None
    np.testing.assert_array_equal(con.tensor("C"), before)
    assert payload_files(con.store) == files
    con.execute("C[i,k] = SUM(A[i,j] * A[j,k])")
    a = con.tensor("A")
    np.testing.assert_allclose(con.tensor("C"), a @ a, rtol=1e-5, atol=1e-5)


def test_a_zero_keeps_its_sign_as_numpy_gives_it(tmp_path):
    a = np.array([1.0, -2.0, 0.0, 3.0])
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.execute("B[i] = A[i] * -0.0")
        got, want = con.tensor("B"), a * -0.0
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        # ... and what reads it sees the sign: 1 / -0.0 is -inf
        con.execute("R[i] = 1.0 / B[i]")
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(con.tensor("R"), 1.0 / want)
        # A computed tile of +0.0 alone stays absent, one holding -0.0 is stored (nnz 0).
        con.load("S", np.array([[-1.0, 0.0], [1.0, 0.0]]), tile=(1, 2))
        con.execute("Z[i,j] = S[i,j] * 0.0")
        s = con.tensor("S")
        np.testing.assert_array_equal(np.signbit(con.tensor("Z")), np.signbit(s * 0.0))
        assert (con.store.meta("Z").tile_count, con.store.meta("Z").nnz) == (1, 0)
        # A loaded tile of zeros is absent whatever their signs: an array masked by a product
        # (x * 0 is -0.0 for a negative x) loads block-sparse.
        con.load("M", s * np.array([[0.0, 0.0], [1.0, 1.0]]), tile=(1, 2))
        assert con.store.meta("M").tile_count == 1
    with tensordb.connect(tmp_path / "db") as con:  # and after reopening
        np.testing.assert_array_equal(np.signbit(con.tensor("B")), np.signbit(want))


@pytest.mark.parametrize("kind", ["TABLE", "VIEW"])
def test_a_group_of_outputs_is_refused_whole_when_any_is_named_like_a_user_table(con, kind):
    """The commit of several outputs asks the catalog for user tables once for all their names
    (inside its transaction): a table or view named like the second output, created after the
    plan was cached, refuses the whole group and stores none of it."""
    group = "P[i,k] = SUM(A[i,j] * B[j,k]); Q[i,k] = P[i,k] + A[i,k]; R[i] = SUM(Q[i,k])"
    con.execute(group)
    before = {n: con.tensor(n) for n in "PQR"}
    versions = {n: con.store.meta(n).version for n in "PQR"}
    con.drop("Q")
    con.sql(f"CREATE {kind} q AS SELECT 7 AS x")
    files = payload_files(con.store)
    hits = con.plan_cache_stats["hits"]
    with pytest.raises(tensordb.CatalogError, match="cannot create tensor 'Q': a table named 'q'"):
        con.execute(group)  # its plan cached: the commit's check refuses it
    assert con.plan_cache_stats["hits"] == hits + 1
    assert {n: con.store.meta(n).version for n in "PR"} == {n: versions[n] for n in "PR"}
    assert not con.store.has("Q")
    assert payload_files(con.store) == files
    for n in "PR":
        np.testing.assert_array_equal(con.tensor(n), before[n])
    con.sql(f"DROP {kind} q")
    con.execute(group)  # with the name free again, the whole group lands
    a, b = con.tensor("A"), con.tensor("B")
    np.testing.assert_allclose(con.tensor("Q"), a @ b + a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(con.tensor("R"), (a @ b + a).sum(1), rtol=1e-4, atol=1e-3)
    assert [r["problem"] for r in con.check()] == ["ok"]


def _rows(con, name):
    """The catalog rows of tensor ``name`` without its version, file and time: what a tensor
    loaded afresh with the same values has too."""
    t = con.store.duck.execute(
        "SELECT name, dtype, shape, dims, grid, nbytes, tile_count, nnz, density "
        "FROM tensordb.tensors WHERE lower(name) = lower(?)", [name]).fetchall()
    tiles = con.store.duck.execute(
        'SELECT coords, starts, shape, "offset", nbytes, nnz, crc32, nonfinite FROM '
        "tensordb.tiles WHERE lower(tensor) = lower(?) ORDER BY coords", [name]).fetchall()
    return t, tiles


@pytest.mark.parametrize("second", [
    np.full((6, 4), 2.0),                          # the same layout: only the scalars change
    np.full((5, 3), 2.0),                          # a new shape: the list columns change too
    np.pad(np.ones((2, 4)), ((4, 0), (0, 0))),     # one tile of two present: another one
])
@pytest.mark.parametrize("tile", [(3, 4), None])  # two tiles, or one whole-tensor tile
def test_a_replaced_tensor_has_the_rows_a_fresh_one_would(tmp_path, second, tile):
    """Replacing a tensor updates its catalog rows in place, the list columns only where they
    change: the rows must be those of the same values loaded under a new name, also when the
    new version is spelled in another case, has another shape, or its lone tile moves."""
    first = np.pad(np.ones((2, 4)), ((0, 4), (0, 0)))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("T", first, tile=tile)
        con.load("t", second, tile=tile, replace=True)
        con.load("fresh", second, tile=tile)
        (t,), tiles = _rows(con, "t")
        (f,), fresh_tiles = _rows(con, "fresh")
        assert t == ("t",) + f[1:]
        assert tiles == fresh_tiles
        np.testing.assert_array_equal(con.tensor("T"), second)
        assert [r["problem"] for r in con.check()] == ["ok"]
