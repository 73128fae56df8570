"""The graph cache keeps a fill-0 stored matrix's CSR view between statements (exec/graphcache.py):
a plan-cached SpMV reads no payload, decodes nothing and builds no scipy object on a hit. A kept
view must never answer for another version: a replaced matrix, a dropped and re-made one, a
rolled-back replace, a commit of another connection on the same database, each gives the new
answer (numpy's product of the densified inputs), in memory and on disk, where the repeated
statement is replayed (driver/replay.py) as where it is planned again."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec.graphcache import GRAPHS, source_of

MV = "w[i] = SUM(G[i,j] * v[j])"
N = 300


def _graph(seed: int):
    rng = np.random.default_rng(seed)
    G = sp.csr_array(sp.coo_array((rng.random(3000) + 0.5, (rng.integers(0, N, 3000),
                                                            rng.integers(0, N, 3000))),
                                  shape=(N, N)))
    G.sum_duplicates()
    return G


def _want(G, v) -> np.ndarray:
    return np.einsum("ij,j->i", G.toarray(), v)


def _versions(name: str) -> set:
    return {w[0][1] for w in GRAPHS.names.get(name.lower(), ())}


@pytest.fixture(autouse=True)
def _empty_cache():
    GRAPHS.clear()
    yield
    GRAPHS.clear()


@pytest.fixture(params=["memory", "disk"])
def where(request, tmp_path):
    return None if request.param == "memory" else tmp_path / "g.tdb"


def _mv(con, G, v) -> None:
    con.execute(MV)
    np.testing.assert_allclose(con.tensor("w"), _want(G, v), rtol=1e-12, atol=1e-12)


def test_a_hit_serves_the_kept_view_and_a_replace_serves_the_new_matrix(where):
    G1, G2 = _graph(1), _graph(2)
    v = np.random.default_rng(0).standard_normal(N)
    with tensordb.connect(where, workers=1) as con:
        con.load("G", G1)
        con.load("v", v)
        _mv(con, G1, v)
        (key,) = [w for w in GRAPHS.entries if w[0][0] == "g"]
        kept = GRAPHS.entries[key].array.csr
        assert not kept.data.flags.writeable  # a view of the payload, nobody writes into it
        assert source_of(kept) is GRAPHS.entries[key].array
        hits = GRAPHS.hits
        _mv(con, G1, v)
        _mv(con, G1, v)
        assert GRAPHS.hits == hits + 2
        assert con.engine.cache.replay.replays >= 1  # the replay path serves it too (replay.py)
        assert GRAPHS.entries[key].array.csr is kept and GRAPHS.entries[key].nbytes == 0
        first = _versions("G")
        con.load("G", G2, replace=True)
        assert _versions("G") == set()  # the replaced version left at the commit
        _mv(con, G2, v)
        _mv(con, G2, v)
        assert _versions("G") and _versions("G") != first


def test_a_dropped_and_remade_matrix_is_read_again(where):
    G1, G2 = _graph(3), _graph(4)
    v = np.random.default_rng(1).standard_normal(N)
    with tensordb.connect(where, workers=1) as con:
        con.load("G", G1)
        con.load("v", v)
        _mv(con, G1, v)
        _mv(con, G1, v)
        con.execute("DROP TENSOR G")
        assert _versions("G") == set()
        con.load("G", G2)
        _mv(con, G2, v)
        _mv(con, G2, v)


def test_a_rolled_back_replace_gives_the_old_answer_a_committed_one_the_new(where):
    G = _graph(5)
    GG = G.multiply(G)  # the replace below (a sparse join: its output is stored sparse too)
    v = np.random.default_rng(2).standard_normal(N)
    with tensordb.connect(where, workers=1) as con:
        con.load("G", G)
        con.load("v", v)
        _mv(con, G, v)
        _mv(con, G, v)
        (old,) = _versions("G")
        con.execute("BEGIN")
        con.execute("CREATE OR REPLACE TENSOR G[i,j] AS G[i,j] * G[i,j]")
        con.execute(MV)
        con.execute("ROLLBACK")
        _mv(con, G, v)
        _mv(con, G, v)
        assert _versions("G") == {old}
        con.execute("BEGIN")
        con.execute("CREATE OR REPLACE TENSOR G[i,j] AS G[i,j] * G[i,j]")
        con.execute(MV)
        con.execute("COMMIT")
        np.testing.assert_allclose(con.tensor("w"), _want(GG, v), rtol=1e-12)
        _mv(con, GG, v)
        hits = GRAPHS.hits
        _mv(con, GG, v)
        assert GRAPHS.hits == hits + 1 and len(_versions("G")) == 1 and _versions("G") != {old}


def test_another_connections_commit_is_seen(tmp_path):
    G1, G2 = _graph(6), _graph(7)
    v = np.random.default_rng(3).standard_normal(N)
    path = tmp_path / "g.tdb"
    with tensordb.connect(path, workers=1) as con:
        con.load("G", G1)
        con.load("v", v)
    with tensordb.connect(path, workers=1) as a, tensordb.connect(path, workers=1) as b:
        _mv(a, G1, v)
        _mv(a, G1, v)
        first = _versions("G")
        b.load("G", G2, replace=True)
        _mv(a, G2, v)
        _mv(a, G2, v)
        assert len(_versions("G")) == 1 and _versions("G") != first
        b.execute("DROP TENSOR G")
        b.load("G", G1 * 2)
        _mv(a, G1 * 2, v)
        _mv(b, G1 * 2, v)
