"""The replay of a repeated statement group (driver/replay.py): a training step executed again
on the same connection runs its last call's plan without the prepared-statement cache's lookup.
It must give what the ordinary path gives (bytes, catalog, results), and be dropped by anything
that changes what it was made from: another connection's write, DDL, plain SQL, a new
parameter value or type, a changed setting; a replayed call that fails changes nothing.
Every value is checked against numpy.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tests.driver.test_call_fixed_cost import STEP, _data, _numpy_step


def _connect(where: str, tmp_path, name: str = "t.tdb"):
    return tensordb.connect(None if where == "memory" else tmp_path / name, workers=2)


def _load(con, x, y, w) -> None:
    con.load("X", x, replace=True)
    con.load("Y", y)
    con.load("W", w)


def _catalog(con) -> list:
    """Each tensor's catalog entry as the store holds it (version numbers left out: two
    connections number their versions alike only by chance)."""
    out = []
    for m in sorted(con.store.list(), key=lambda m: m.name):
        out.append((m.name, m.dtype.str, tuple(m.shape), tuple(m.dims), m.grid, m.tile_count,
                    int(m.nnz), m.fill))
    return out


def _check_clean(con) -> None:
    assert con.execute("CHECK DATABASE").fetchall() == [(None, None, None, None, "ok")]


def _three_steps(where: str, tmp_path):
    """A connection that loaded the data and ran STEP three times (the third replayed), the
    data, and numpy's weights after the same three steps."""
    x, y, w = _data()
    con = _connect(where, tmp_path)
    _load(con, x, y, w)
    for _ in range(3):
        con.execute(STEP, {"lr": 0.5})
        _, w = _numpy_step(x, y, w, 0.5)
    return con, x, y, w


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_replayed_step_stores_what_the_ordinary_path_stores(tmp_path, where):
    x, y, w = _data()
    fast, slow = _connect(where, tmp_path, "a.tdb"), _connect(where, tmp_path, "b.tdb")
    slow.engine.cache.replay.enabled = False
    for con in (fast, slow):
        _load(con, x, y, w)
    lrs = [0.5, 0.5, 0.5, 0.25, 0.25, 0.5, 0.5]
    for lr in lrs:
        results = [con.execute(STEP, {"lr": lr}).fetchall() for con in (fast, slow)]
        assert results[0] == results[1]
        loss, w = _numpy_step(x, y, w, lr)
        for con in (fast, slow):
            assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
            np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
        assert fast.tensor("W").tobytes() == slow.tensor("W").tobytes()
        assert fast.tensor("L").tobytes() == slow.tensor("L").tobytes()
    # the same lr again is a replay; a new value (other statements) is not, nor the first call
    assert fast.engine.cache.replay.replays == 3
    assert slow.engine.cache.replay.replays == 0
    assert _catalog(fast) == _catalog(slow)
    assert fast.plan_cache_stats["hits"] == slow.plan_cache_stats["hits"]
    for con in (fast, slow):
        _check_clean(con)
        con.close()


def test_another_connection_s_write_is_read_by_the_next_call(tmp_path):
    con, x, y, w = _three_steps("disk", tmp_path)
    assert con.engine.cache.replay.replays == 1
    other = tensordb.connect(tmp_path / "t.tdb")  # shares the store, as DuckDB's connections do
    w = np.full_like(w, 0.01)
    x = x * 2.0
    other.load("W", w, replace=True)
    other.load("X", x, replace=True)
    replays = con.engine.cache.replay.replays
    con.execute(STEP, {"lr": 0.5})
    assert con.engine.cache.replay.replays == replays  # not replayed: the catalog changed
    loss, w = _numpy_step(x, y, w, 0.5)
    assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)
    # replayed again from there: after one more ordinary call, since the loaded W's layout
    # is not the one the step writes (the plan read the loaded one)
    for _ in range(2):
        con.execute(STEP, {"lr": 0.5})
        loss, w = _numpy_step(x, y, w, 0.5)
        assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)
    assert con.engine.cache.replay.replays == replays + 1
    other.close()
    con.close()


def test_ddl_plain_sql_and_settings_end_the_replay():
    x, y, w = _data()
    con = _connect("memory", None)
    _load(con, x, y, w)
    replay = con.engine.cache.replay

    def step(lr=0.5):
        nonlocal w
        con.execute(STEP, {"lr": lr})
        loss, w = _numpy_step(x, y, w, lr)
        assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)

    step(), step()
    n = replay.replays
    # a new shape of X's rows (DDL through CREATE OR REPLACE): bound again, read anew
    x = np.concatenate([x, x[:5] + 1.0])
    con.load("X", x, replace=True)
    step()
    assert replay.replays == n
    step()
    assert replay.replays == n + 1
    # plain SQL that may change the catalog
    con.sql("CREATE TABLE t AS SELECT 1 AS a")
    step()
    assert replay.replays == n + 1
    step()
    assert replay.replays == n + 2
    # a setting that steers the plan
    con.execute("SET workers = 1")
    step()
    assert replay.replays == n + 2
    step()
    assert replay.replays == n + 3
    # the parameter's type (an int where a float was) gives other statements
    con.execute(STEP, {"lr": 1})
    loss, w = _numpy_step(x, y, w, 1)
    np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
    assert replay.replays == n + 3
    # a dropped input: the ordinary path's error, nothing stored
    con.execute("DROP TENSOR Y")
    before = con.tensor("W").copy()
    with pytest.raises(tensordb.CatalogError, match="Y"):
        con.execute(STEP, {"lr": 1})
    np.testing.assert_array_equal(con.tensor("W"), before)
    _check_clean(con)
    con.close()


def test_a_step_that_writes_nan_is_planned_again():
    """A replaced input's NaN/inf flags are part of the plan's key: a step whose new weights
    hold an inf is not replayed with the plan made for finite ones."""
    con = _connect("memory", None)
    con.load("a", np.array([1.0, 2.0, 3.0]))
    for _ in range(3):
        con.execute("a[i] = a[i] * 1e200;")
    replay = con.engine.cache.replay
    assert np.isinf(con.tensor("a")).all()
    n = replay.replays
    con.execute("a[i] = a[i] * 1e200;")
    np.testing.assert_array_equal(con.tensor("a"), np.full(3, np.inf))
    assert replay.replays == n + 1  # finite -> inf planned again, inf -> inf replayed
    con.close()


def test_a_failing_replay_changes_nothing():
    """An integer power whose exponent the step itself counts down: the replayed call that
    meets a negative exponent fails (NumPy's ValueError, a DataError) and leaves the tensors
    and the catalog as the call before left them."""
    con = _connect("memory", None)
    con.load("a", np.array([11, 9], np.int64))
    con.load("two", np.array([2, 2], np.int64))
    # by 2: no zero on the way (a zero changes the layout the plan was keyed with)
    step = "a[i] = a[i] - 2; b[i] = POW(two[i], a[i]);"
    a = np.array([11, 9])
    for _ in range(4):
        con.execute(step)
        a = a - 2
        np.testing.assert_array_equal(con.tensor("a"), a)
        np.testing.assert_array_equal(con.tensor("b"), np.power(2, a))
    replays = con.engine.cache.replay.replays
    assert replays >= 2
    catalog = _catalog(con)
    with pytest.raises(tensordb.DataError, match="negative integer powers"):
        con.execute(step)  # a would be [1, -1]
    assert con.engine.cache.replay.replays == replays + 1  # it was a replay that failed
    np.testing.assert_array_equal(con.tensor("a"), a)
    np.testing.assert_array_equal(con.tensor("b"), np.power(2, a))
    assert _catalog(con) == catalog
    _check_clean(con)
    con.execute("a[i] = a[i] + 4;")
    con.execute(step)
    np.testing.assert_array_equal(con.tensor("b"), np.power(2, a + 2))
    con.close()


def test_explain_analyze_between_steps_and_lets_kept(tmp_path):
    con, x, y, w = _three_steps("memory", None)
    assert {"z", "dw"} <= set(con.session.lets)
    text = con.explain("W2[d,c] = W[d,c] * 2", analyze=True)
    assert "W2" in text
    np.testing.assert_allclose(con.tensor("W2"), 2 * w, rtol=1e-12)
    n = con.engine.cache.replay.replays
    con.execute(STEP, {"lr": 0.5})
    loss, w = _numpy_step(x, y, w, 0.5)
    np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)
    assert con.engine.cache.replay.replays == n  # the EXPLAIN ANALYZE committed meanwhile
    con.execute(STEP, {"lr": 0.5})
    assert con.engine.cache.replay.replays == n + 1
    con.close()


def test_another_process_cannot_write_under_a_replaying_connection(tmp_path):
    """An on-disk database has one writer process: another process's write is refused while
    a connection replays its step (so the store's epoch sees every write there can be), and
    after it closes a connection opened again starts with nothing to replay."""
    path = tmp_path / "t.tdb"
    con, x, y, w = _three_steps("disk", tmp_path)
    assert con.engine.cache.replay.replays == 1
    code = ("import sys, numpy as np, tensordb\n"
            "try:\n"
            f"    c = tensordb.connect({str(path)!r})\n"
            "    c.load('W', np.zeros((6, 4)), replace=True)\n"
            "except tensordb.Error as e:\n"
            "    print('refused', type(e).__name__); sys.exit(0)\n"
            "print('wrote')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.stdout.startswith("refused"), (out.stdout, out.stderr)
    con.execute(STEP, {"lr": 0.5})
    loss, w = _numpy_step(x, y, w, 0.5)
    assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)
    assert con.engine.cache.replay.replays == 2
    con.close()
    code = ("import numpy as np, tensordb\n"
            f"c = tensordb.connect({str(path)!r})\n"
            "c.load('W', np.full((6, 4), 0.01), replace=True)\n"
            "c.close()\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    w = np.full((6, 4), 0.01)
    con = _connect("disk", tmp_path)
    con.execute(STEP, {"lr": 0.5})
    loss, w = _numpy_step(x, y, w, 0.5)
    assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)
    assert con.engine.cache.replay.replays == 0
    con.close()


_LOOP = """
import sys, numpy as np, tensordb
from tests.driver.test_call_fixed_cost import STEP, _data
x, y, w = _data()
con = tensordb.connect(sys.argv[1], workers=2)
con.load("X", x); con.load("Y", y); con.load("W", w)
print("loaded", flush=True)
k = 0
while True:
    con.execute(STEP, {"lr": 0.5})
    k += 1
    print(k, con.engine.cache.replay.replays, flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.003, 0.011])
def test_kill_9_during_replayed_steps_leaves_one_step_s_state(tmp_path, delay):
    """A process replaying its step on disk killed (SIGKILL) between or inside calls: the
    database opens again with W as numpy's weights after the last step reported or the one
    after it, CHECK DATABASE clean."""
    import time
    path = tmp_path / "k.tdb"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    p = subprocess.Popen([sys.executable, "-c", _LOOP, str(path)], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "loaded"
        for _ in range(6):
            done, replays = map(int, p.stdout.readline().split())
        assert replays >= 3
        time.sleep(delay)
        p.kill()
        p.wait(60)
        for line in p.stdout.read().splitlines():  # steps it finished before the kill landed
            parts = line.split()
            if len(parts) == 2:
                done = int(parts[0])
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(60)
    x, y, w = _data()
    states = []
    for _ in range(done + 1):
        _, w = _numpy_step(x, y, w, 0.5)
        states.append(w)
    con = tensordb.connect(path)
    got = con.tensor("W")
    assert any(np.allclose(got, s, rtol=1e-12, atol=1e-15) for s in states[done - 1:done + 1]), \
        (done, got)
    _check_clean(con)
    con.close()


def test_a_sparse_kernel_into_a_tensor_it_does_not_read_is_replayed():
    """A sparse kernel's operation (its output's nonzeros estimated: output_nnz) whose group
    replaces none of its inputs reads the versions its plan was made for: replayed (spmv40b),
    and its answers are scipy's; a replace of its sparse input between calls (another
    statement) ends the replay, and the next call reads the new matrix."""
    import scipy.sparse as sp
    con = _connect("memory", None)
    s = sp.random(40, 30, density=0.05, random_state=7, format="csr")
    rng = np.random.default_rng(7)
    u, v = rng.standard_normal((40, 4)), rng.standard_normal((30, 4))
    con.load("S", s)
    con.load("U", u)
    con.load("V", v)
    for k in range(3):
        con.execute("C[i,j] = S[i,j] * SUM(U[i,r] * V[j,r]);")
        got = con.tensor("C")
        got = got.toarray() if hasattr(got, "toarray") else np.asarray(got)
        np.testing.assert_allclose(got, s.toarray() * (u @ v.T), rtol=1e-12, atol=1e-15)
    assert con.engine.last_plan is not None
    replays = con.engine.cache.replay.replays
    assert replays == 1  # the third call (the second's binding saw C made by the first)
    s2 = sp.random(40, 30, density=0.2, random_state=8, format="csr")
    con.load("S", s2, replace=True)
    for k in range(2):
        con.execute("C[i,j] = S[i,j] * SUM(U[i,r] * V[j,r]);")
        got = con.tensor("C")
        got = got.toarray() if hasattr(got, "toarray") else np.asarray(got)
        np.testing.assert_allclose(got, s2.toarray() * (u @ v.T), rtol=1e-12, atol=1e-15)
    assert con.engine.cache.replay.replays == replays + 1  # planned again after the load
    con.close()


def test_a_sparse_kernel_that_replaces_its_own_input_is_not_replayed():
    """Where the group replaces an input of a sparse kernel's plan (the power iteration's
    ``v[i] = SUM(G[i,j] * v[j])``), each call is planned by the ordinary path: its cuts and
    estimates may rest on what it replaced. Against numpy, step by step."""
    import scipy.sparse as sp
    con = _connect("memory", None)
    g = sp.random(60, 60, density=0.1, random_state=3, format="csr")
    v = np.random.default_rng(3).standard_normal(60)
    con.load("G", g)
    con.load("v", v)
    for k in range(3):
        con.execute("v[i] = SUM(G[i,j] * v[j])")
        v = g.toarray() @ v
        np.testing.assert_allclose(con.tensor("v"), v, rtol=1e-12, atol=1e-12)
    assert con.engine.cache.replay.replays == 0
    con.close()
