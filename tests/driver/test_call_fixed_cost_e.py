"""A repeated call's fixed cost, cut again (call29e, issue 29): what a call no longer makes and
what it now finds once, each checked to give what it gave before.

- ``execute`` makes only the last statement's result (``run_script(last=True)``):
  ``execute_script`` still gives every statement's, and the last one is the same;
- ``parse`` of the text of the last call gives the very statements again (the replay of a
  repeated group recognises them by identity), another text its own;
- BLAS limits set through each OpenBLAS's own calls keep threadpoolctl's rule (one thread
  controls a process-wide pool; another thread's limits do nothing) and are put back;
- the device cache's commit listener with nothing held returns at once, and with tiles held
  still drops a replaced version's;
- a payload layout is the kept one (a streamed writer copies it before changing it);
- the stored statistics of a small tile equal ``tile_stats``'s where the sum overflows.
Every value is checked against numpy.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tensordb
from tensordb.driver import pipeline
from tests.driver.test_call_fixed_cost import STEP, _data, _numpy_step


def _loaded(where=None):
    x, y, w = _data()
    con = tensordb.connect(where, workers=2)
    con.load("X", x)
    con.load("Y", y)
    con.load("W", w)
    return con, x, y, w


def test_execute_returns_the_last_result_as_execute_script_does():
    con, x, y, w = _loaded()
    r = con.execute(STEP, {"lr": 0.5})
    loss, w = _numpy_step(x, y, w, 0.5)
    assert (r.kind, r.name, r.shape, r.dtype) == ("tensor", "W", (6, 4), "float64")
    np.testing.assert_allclose(r.tensor(), w, rtol=1e-13, atol=1e-15)
    assert r.version == con.store.meta("W").version
    assert r.elapsed is not None and r.elapsed > 0
    rs = con.execute_script(STEP.replace("$lr", "0.5"))
    loss, w = _numpy_step(x, y, w, 0.5)
    assert [(q.kind, q.name) for q in rs] == [
        ("status", None), ("tensor", "L"), ("status", None), ("tensor", "W")]
    assert rs[0].message.startswith("LET Z") and rs[2].message.startswith("LET dW")
    assert float(rs[1].tensor()) == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(rs[3].tensor(), w, rtol=1e-13, atol=1e-15)
    # a script whose last statement is a LET: its status, as before
    r = con.execute("LET Q[d,c] = W[d,c] * 2;")
    assert r.kind == "status" and r.message.startswith("LET Q")
    # statements of several units: the last one's result (a SQL statement's rows)
    r = con.execute("W2[d,c] = W[d,c] + 1; SELECT COUNT(*) FROM W2;")
    assert r.fetchall() == [(24,)]
    con.close()


def test_parse_of_the_same_text_gives_the_same_statements():
    a = "A[i] = A[i] + 1;"
    b = "B[i] = A[i] * 2;"
    first = pipeline.parse(a)
    again = pipeline.parse("".join(["A[i] = A[i] ", "+ 1;"]))  # equal, another object
    assert len(first) == len(again) == 1 and first[0] is again[0]
    assert first is not again  # a list of its own: the caller may change it
    other = pipeline.parse(b)
    assert other[0] is not first[0] and other[0].target.name == "B"
    assert pipeline.parse(a)[0].target.name == "A"
    with pytest.raises(tensordb.ProgrammingError):
        pipeline.parse(3)
    with pytest.raises(tensordb.ParserError):
        pipeline.parse("A[i] = = 1;")
    assert pipeline.parse(a)[0].target.name == "A"  # the failed text was not kept


def test_a_repeated_step_replays_and_equals_numpy_at_every_call():
    con, x, y, w = _loaded()
    replay = con.engine.cache.replay
    for k, lr in enumerate([0.5, 0.5, 0.5, 0.25, 0.25]):
        con.execute(STEP, {"lr": lr})
        loss, w = _numpy_step(x, y, w, lr)
        assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
    assert replay.replays >= 2  # the same text and values were replayed
    con.close()


def _openblas():
    pytest.importorskip("threadpoolctl")
    from tensordb.exec import pool
    libs = [lib for lib in pool._blas_limits(1).libs
            if getattr(lib, "internal_api", None) == "openblas"]
    if not libs:
        pytest.skip("no OpenBLAS loaded")
    return pool, libs


def test_blas_limits_through_openblas_own_calls_are_set_and_put_back():
    pool, libs = _openblas()
    before = [lib.num_threads for lib in libs]
    want = 1 if max(before) > 1 else 2
    with pool._limits(want):
        assert [lib.num_threads for lib in libs] == [want] * len(libs)
    assert [lib.num_threads for lib in libs] == before
    # the fast calls are the library's own, found once
    calls = pool._openblas_calls(libs[0])
    assert calls is not None and calls is pool._openblas_calls(libs[0])


def test_blas_limits_from_a_thread_that_does_not_control_openblas_do_nothing():
    """threadpoolctl's rule: a process-wide OpenBLAS pool is sized by one thread only."""
    pool, libs = _openblas()
    lib = libs[0]
    if getattr(lib, "threading_layer", None) == "openmp":
        pytest.skip("per-thread limits under OpenMP")
    before = [x.num_threads for x in libs]
    with pool._blas_limits(before[0]):
        pass  # this thread takes control (threadpoolctl's first set)
    assert type(lib)._SHARED_STATE.controlling_thread is threading.current_thread()
    seen = []

    def other():
        with pool._blas_limits(1 if before[0] > 1 else 2):
            seen.append([x.num_threads for x in libs])
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [before]
    assert [x.num_threads for x in libs] == before


def test_the_device_cache_listener_still_drops_a_replaced_version():
    from tensordb.exec.devcache import DeviceCache
    from tensordb.storage.meta import TensorMeta
    cache = DeviceCache()
    cache.committed([], [])  # nothing held: nothing to do
    assert len(cache) == 0
    key = ("w", 3, (0, 0), (2, 2))
    cache.put(key, 0, np.ones((2, 2)), held=False)
    assert len(cache) == 1
    meta = TensorMeta("W", 3, np.dtype("float64"), (2, 2), ("i", "j"), ((0, 2), (0, 2)),
                      32, 1, 4, 1.0)
    cache.committed([], [meta])
    assert len(cache) == 0


def test_a_kept_layout_is_not_changed_by_its_writers():
    from tensordb.storage.reserved import _layout
    grid = ((0, 3, 5), (0, 4))
    kept, pos = _layout(grid, ((0, 0), (1, 0)), 8)
    again, pos2 = _layout(grid, [[0, 0], [np.int64(1), 0]], 8)
    assert again == kept and pos == pos2 == 128 + 2 * 4 * 8  # 96 bytes, then 64-aligned
    assert kept[(1, 0)] == (128, (3, 0), (2, 4))
    # the writers take it as it is; the in-memory output's tiles are laid out by it
    con = tensordb.connect()
    con.load("A", np.arange(20.0).reshape(5, 4), tile=(3, 4))
    for _ in range(3):
        con.execute("A[i,j] = A[i,j] * 2;")
    np.testing.assert_array_equal(con.tensor("A"), np.arange(20.0).reshape(5, 4) * 8)
    assert _layout(grid, ((0, 0), (1, 0)), 8)[0] == {(0, 0): (0, (0, 0), (3, 4)),
                                                      (1, 0): (128, (3, 0), (2, 4))}
    con.close()


@pytest.mark.parametrize("a", [
    np.array([1e308, 1e308, -0.0]), np.array([[np.nan, 1.0], [2.0, 0.0]]),
    np.array([np.inf, -np.inf]), np.float32([3e38, 3e38, 0]), np.float16([60000, 60000]),
    np.zeros((0, 3)), np.array([-0.0, 0.0]), np.arange(12.0).reshape(3, 4)])
def test_small_tile_facts_equal_tile_stats(a):
    from tensordb.exec.fastrows import facts
    from tensordb.storage.writer import tile_stats
    with np.errstate(all="ignore"):
        assert facts(a) == tuple(tile_stats(a))


def test_an_overflowing_weight_is_stored_with_its_flag_on_disk_and_in_memory(tmp_path):
    """A sum of the tile that overflows (finite entries) is no NaN/inf: the catalog's flag is
    the elements', as ``tile_stats`` gives it."""
    for where in (None, tmp_path / "o.tdb"):
        con = tensordb.connect(where, workers=2)
        con.load("A", np.array([1e308, 1e308, 1.0]))
        for _ in range(2):
            con.execute("B[i] = A[i] * 1;")
        reader = con.store.open_many(["B"])["B"]
        assert [e.nonfinite for e in reader.entries.values()] == [False]
        np.testing.assert_array_equal(con.tensor("B"), [1e308, 1e308, 1.0])
        con.close()
