"""How long the graph cache (exec/graphcache.py) keeps a fill-0 matrix's view, and what names it.

A kept view pins its payload's mapping: it must leave when its version is replaced or its
database closes (else a replaced or closed tensor's file, deleted, stays mapped and on disk), and
its name must not be taken by another payload (a database reopened numbers its versions from the
highest it finds, so a tensor dropped and made again can get the old version and payload name).
Answers are numpy's product of the densified inputs; what is mapped is read from /proc."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import tensordb
from tensordb.exec import graphcache
from tensordb.exec.graphcache import GRAPHS
from tests.sparse.test_spmv_view_cache import (  # noqa: F401 (fixtures)
    MV, N, _empty_cache, _graph, _mv, where)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc")


def _mapped(directory: str) -> list[str]:
    """The payload files under ``directory`` this process maps (a deleted one marked so)."""
    gc.collect()
    with open("/proc/self/maps") as f:
        return sorted({line.split(None, 5)[5].strip() for line in f
                       if len(line.split(None, 5)) == 6 and directory in line})


def test_a_version_number_taken_again_after_a_reopen_is_read_again(tmp_path):
    """Dropped and made again after a reopen, G gets its old version and payload name: the
    view kept from the first open (the old, deleted file) must not answer for it."""
    path = tmp_path / "g.tdb"
    G1, G2 = _graph(1), _graph(2)
    v = np.random.default_rng(0).standard_normal(N)
    with tensordb.connect(path, workers=1) as con:
        con.load("G", G1)
        con.load("v", v)
        _mv(con, G1, v)
        _mv(con, G1, v)
        first = con.store.meta("G").version
    with tensordb.connect(path, workers=1) as con:  # no statement runs: no commit is heard
        con.execute("DROP TENSOR w")
        con.execute("DROP TENSOR G")
        con.execute("DROP TENSOR v")
    with tensordb.connect(path, workers=1) as con:
        con.load("G", G2)
        con.load("v", v)
        assert con.store.meta("G").version == first  # the case: the same name, version, box
        _mv(con, G2, v)
        _mv(con, G2, v)


def test_replaced_versions_are_let_go(where):
    """Replaced five times with an SpMV between: only the current G's and v's payloads stay
    mapped (each replaced one's view was kept, and its file held, before)."""
    v = np.random.default_rng(1).standard_normal(N)
    with tensordb.connect(where, workers=1) as con:
        con.load("v", v)
        tiles = con.store.tiles_dir
        for k in range(5):
            G = _graph(10 + k)
            con.load("G", G, replace=True)
            _mv(con, G, v)
            _mv(con, G, v)
        mapped = _mapped(tiles)
        assert len(mapped) <= 2 and not any("(deleted)" in m for m in mapped), mapped
        assert len(graphcache._TAGS) <= 1


def test_a_closed_database_lets_go_of_its_views(where):
    """Closed, a database's kept views leave the cache, and none of its payloads stays mapped
    (an in-memory database's files are deleted at close: their space was held)."""
    G = _graph(3)
    v = np.random.default_rng(2).standard_normal(N)
    with tensordb.connect(where, workers=1) as con:
        con.load("G", G)
        con.load("v", v)
        _mv(con, G, v)
        _mv(con, G, v)
        tiles, database = con.store.tiles_dir, con.store.database
        assert any(w[1][0] == database for w in GRAPHS.entries)
    assert not any(w[1][0] == database for w in GRAPHS.entries)
    del con  # (a closed connection keeps its last plan, and that its readers)
    assert _mapped(tiles) == []
    with tensordb.connect(where, workers=1) as con:  # and a reopen reads it again
        if where is not None:
            _mv(con, G, v)


def _worker_state():
    """(graph cache entries, deleted payload files mapped) in a Dask worker."""
    gc.collect()
    with open("/proc/self/maps") as f:
        deleted = sum(1 for line in f if ".bin" in line and "(deleted)" in line)
    return len(GRAPHS.entries), deleted


def test_a_dask_worker_lets_go_of_replaced_versions(tmp_path):
    """A Dask worker hears no commit: the next read of G at its new version drops the views of
    the old ones there (each held its deleted payload file mapped before)."""
    v = np.random.default_rng(4).standard_normal(N)
    with tensordb.connect(tmp_path / "g.tdb", workers=2, executor="dask") as con:
        con.load("v", v)
        for k in range(4):
            G = _graph(20 + k)
            con.load("G", G, replace=True)
            _mv(con, G, v)
            _mv(con, G, v)
        states = con.engine.executor().client.run(_worker_state).values()
        assert all(entries <= 1 and deleted == 0 for entries, deleted in states), states


STATEMENTS = [  # each reads G's kept view as an SpMV, SpMM, SpGEMM, transposed, masked, join
    ("w[i] = SUM(G[i,j] * v[j])", lambda G, v, X: np.einsum("ij,j->i", G, v)),
    ("Y[i,k] = SUM(G[i,j] * X[j,k])", lambda G, v, X: np.einsum("ij,jk->ik", G, X)),
    ("Q[i,k] = SUM(G[i,j] * G[j,k])", lambda G, v, X: np.einsum("ij,jk->ik", G, G)),
    ("t[j] = SUM(G[i,j] * v[i])", lambda G, v, X: np.einsum("ij,i->j", G, v)),
    ("H[i,j] = G[i,j] * G[i,j]", lambda G, v, X: G * G),
    ("s[i] = SUM(G[i,j])", lambda G, v, X: G.sum(axis=1)),
]


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_no_statement_changes_the_kept_matrix(where, tmp_path):
    """Every kind of statement, each twice, on the same kept CSR object: its arrays stay the
    loaded matrix's (read-only, bit for bit) and every answer is numpy's."""
    G = _graph(8)
    rng = np.random.default_rng(5)
    v, X = rng.standard_normal(N), rng.standard_normal((N, 4))
    dense = G.toarray()
    with tensordb.connect(None if where == "memory" else tmp_path / "g.tdb", workers=2) as con:
        con.load("G", G)
        con.load("v", v)
        con.load("X", X)
        for _ in range(2):
            for sql, want in STATEMENTS:
                con.execute(sql)
                out = sql.split("[")[0]
                np.testing.assert_allclose(con.tensor(out), want(dense, v, X), rtol=1e-10,
                                           atol=1e-10, err_msg=sql)
        kept = [e.array.csr for w, e in GRAPHS.entries.items() if w[0][0] == "g"]
        assert kept
        for csr in kept:
            assert not (csr.data.flags.writeable or csr.indices.flags.writeable
                        or csr.indptr.flags.writeable)
            np.testing.assert_array_equal(csr.toarray(), dense)
            np.testing.assert_array_equal(csr.indptr, G.indptr)
            np.testing.assert_array_equal(csr.indices, G.indices)


def test_a_dropped_matrix_leaves_no_mapping_and_no_file(where):
    """DROP TENSOR G after SpMVs: its view leaves the cache, its payload is neither mapped (a
    deleted file whose space stays taken) nor left in tiles/, and CHECK DATABASE is clean."""
    G = _graph(30)
    v = np.random.default_rng(6).standard_normal(N)
    with tensordb.connect(where, workers=1) as con:
        con.load("G", G)
        con.load("v", v)
        _mv(con, G, v)
        _mv(con, G, v)
        tiles = con.store.tiles_dir
        (file,) = {r[0] for r in con.sql(
            "SELECT DISTINCT file FROM tensordb.tiles WHERE tensor = 'G'").fetchall()}
        con.execute("DROP TENSOR G")
        assert not any(w[0][0] == "g" for w in GRAPHS.entries)
        con.execute("s = SUM(v[i])")  # (the connection's last plan held G's reader till now)
        np.testing.assert_allclose(float(con.tensor("s")), v.sum(), rtol=1e-12)
        assert not [m for m in _mapped(tiles) if file in m]
        assert not os.path.exists(os.path.join(tiles, file))
        assert con.execute("CHECK DATABASE").fetchall() == [(None, None, None, None, "ok")]


def test_a_cluster_s_worker_reads_a_version_taken_again_after_a_reopen(tmp_path):
    """A Dask cluster that outlives the connections (other processes: no close is heard
    there): G dropped and made again after a reopen has its old version and payload name; the
    worker's kept view of the first G (its deleted file) must not answer for it."""
    from tensordb.exec.dask import local_cluster
    path = tmp_path / "g.tdb"
    G1, G2 = _graph(40), _graph(41)
    v = np.random.default_rng(7).standard_normal(N)
    cluster = local_cluster(1)
    spec = f"dask://{cluster.scheduler_address}"
    try:
        with tensordb.connect(path, workers=1, executor=spec) as con:
            con.load("G", G1)
            con.load("v", v)
            _mv(con, G1, v)
            _mv(con, G1, v)
            first = con.store.meta("G").version
        with tensordb.connect(path, workers=1) as con:
            for name in ("w", "G", "v"):
                con.execute(f"DROP TENSOR {name}")
        with tensordb.connect(path, workers=1, executor=spec) as con:
            con.load("G", G2)
            con.load("v", v)
            assert con.store.meta("G").version == first
            _mv(con, G2, v)
            _mv(con, G2, v)
    finally:
        cluster.close()
