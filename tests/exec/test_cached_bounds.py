"""A cached plan's upper bound on the bytes a run holds (exec/budget.py ``upper_bytes``,
``device_upper_bytes``), which decides whether the run needs the memory budget's admission:
the plan cache keys a plan by its inputs' layout, which a new version of a sparse matrix with
ten times the entries keeps, so the bound must follow the version the plan reads now."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

import tensordb
from tensordb.exec import pool_run
from tensordb.exec.budget import device_upper_bytes, may_cross, upper_bytes

N = 1000
LIMIT = 1 << 20
Q = "y[i] = SUM(G[i,j] * x[j])"


def test_a_cached_plan_bounds_the_new_versions_entries(tmp_path, monkeypatch):
    made = []
    real_init = pool_run._Run.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(pool_run._Run, "__init__", init)
    rng = np.random.default_rng(5)
    few = sp.random_array((N, N), density=0.001, format="csr", rng=rng)
    many = sp.random_array((N, N), density=0.1, format="csr", rng=rng)  # 1.2 MB of CSR
    x = rng.standard_normal(N)
    with tensordb.connect(tmp_path / "g.tdb", workers=2, memory_limit=LIMIT) as con:
        con.load("x", x)
        con.load("G", few)
        con.execute(Q)
        np.testing.assert_allclose(con.tensor("y"), few @ x, rtol=1e-12, atol=1e-12)
        first = con.engine.last_plan
        assert not may_cross(first, LIMIT, sparse=True)
        con.load("G", many, replace=True)
        assert con.store.meta("G").nnz == many.nnz
        con.execute(Q)
        np.testing.assert_allclose(con.tensor("y"), many @ x, rtol=1e-12, atol=1e-12)
        plan = con.engine.last_plan
        assert plan.tasks is first.tasks, "not the cached plan: the test shows nothing"
        held = many.data.nbytes + many.indices.nbytes  # what its Loads read, at least
        assert held > LIMIT
        assert upper_bytes(plan, sparse=True) >= held
        assert device_upper_bytes(plan) >= held
        assert may_cross(plan, LIMIT, sparse=True)
        # and so the run was admitted task by task (not the straight line, no budget)
        assert made and made[-1].plan.tasks is plan.tasks and made[-1].budget is not None


def test_a_dense_inputs_new_version_keeps_the_cached_bound(monkeypatch):
    """A training step replaces its dense weights each call: same layout, same bytes. The
    cached plan's bound stays (worked out again each call it cost a logistic step 80 us),
    while the answer follows the new version."""
    from tensordb.exec import budget
    calls = []
    real = budget.working_bytes

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(budget, "working_bytes", counted)
    rng = np.random.default_rng(3)
    with tensordb.connect(workers=2) as con:
        con.load("X", rng.standard_normal((64, 8)))
        con.load("W", rng.standard_normal((8, 4)))
        q = "Z[b,c] = SUM(X[b,f] * W[f,c])"
        con.execute(q)
        bound = upper_bytes(con.engine.last_plan)
        calls.clear()
        for _ in range(3):
            w = rng.standard_normal((8, 4))
            con.load("W", w, replace=True)
            con.execute(q)
            plan = con.engine.last_plan
            assert upper_bytes(plan) == bound
            np.testing.assert_allclose(con.tensor("Z"), con.tensor("X") @ w, rtol=1e-12)
        assert calls == []
