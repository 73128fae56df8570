"""Review of stop 39's donation (exec/donate.py, rev40): a tile kept past the run (a stored
output of the same run, a caller's array) is never written over by a later elementwise call."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.exec import pool, pool_run


@pytest.fixture
def con(monkeypatch):
    """Two workers on the pool's dataflow (where donation applies), X in 4 tiles."""
    monkeypatch.setattr(pool, "_tiny", lambda plan, fast=False: False)
    c = tensordb.connect(workers=2)
    c.engine.executor().fast_path = False
    c.load("X", np.random.default_rng(5).standard_normal((4, 48, 40)), tile=(1, 48, 40))
    yield c
    c.close()


@pytest.fixture
def donated(monkeypatch):
    """The operands ``donor`` handed out, per op index (the real function's answers)."""
    seen: dict = {}
    real = pool_run.donor

    def spy(plan, task, inputs, refs, keep):
        out = real(plan, task, inputs, refs, keep)
        seen.setdefault(task.op, []).append(out is not None)
        return out
    monkeypatch.setattr(pool_run, "donor", spy)
    return seen


def test_a_stored_output_read_last_by_an_elementwise_call_is_not_written_over(con, donated):
    """Y is stored (a result the caller reads) and E = EXP(Y) reads it last: Y keeps x * 2."""
    x = con.tensor("X").copy()
    g = (tensordb.Graph()
         .op("Y", "hts", [("X", "hts")], join="x0 * 2")
         .op("E", "hts", [("Y", "hts")], join="exp(x0)"))
    con.run(g, replace=True)
    np.testing.assert_array_equal(con.tensor("Y"), x * 2)
    np.testing.assert_array_equal(con.tensor("E"), np.exp(x * 2))
    assert not any(donated.get(1, []))  # (a stored output is written into its destination)


def test_a_callers_arrays_are_never_written_over(con, donated):
    """``con.einsum`` over the caller's numpy arrays, no ``into``: an elementwise chain whose
    operands are the caller's; the caller's arrays hold their values after, the answer is
    numpy's, and a second call gives the same answer."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((64, 32)), rng.standard_normal((64, 32))
    a0, b0 = a.copy(), b.copy()
    first = np.array(con.einsum("ij,ij->ij", a, b, join="exp(x0 - x1)"))
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    np.testing.assert_allclose(first, np.exp(a0 - b0), rtol=1e-15)
    again = np.array(con.einsum("ij,ij->ij", a, b, join="exp(x0 - x1)"))
    assert again.tobytes() == first.tobytes()
