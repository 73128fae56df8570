"""An elementwise call computed over the tile of an operand that it reads last (exec/donate.py,
on the pool's dataflow, exec/pool_run.py): numpy's very bytes for softmax-like chains whose
intermediates are tiles of this run; no donation where a later task reads the operand again,
where the operand is an identity join's (two keys of one array), transposed, broadcast, of
another dtype, or a stored tensor's; the very operand's array where it does."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.exec import pool

H, T, S = 4, 48, 40  # 4 tiles of 1 x 48 x 40 along h


@pytest.fixture
def con(monkeypatch):
    """Two workers running every plan through the pool's dataflow (no straight line of calls
    on the calling thread, where the donation does not apply), Q and K stored in 4 tiles."""
    monkeypatch.setattr(pool, "_tiny", lambda plan, fast=False: False)
    rng = np.random.default_rng(7)
    c = tensordb.connect(workers=2)
    c.engine.executor().fast_path = False
    c.load("Q", rng.standard_normal((H, T, 8)).astype(np.float32), tile=(1, T, 8))
    c.load("K", rng.standard_normal((H, S, 8)).astype(np.float32), tile=(1, S, 8))
    c.load("X", rng.standard_normal((H, T, S)), tile=(1, T, S))
    yield c
    c.close()


def _arrays(con):
    return {n: con.tensor(n) for n in ("Q", "K", "X")}


def _softmax_graph():
    return (tensordb.Graph()
            .op("S", "hts", [("Q", "htd"), ("K", "hsd")], join="x0 * x1 / 8", store=False)
            .op("M", "ht", [("S", "hts")], join="x0", agg="max", store=False)
            .op("E", "hts", [("S", "hts"), ("M", "ht")], join="exp(x0 - x1)", store=False)
            .op("Z", "ht", [("E", "hts")], join="x0", agg="sum", store=False)
            .op("OUT", "hts", [("E", "hts"), ("Z", "ht")], join="x0 / x1"))


def _run_both(con, graph, monkeypatch):
    """(OUT with the donation, OUT without it, {op index: [whether each call of it wrote over
    an operand]}) for two runs of the same plan; the calls are those of the first run, seen
    through ``pool_run.donor`` (the real function, its answers recorded)."""
    from tensordb.exec import pool_run
    calls: dict = {}
    real = pool_run.donor

    def seen(plan, task, inputs, refs, keep):
        out = real(plan, task, inputs, refs, keep)
        calls.setdefault(task.op, []).append(out is not None)
        if out is not None:  # one of this call's operands, the very array
            assert any(out is a for a in inputs)
        return out
    monkeypatch.setattr(pool_run, "donor", seen)
    con.run(graph, replace=True)
    got = con.tensor("OUT").copy()
    monkeypatch.setattr(pool_run, "donor", lambda *a: None)
    con.run(graph, replace=True)
    plain = con.tensor("OUT").copy()
    monkeypatch.setattr(pool_run, "donor", real)
    return got, plain, calls


def test_softmax_bytes_and_room(con, monkeypatch):
    a = _arrays(con)
    got, plain, calls = _run_both(con, _softmax_graph(), monkeypatch)
    assert got.tobytes() == plain.tobytes()
    s = np.einsum("htd,hsd->hts", a["Q"], a["K"]) / np.float32(8)
    e = np.exp(s - s.max(axis=2, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=2, keepdims=True), rtol=1e-5)
    # EXP(S - M) wrote over S's tiles; OUT (a stored tile: the output file's) did not, nor the
    # reductions, nor the product
    assert calls[2] and all(calls[2])
    assert not any(calls.get(0, []) + calls.get(1, []) + calls.get(3, []) + calls.get(4, []))


@pytest.mark.parametrize("join, oracle", [
    ("x0 * exp(x0 - x1)", lambda y, m: y * np.exp(y - m)),  # the operand read twice in the join
    ("where(x0 > x1, x0, x1)", lambda y, m: np.where(y > m, y, m)),  # no ufunc outermost
    ("x0 - x1 * 0.5", lambda y, m: y - m * 0.5),
])
def test_elementwise_chain_is_numpys(con, monkeypatch, join, oracle):
    """Y = 2 X (a kernel's fresh tiles), M its row maxima, OUT = join(Y, M): numpy's bytes."""
    x = _arrays(con)["X"]
    g = (tensordb.Graph()
         .op("Y", "hts", [("X", "hts")], join="x0 * 2", store=False)
         .op("M", "ht", [("Y", "hts")], join="x0", agg="max", store=False)
         .op("W", "hts", [("Y", "hts"), ("M", "ht")], join=join, store=False)
         .op("OUT", "hts", [("W", "hts")], join="x0 + 1"))
    got, plain, calls = _run_both(con, g, monkeypatch)
    y = x * 2
    want = oracle(y, y.max(axis=2, keepdims=True)) + 1
    assert got.tobytes() == plain.tobytes()
    np.testing.assert_array_equal(got, want)
    assert calls[2] and all(calls[2])  # W over Y's tiles (M read them before)


def test_operand_read_again_is_kept(con, monkeypatch):
    """Y is read by E and again by OUT after it: E must not write over Y's tiles."""
    x = _arrays(con)["X"]
    g = (tensordb.Graph()
         .op("Y", "hts", [("X", "hts")], join="x0 * 2", store=False)
         .op("E", "hts", [("Y", "hts")], join="exp(x0)", store=False)
         .op("Z", "ht", [("E", "hts")], join="x0", agg="sum", store=False)
         .op("OUT", "hts", [("Y", "hts"), ("Z", "ht")], join="x0 / x1"))
    got, plain, calls = _run_both(con, g, monkeypatch)
    y = x * 2
    # (the sum's order is the kernel's: numpy's to the last bit or two)
    np.testing.assert_allclose(got, y / np.exp(y).sum(axis=2, keepdims=True), rtol=1e-13)
    assert got.tobytes() == plain.tobytes()
    assert calls[1] and not any(calls[1])


def test_identity_join_shares_its_array(con, monkeypatch):
    """V = Y (an identity join may hand Y's array on as V's): E = EXP(Y) reads Y last but V is
    still to be read, so Y's array is not written over."""
    x = _arrays(con)["X"]
    g = (tensordb.Graph()
         .op("Y", "hts", [("X", "hts")], join="x0 * 2", store=False)
         .op("V", "hts", [("Y", "hts")], join="x0", store=False)
         .op("E", "hts", [("Y", "hts")], join="exp(x0)", store=False)
         .op("OUT", "hts", [("V", "hts"), ("E", "hts")], join="x0 - x1"))
    got, _, calls = _run_both(con, g, monkeypatch)
    y = x * 2
    np.testing.assert_array_equal(got, y - np.exp(y))
    assert calls[2] and not any(calls[2])


def test_transposed_or_stored_operand(con, monkeypatch):
    """An operand laid out in another order (E's slabs of rows are not Y's: written over, a
    later slab would read an earlier one's output) and a stored tensor's tiles (views of its
    payload) are not written over; numpy's answers. P is 512 x 512 float64, one tile: E is
    computed in slabs of rows (kernels.SLAB_BYTES)."""
    p = np.random.default_rng(3).standard_normal((512, 512))
    con.load("P", p, tile=(512, 512))
    g = (tensordb.Graph()
         .op("Y", "ji", [("P", "ij")], join="x0 * 2", store=False)
         .op("E", "ij", [("Y", "ji"), ("P", "ij")], join="exp(x0) - x1", store=False)
         .op("OUT", "ij", [("E", "ij")], join="x0 * 3"))
    got, plain, calls = _run_both(con, g, monkeypatch)
    assert got.tobytes() == plain.tobytes()
    np.testing.assert_array_equal(got, (np.exp(p * 2) - p) * 3)
    np.testing.assert_array_equal(con.tensor("P"), p)  # the stored operand is untouched
    assert calls[1] and not any(calls[1])
