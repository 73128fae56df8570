"""PageRank in the dialect (sql/pagerank.sql's step): one group of statements a step, its plan
cached, run to convergence from Python; the ranks against networkx.pagerank (the oracle) and the
same iteration in scipy; the script's twelve steps against the iteration in numpy."""
from __future__ import annotations

import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import tensordb

ROOT = Path(__file__).parents[2]
ALPHA, TOL = 0.85, 1e-6


def step(n: int) -> str:
    """sql/pagerank.sql's step, for a graph of ``n`` nodes."""
    text = (ROOT / "sql" / "pagerank.sql").read_text()
    one = text[text.index("-- step 1\n") + len("-- step 1\n"):text.index("-- step 2\n")]
    return one.replace("/ 64", f"/ {n}")


def matrices(g: nx.DiGraph, n: int):
    """M[i,j] = w(j -> i) / out-weight(j), and the dangling nodes, as networkx weighs them."""
    A = sp.csr_array(nx.to_scipy_sparse_array(g, nodelist=range(n), weight="weight"))
    out = np.asarray(A.sum(axis=1)).ravel()
    M = sp.csr_array(A.T.multiply(1.0 / np.where(out > 0, out, 1)))
    return M, (out == 0).astype(np.float64)


def iterate(M, dangling, n, steps=None):
    r = np.full(n, 1.0 / n)
    for s in range(1, (steps or 1000) + 1):
        rn = ALPHA * (M @ r + (dangling @ r) / n) + (1 - ALPHA) / n
        err = np.abs(rn - r).sum()
        r = rn
        if steps is None and err < n * TOL:
            return r, s
    return r, steps


@pytest.mark.parametrize("workers,weighted", [(1, False), (2, True)])
def test_pagerank_to_convergence_equals_networkx(workers, weighted):
    n = 400
    g = nx.DiGraph(nx.scale_free_graph(n, seed=3))      # a power-law graph, repeats merged
    g.add_nodes_from(range(n))
    g.remove_edges_from([(u, v) for u, v in g.edges if u % 23 == 0])   # dangling nodes
    rng = np.random.default_rng(4)
    for u, v in g.edges:
        g[u][v]["weight"] = float(rng.integers(1, 5)) if weighted else 1.0
    M, dangling = matrices(g, n)
    assert dangling.sum() > 0
    want = nx.pagerank(g, alpha=ALPHA, tol=TOL, weight="weight")
    want = np.array([want[i] for i in range(n)])
    ref, ref_steps = iterate(M, dangling, n)
    with tensordb.connect(workers=workers) as con:
        con.load("pr_M", M)
        con.load("pr_dangling", dangling)
        con.load("pr_r", np.full(n, 1.0 / n))
        text = step(n)
        steps = 0
        while True:
            con.execute(text)
            steps += 1
            if float(con.tensor("pr_err")) < n * TOL or steps > 200:
                break
        got = con.tensor("pr_r")
        # planned once: every later step's plans come from the cache
        before = con.plan_cache_stats
        con.execute(text)
        after = con.plan_cache_stats
        assert after["misses"] == before["misses"] and after["hits"] > before["hits"]
        assert "spmm" in con.explain(text.splitlines()[0].rstrip(";").replace("pr_rn[i] =",
                                                                             "x[i] ="))
    assert steps == ref_steps
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
    # networkx stops at the same test; its ranks are the same iteration's
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    assert abs(got.sum() - 1) < 1e-9


def test_the_pagerank_script_matches_twelve_steps_in_numpy(tmp_path):
    with tensordb.connect(tmp_path / "db") as con:
        con.execute((ROOT / "sql" / "pagerank.sql").read_text())
        got = con.tensor("pr_r")
        edges = con.sql("SELECT src, dst FROM pr_edges").fetchall()
    n = 64
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    M, dangling = matrices(g, n)
    want, _ = iterate(M, dangling, n, steps=12)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert len(re.findall(r"^-- step \d+$", (ROOT / "sql" / "pagerank.sql").read_text(),
                          re.M)) == 12
