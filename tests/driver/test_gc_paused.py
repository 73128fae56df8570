"""config.gc_paused: the cyclic garbage collector waits while a statement group is parsed,
bound, planned and rendered, and is enabled again afterwards (whatever happened), only where it
was enabled before."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import tensordb
from tensordb.config import gc_paused


@pytest.fixture(autouse=True)
def _collector_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_pauses_and_resumes_nested():
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still holds it off
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled():
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_resumes_after_an_error():
    with pytest.raises(ZeroDivisionError):
        with gc_paused():
            1 / 0
    assert gc.isenabled()


def test_blocks_in_two_threads_overlap():
    """The collector comes back when the last block ends, not the first."""
    inside, release = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread's block is still open
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_explain_and_execute_resume_the_collector(tmp_path):
    """EXPLAIN (parse to text), a run, a failed statement and EXPLAIN ANALYZE each leave the
    collector enabled, and give the results NumPy gives."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    with tensordb.connect(str(tmp_path / "g.tdb")) as con:
        con.load("A", a)
        con.load("B", b)
        text = con.explain("C[i,k] = SUM(A[i,j] * B[j,k])")
        assert "C" in text and gc.isenabled()
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        assert gc.isenabled()
        np.testing.assert_allclose(con.tensor("C"), np.einsum("ij,jk->ik", a, b), rtol=1e-12)
        with pytest.raises(tensordb.ProgrammingError):
            con.explain("D[i,k] = SUM(A[i,j] * Nope[j,k])")
        assert gc.isenabled()
        with pytest.raises(tensordb.ProgrammingError):
            con.execute("D[i,k] = SUM(A[i,j] * Nope[j,k])")
        assert gc.isenabled()
        con.explain("E[i,k] = SUM(A[i,j] * B[j,k])", analyze=True)
        assert gc.isenabled()
        np.testing.assert_allclose(con.tensor("E"), np.einsum("ij,jk->ik", a, b), rtol=1e-12)


def test_planning_runs_with_the_collector_paused(tmp_path, monkeypatch):
    """What binding and planning build is not scanned by the collector while they build it:
    planning sees it off, the run (the executor) sees it on."""
    from tensordb.driver import pipeline
    seen = {}
    plan_graph, run = pipeline.plan_graph, pipeline.Prepared.run

    def planning(*args, **kwargs):
        seen.setdefault("plan", []).append(gc.isenabled())
        return plan_graph(*args, **kwargs)

    def running(self, *args, **kwargs):
        seen.setdefault("run", []).append(gc.isenabled())
        return run(self, *args, **kwargs)
    monkeypatch.setattr(pipeline, "plan_graph", planning)
    monkeypatch.setattr(pipeline.Prepared, "run", running)
    with tensordb.connect(str(tmp_path / "p.tdb")) as con:
        con.load("A", np.arange(12.0).reshape(3, 4))
        con.explain("B[i] = SUM(A[i,j])")
        con.execute("B[i] = SUM(A[i,j])")
        np.testing.assert_array_equal(con.tensor("B"), np.arange(12.0).reshape(3, 4).sum(1))
    assert seen == {"plan": [False, False], "run": [True]}
