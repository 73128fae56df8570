"""The plan cache (tensordb/driver/cache.py): a repeated statement reuses its plan while its inputs keep
their layout (grid, present tiles, NaN/inf and all-nonzero flags per tile), whatever their
versions; a new layout (other present tiles, a NaN, a zero), a setting that steers planning or
different pieces plan again. A reused plan reads the inputs' current versions. Every result is
checked against numpy."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensordb

ROOT = Path(__file__).resolve().parents[2]
SQL = "C[i,k] = SUM(A[i,j] * B[j,k])"


@pytest.fixture
def con(tmp_path):
    rng = np.random.default_rng(3)
    c = tensordb.connect(tmp_path / "db", workers=2)
    c.load("A", rng.standard_normal((12, 10)), tile=(4, 5))
    c.load("B", rng.standard_normal((10, 6)), tile=(5, 3))
    yield c
    c.close()


def _check(con):
    np.testing.assert_allclose(con.tensor("C"), con.tensor("A") @ con.tensor("B"))


def test_a_repeated_statement_hits_the_cache(con):
    con.execute(SQL)
    assert con.plan_cache_stats == {"hits": 0, "misses": 1, "size": 1}
    first = con.last_plan
    for n in range(1, 4):
        con.execute(SQL)
        _check(con)
        assert con.plan_cache_stats["hits"] == n
        assert con.last_plan.tasks is first.tasks  # the very plan, not planned again
    # EXPLAIN of the same statement is planned from the same graph: a hit too.
    con.explain(SQL)
    assert con.plan_cache_stats["hits"] == 4


def _deleted_mappings(root) -> list[str]:
    """Payload files under ``root`` this process still maps although they were deleted."""
    with open("/proc/self/maps") as f:
        return [line.split(None, 5)[-1].strip() for line in f
                if str(root) in line and line.rstrip().endswith("(deleted)")]


def test_a_new_version_of_the_same_layout_hits_and_reads_the_new_values(con, tmp_path):
    sql = SQL + " WITH (PIECES i 3, j 2, k 2)"  # A's (4, 5) tiles are the pieces of i and j
    con.execute(sql)
    first = con.last_plan
    rng = np.random.default_rng(9)
    for n in range(1, 4):
        con.load("A", rng.standard_normal((12, 10)), tile=(4, 5), replace=True)
        con.execute(sql)
        _check(con)  # the new values, not the ones the plan was made with
        assert con.plan_cache_stats == {"hits": n, "misses": 1, "size": 1}
        assert con.last_plan.tasks is first.tasks
        assert con.last_plan.readers["A"].meta.version == con.store.meta("A").version
        assert con.last_run.kernel_calls == 3 * 2 * 2
    # The cache keeps no readers: once no plan of the last run reads A, no replaced payload
    # file of A stays mapped.
    del first  # (the first run's plan, with its readers)
    con.execute("E[j] = SUM(B[j,k])")
    gc.collect()
    np.testing.assert_allclose(con.tensor("E"), con.tensor("B").sum(1))
    assert _deleted_mappings(tmp_path) == []


def test_a_new_layout_misses(con):
    sql = SQL + " WITH (PIECES i 3, j 2, k 2)"
    con.execute(sql)
    # Block-sparse: other kernel calls, so the old plan must not come back.
    a = con.tensor("A")
    a[:8] = 0
    con.load("A", a, tile=(4, 5), replace=True)
    con.execute(sql)
    _check(con)
    assert con.plan_cache_stats == {"hits": 0, "misses": 2, "size": 2}
    present = sum(bool(a[4 * i:4 * i + 4, 5 * j:5 * j + 5].any()) for i in range(3) for j in range(2))
    assert con.last_run.kernel_calls == present * 2
    # The same pattern with other values: a hit.
    a[8:] *= 3
    con.load("A", a, tile=(4, 5), replace=True)
    con.execute(sql)
    _check(con)
    assert con.plan_cache_stats["hits"] == 1 and con.last_run.kernel_calls == present * 2


def test_a_nan_or_a_zero_appearing_in_an_input_misses(con):
    """The skipped products depend on each tile's NaN/inf flag and whether it holds a 0: a
    SUM of products skips the calls of absent tiles only where the partner is finite (0 * inf
    is NaN), so a plan made for a finite B would give 0 where numpy gives NaN."""
    a = con.tensor("A")
    a[:4] = 0  # A's first row of tiles absent
    con.load("A", a, tile=(4, 5), replace=True)
    sql = SQL + " WITH (PIECES i 3, j 2, k 2)"  # A's tiles are the pieces

    def check():
        with np.errstate(invalid="ignore"):
            expected = (con.tensor("A")[:, :, None] * con.tensor("B")[None]).sum(1)
        np.testing.assert_array_equal(np.isnan(con.tensor("C")), np.isnan(expected))
        np.testing.assert_allclose(con.tensor("C"), expected)

    con.execute(sql)
    check()
    assert con.plan_cache_stats["misses"] == 1
    b = con.tensor("B")
    b[0, 0] = np.inf  # 0 * inf is NaN: the absent tiles of A no longer give 0 for sure
    con.load("B", b, tile=(5, 3), replace=True)
    con.execute(sql)
    check()
    assert np.isnan(con.tensor("C")[:4, 0]).all()
    assert con.plan_cache_stats == {"hits": 0, "misses": 2, "size": 2}
    b[0, 0] = 1.0
    con.load("B", b, tile=(5, 3), replace=True)
    con.execute(sql)  # finite again: the first layout, the first plan
    check()
    assert con.plan_cache_stats["hits"] == 1
    b[1, 1] = 0.0  # a tile that now holds a 0: another layout
    con.load("B", b, tile=(5, 3), replace=True)
    con.execute(sql)
    check()
    assert con.plan_cache_stats == {"hits": 1, "misses": 3, "size": 3}


def test_a_statement_that_reads_its_own_output_plans_once(con):
    """C = C @ D reads C: every run is a new version of its input, of the same layout."""
    con.load("D", np.eye(6) * 2 + 0.5, tile=(3, 3))
    con.execute(SQL)
    expected = con.tensor("C")
    for n in range(3):
        con.execute("C[i,k] = SUM(C[i,j] * D[j,k])")
        expected = expected @ (np.eye(6) * 2 + 0.5)
        np.testing.assert_allclose(con.tensor("C"), expected)
    assert con.plan_cache_stats["hits"] == 2 and con.plan_cache_stats["misses"] == 2


def test_plans_reading_a_dropped_tensor_go(con):
    con.execute(SQL)
    con.execute("E[j] = SUM(B[j,k])")
    assert con.plan_cache_stats["size"] == 2
    con.execute("DROP TENSOR A")
    con.execute("F[k] = SUM(B[j,k])")
    np.testing.assert_allclose(con.tensor("F"), con.tensor("B").sum(0))
    assert con.plan_cache_stats["size"] == 2  # E's and F's; C's read A


def test_training_steps_of_train_mlp_reuse_their_plan(tmp_path):
    """sql/train_mlp.sql's step run N times: plans at step 1, again at step 2 (b1 is created
    empty: its tiles appear with step 1's update, a new layout), then every step hits; the
    weights equal numpy's SGD."""
    text = (ROOT / "sql" / "train_mlp.sql").read_text()
    setup, rest = text.split("\n-- step 1\n")
    step = "\n".join(line for line in rest.split("\n-- step 2\n")[0].splitlines()
                     if not line.startswith("SELECT"))
    steps = 6
    with tensordb.connect(tmp_path / "train.tdb") as con:
        con.execute_script(setup)
        x, y, w1, b1, w2 = (con.tensor(n) for n in ("X", "Y", "W1", "b1", "W2"))
        for n in range(1, steps + 1):
            con.execute_script(step)
            assert con.plan_cache_stats["hits"] == max(0, n - 2)
        for _ in range(steps):
            pre = x @ w1 + b1
            h = np.maximum(pre, 0)
            z = h @ w2
            e = np.exp(z - z.max(1, keepdims=True))
            dz = (e / e.sum(1, keepdims=True) - y) / 64
            dh = (dz @ w2.T) * (pre > 0)
            w1, b1, w2 = w1 - 0.5 * (x.T @ dh), b1 - 0.5 * dh.sum(0), w2 - 0.5 * (h.T @ dz)
        np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("b1"), b1, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-10, atol=1e-12)


def test_settings_that_steer_planning_miss_and_others_hit(con):
    con.execute(SQL)
    con.execute("SET workers = 1")
    con.execute(SQL)
    _check(con)
    assert con.plan_cache_stats["hits"] == 0 and con.plan_cache_stats["misses"] == 2
    assert con.last_plan.workers == 1
    con.execute("SET workers = 2")
    con.execute(SQL)  # the first plan again
    assert con.plan_cache_stats["hits"] == 1 and con.last_plan.workers == 2
    con.execute("SET progress = false")  # the CLI's display: plans do not depend on it
    con.execute(SQL)
    assert con.plan_cache_stats["hits"] == 2
    con.execute(SQL + " WITH (PIECES i 3)")  # other pieces: another plan
    _check(con)
    assert con.plan_cache_stats["hits"] == 2


def test_a_cache_hit_shows_in_debug_output(tmp_path):
    script = ("import numpy as np, tensordb\n"
              f"con = tensordb.connect({str(tmp_path / 'db')!r})\n"
              "con.load('A', np.ones((4, 4)))\n"
              "for _ in range(2):\n"
              "    con.execute('C[i] = SUM(A[i,j])')\n"
              "assert (con.tensor('C') == 4).all()\n")
    env = dict(os.environ, TENSORDB_DEBUG="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stderr.count("plan cache hit") == 1
    assert out.stderr.count("[tensordb] lower") == 1


def test_literals_equal_as_numbers_but_not_as_results_do_not_share_a_plan():
    # 0.0 == -0.0 (and so do the graphs that hold them), but A / -0.0 is -inf where A / 0.0 is inf
    with tensordb.connect(workers=2) as con:
        a = np.array([1.0, 2.0, 3.0])
        con.load("A", a)
        con.execute("C[i] = A[i] / -0.0;")
        con.execute("D[i] = A[i] / 0.0;")
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(con.tensor("C"), a / -0.0)
            np.testing.assert_array_equal(con.tensor("D"), a / 0.0)


def test_a_cached_plans_kernels_are_set_up_once_and_a_replaced_plan_gets_its_own(con, monkeypatch):
    """The KernelSpecs of a cached plan are made by its first run and kept for the later ones
    (exec/runtime.py ``plan_specs``); a copy of the plan with other kernel choices (sharing
    its memo) makes and runs its own. Results against numpy each time."""
    import dataclasses
    from tensordb.exec import kernels
    from tensordb.physical.choice import KernelChoice
    made = []
    real = kernels.KernelSpec.__post_init__
    monkeypatch.setattr(kernels.KernelSpec, "__post_init__",
                        lambda self: (made.append(self.choice), real(self))[1])
    a, b = con.tensor("A"), con.tensor("B")
    con.execute(SQL)
    first = len(made)
    assert first > 0
    for _ in range(2):
        con.execute(SQL)
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-12)
    assert len(made) == first
    from tensordb.bind import bind_graph
    bound = bind_graph(tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C"), con.store)
    decomp, plan = con.plan(bound)
    forced = dataclasses.replace(plan, kernels=(KernelChoice("broadcast", chunk="j",
                                                             chunk_elements=8),))
    assert forced.memo is plan.memo
    made.clear()
    con._run_graph(bound, replace=True, planned=(decomp, forced))
    np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-12)
    assert made and all(c.method == "broadcast" for c in made)


def test_an_unchanged_catalog_validates_a_prepared_group_by_its_epoch(con, monkeypatch):
    """While the store's epoch stands (nothing written, dropped or rolled back, no plain SQL),
    a prepared group is reused without asking the catalog anything again; after a write of
    another tensor, its answers are asked again, hold, and it is reused all the same; after a
    change to what it read, it is bound and planned again."""
    from tensordb.storage import Store
    asked = []
    real = Store.has  # (what binding asked; planning opens the inputs' current versions anyway)
    monkeypatch.setattr(Store, "has", lambda self, name: asked.append(name) or real(self, name))
    con.explain(SQL)
    bound, hits = con.engine.cache.bound_hits, con.plan_cache_stats["hits"]
    asked.clear()
    text = con.explain(SQL)  # the same epoch: nothing asked
    assert asked == [] and "EXPLAIN" in text
    assert con.engine.cache.bound_hits == bound + 1 and con.plan_cache_stats["hits"] == hits + 1
    con.load("Other", np.ones(3))  # a new epoch, the answers the same
    con.execute(SQL)
    assert asked and con.engine.cache.bound_hits == bound + 2
    assert con.plan_cache_stats["hits"] == hits + 2
    _check(con)
    con.load("B", np.random.default_rng(4).standard_normal((10, 7)), tile=(5, 7), replace=True)
    con.execute(SQL)  # B's shape changed: bound and planned again
    assert con.engine.cache.bound_hits == bound + 2
    assert con.plan_cache_stats["misses"] == 2
    _check(con)
