"""The straight-line run replayed (exec/fastline.py): a plan run again on operands of the same
signatures calls the functions its last run recorded. Against the pool's general run (the
same stored bytes, catalog statistics and warnings, step after step), numpy, and the
general straight line (the same accounts for EXPLAIN ANALYZE); a changed input, output
buffer or parameter leaves the replay; errors are named, Ctrl-C stops it, and a failed
statement stores nothing."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tensordb
from tensordb.exec import fastline, fastpath
from tests.exec.test_fastpath import LOGISTIC, MLP, W0, X, Y, _connect, _stored


@pytest.fixture
def replays(monkeypatch):
    """The replays begun, those that ran a whole run (a RunResult), and those that found a
    Load changed."""
    seen = {"called": 0, "ran": 0, "left": 0}
    real = fastline.replay

    def counted(*args, **kwargs):
        seen["called"] += 1
        out = real(*args, **kwargs)
        seen["ran" if type(out) is not dict else "left"] += 1
        return out
    monkeypatch.setattr(fastline, "replay", counted)
    return seen


def _numpy_logistic(w, lr, rows=30):
    x, y = X[:rows], Y[:rows]
    z = x @ w
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(1, keepdims=True)
    loss = np.mean(np.log(s[:, 0]) + m[:, 0] - np.sum(y * z, 1))
    return loss, w - lr * (x.T @ ((e / s - y) / rows))


@pytest.mark.parametrize("text", [LOGISTIC, MLP, LOGISTIC * 3,
                                  "P[b,c] = SOFTMAX(SUM(X[b,d] * W0[d,c]), c); "
                                  "q[b] = SUM(P[b,c] * P[b,c]);"])
def test_a_repeated_step_replays_with_the_pools_bytes(replays, text):
    """Step after step, the replayed run stores what the pool stores, byte for byte, with
    the same catalog statistics and warnings."""
    with _connect(True) as fast, _connect(False) as slow:
        for con in (fast, slow):
            con.execute("W[d,c] = 0 * W0[d,c];")
        for _ in range(7):
            got = []
            for con in (fast, slow):
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    con.execute(text, {"lr": 0.5} if "$lr" in text else None)
                got.append(sorted(str(m.message) for m in w))
            assert got[0] == got[1]
            mine, pools = _stored(fast), _stored(slow)
            del mine["A"], pools["A"]  # random, drawn by each connection
            assert mine == pools
    assert replays["ran"] >= 4


def test_the_replayed_logistic_step_is_numpys(replays):
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        w = np.zeros_like(W0)
        for _ in range(8):
            con.execute(LOGISTIC, {"lr": 0.5})
            loss, w = _numpy_logistic(w, 0.5)
            np.testing.assert_allclose(float(con.tensor("L")), loss, rtol=1e-13)
            np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
    assert replays["ran"] >= 5


def _accounts(result):
    return (result.bytes_moved, result.peak_bytes, result.kernel_calls, result.nnz,
            result.nonfinite, result.crc32,
            [(m.kernel_calls, m.bytes_moved, m.peak_tile_bytes, m.peak_bytes, m.out_nnz)
             for m in result.ops])


def test_a_replay_reports_the_general_runs_accounts(replays):
    """EXPLAIN ANALYZE's figures of a replayed run are those of the same run taken row by row:
    bytes moved, the peaks, kernel calls per operation, each stored tile's facts."""
    with _connect(True) as con:
        con.execute("W1[d,h] = 0.5 * W1[d,h];")
        for _ in range(5):
            con.execute(MLP, {"lr": 0.0})  # the same weights: the same facts each run
        assert replays["ran"] >= 1
        replayed = con.engine.last_run
        assert all(m.seconds >= 0 for m in replayed.ops)
        assert sum(m.seconds for m in replayed.ops) <= replayed.seconds
        memo = con.engine.last_plan.memo
        rows, specs = memo["fastpath_trace"][:2]
        memo["fastpath_trace"] = (rows, specs, None, fastpath.TRACE_TRIES)  # row by row
        ran = replays["ran"]
        con.execute(MLP, {"lr": 0.0})
        assert replays["ran"] == ran
        assert _accounts(con.engine.last_run) == _accounts(replayed)
        text = con.explain(MLP.replace("$lr", "0.0"), analyze=True)
        assert "kernel" in text.lower()


def test_a_changed_input_leaves_the_replay(replays):
    """A new version of an input of another shape, dtype or layout is not replayed; the
    answer is numpy's, and the next runs replay again."""
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        for _ in range(5):
            con.execute("S[b,c] = EXP(SUM(X[b,d] * W0[d,c]));")
        ran = replays["ran"]
        assert ran >= 2
        con.load("W0", W0 * 2, replace=True)  # the same signature: replayed, new bytes
        con.execute("S[b,c] = EXP(SUM(X[b,d] * W0[d,c]));")
        np.testing.assert_allclose(con.tensor("S"), np.exp(X @ (W0 * 2)), rtol=1e-13)
        con.load("W0", (W0 * 3).astype(np.float32), replace=True)  # another dtype
        con.execute("S[b,c] = EXP(SUM(X[b,d] * W0[d,c]));")
        np.testing.assert_allclose(con.tensor("S"), np.exp(X @ (W0 * 3).astype(np.float32)),
                                   rtol=1e-6)
        for _ in range(4):
            con.execute("S[b,c] = EXP(SUM(X[b,d] * W0[d,c]));")
        assert replays["ran"] > ran


def test_a_new_parameter_value_is_not_a_replay_of_the_old(replays):
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        w = np.zeros_like(W0)
        for lr in (0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.1, 0.5):
            con.execute(LOGISTIC, {"lr": lr})
            _, w = _numpy_logistic(w, lr)
            np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
    assert replays["ran"] >= 1


def test_a_failing_kernel_in_a_replay_is_named_and_stores_nothing(replays, snapshot):
    with _connect(True) as con:
        con.load("ex", np.array([1, 2, 0, 0, 3]))
        for _ in range(5):
            con.execute("q[i,t] = POW(tok[i,t], ex[i]);")
        assert replays["ran"] >= 2
        con.load("ex", np.array([1, 2, -1, 0, 3]), replace=True)
        before = snapshot(con)
        ran, called = replays["ran"], replays["called"]
        with pytest.raises(tensordb.DataError,
                           match=r"of q\[i,t\] = POW.*failed on the data: Integers to negative"):
            con.execute("q[i,t] = POW(tok[i,t], ex[i]);")
        assert replays["called"] == called + 1 and replays["ran"] == ran  # raised in it
        # (the catalog's rows; the spare payload files of replaced versions are taken by a
        # failed statement on every path, the pool's too)
        assert snapshot(con)[:2] == before[:2]
        con.load("ex", np.array([2, 2, 1, 0, 3]), replace=True)
        con.execute("q[i,t] = POW(tok[i,t], ex[i]);")
        tok = con.tensor("tok")
        np.testing.assert_array_equal(con.tensor("q"), tok ** np.array([2, 2, 1, 0, 3])[:, None])


def test_ctrl_c_stops_a_replay_and_stores_nothing(replays, snapshot):
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        for _ in range(5):
            con.execute(LOGISTIC, {"lr": 0.5})
        ran, called = replays["ran"], replays["called"]
        assert ran >= 2
        before = snapshot(con)
        calls = []

        def interrupt(done, total):
            calls.append(done)
            if len(calls) == 6:  # between two kernel calls of the replay
                raise KeyboardInterrupt
        con.progress_callback = interrupt
        with pytest.raises(KeyboardInterrupt):
            con.execute(LOGISTIC, {"lr": 0.5})
        con.progress_callback = None
        assert replays["called"] == called + 1 and replays["ran"] == ran  # stopped in it
        assert snapshot(con)[:2] == before[:2]  # (spare payload files: as above)
        w = con.tensor("W").copy()
        con.execute(LOGISTIC, {"lr": 0.5})
        _, w = _numpy_logistic(w, 0.5)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)


class _Op:
    def __init__(self, name):
        self.name = name

    def describe(self):
        return f"{self.name}[i] = ..."


def _trace(fns, spec_call=None):
    """A trace by hand: a Load (key 0, a 2 x 3 array), a product (key 1), a reduction that
    keeps no join value (key 2, kept under 10), a call that would read it (key 3, stored)."""
    a = np.arange(6.0).reshape(2, 3)
    loads = [(0, 0, "task0", False, (a.shape, a.dtype, True), 0)]
    rows = [(fastline.PLAIN, 0, fns[0], (0,), 1, False, (), None, "task1"),
            (fastline.KEEP, 1, fns[1], (1,), 2, False, (), 10, "task2"),
            (fastline.SHARED, 2, fns[2], (1, 2), 3, True, (0, 1, 2, 10), 10, "task3")]
    return a, fastline.record(loads, rows, {3: None}, 5, 48, (0, 0, 0), (48, 24, 24),
                              (48, 96, 120))


def test_a_replay_by_hand_calls_its_spec_where_a_kept_value_is_missing():
    """The generated function: each row's call, a stored tile's facts handed to the sink, the
    recorded accounts; a SHARED row whose reduction kept nothing calls its spec instead."""
    shared_calls, spec_calls, finished = [], [], []
    fns = [lambda args, out: args[0] * 2,
           lambda args, out: (args[0].sum(0), None),
           lambda args, out: shared_calls.append(args)]
    a, trace = _trace(fns)
    assert "del v0, v1, v2, v10" in trace.run.source

    def spec_call(row, args, out):
        spec_calls.append(row[8])
        return args[0] + args[1]
    dest = {3: np.empty((2, 3))}
    ops = [_Op("p"), _Op("r"), _Op("s")]
    got = fastline.replay(trace, ops, dest, lambda k, t, f: finished.append((k, f)), None, None,
                          lambda task, dense: (a, 0), lambda t: (6, False, 7), [1, 1, 1],
                          spec_call, 2)
    assert type(got) is not dict
    np.testing.assert_array_equal(dest[3], a * 2 + (a * 2).sum(0))
    assert shared_calls == [] and spec_calls == ["task3"]
    assert finished == [(3, (6, False, 7))]
    assert got.tiles == {3: dest[3]} and got.tiles[3] is dest[3]
    assert (got.crc32, got.nnz, got.nonfinite) == ({3: 7}, {3: 6}, {3: False})
    assert (got.bytes_moved, got.peak_bytes, got.kernel_calls) == (5, 48, 3)
    assert [(m.kernel_calls, m.peak_tile_bytes, m.peak_bytes) for m in got.ops] == \
        [(1, 48, 48), (1, 24, 96), (1, 24, 120)]
    assert got.worker_busy[1:] == [0.0]


def test_a_replay_by_hand_leaves_a_changed_load_to_the_loop_and_names_a_failed_call():
    boom = ValueError("bad value")

    def fail(args, out):
        raise boom
    a, trace = _trace([fail, None, None])
    ops = [_Op("p"), _Op("r"), _Op("s")]
    read = []
    for other in (a.astype(np.float32), np.arange(12.0).reshape(2, 6)[:, ::2],  # strided
                  a[:, :2]):
        got = fastline.replay(trace, ops, {3: np.empty((2, 3))}, None, None, None,
                              lambda task, dense: (read.append(task), (other, 0))[1], None,
                              [1, 1, 1], None, 2)
        assert type(got) is dict and got[0][0] is other  # read once: the loop takes it
    assert read == ["task0"] * 3
    got = fastline.replay(trace, ops, {3: np.empty((2, 3))}, None, None, None,
                          lambda task, dense: (a.copy(), None), None, [1, 1, 1], None, 2)
    assert type(got) is dict  # held for other bytes (its own 48, not the recorded 0)
    got = fastline.replay(trace, ops, {}, None, None, None, lambda task, dense: (a, 0), None,
                          [1, 1, 1], None, 2)
    assert type(got) is dict  # not the output buffers recorded
    with pytest.raises(tensordb.DataError, match=r"of p\[i\] = \.\.\. failed on the data: bad"):
        fastline.replay(trace, ops, {3: np.empty((2, 3))}, None, None, None,
                        lambda task, dense: (a, 0), None, [1, 1, 1], None, 2)
