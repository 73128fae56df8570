"""The straight-line run's buffers for large intermediates (exec/fastpath.py ``POOL_BYTES``,
exec/fastrows.py ``_pooled``): kept with the plan between runs and recycled within one, with
the pool's bytes (the general run allocates every tile) and numpy's answers, and never a
buffer still read."""
from __future__ import annotations

import numpy as np

import tensordb
from tensordb.exec import fastpath, fastpool

RNG = np.random.default_rng(4129)
X = RNG.standard_normal((300, 64)) / 8  # 300 x 128 float64 intermediates: 300 KiB each
Y = np.eye(10)[RNG.integers(0, 10, 300)]
W1 = RNG.normal(0, 0.2, (64, 128))
W2 = RNG.normal(0, 0.2, (128, 10))
MLP = ("LET H[b,h] = RELU(SUM(X[b,d] * W1[d,h])); LET Z[b,c] = SUM(H[b,h] * W2[h,c]); "
       "L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b,c] * Z[b,c])); "
       "LET dW1 = GRAD(L, W1); LET dW2 = GRAD(L, W2); "
       "W1[d,h] = W1[d,h] - 0.5 * dW1[d,h]; W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];")


def _connect(fast: bool):
    con = tensordb.connect(workers=2)
    con.engine.executor().fast_path = fast
    for name, a in (("X", X), ("Y", Y), ("W1", W1), ("W2", W2)):
        con.load(name, a)
    return con


def _steps(con, n: int, text: str = MLP) -> list:
    out = []
    for _ in range(n):
        con.execute(text)
        out.append(tuple(con.tensor(t).tobytes() for t in ("L", "W1", "W2")))
    return out


def _numpy(n: int):
    w1, w2 = W1.copy(), W2.copy()
    for _ in range(n):
        pre = X @ w1
        h = np.maximum(pre, 0)
        z = h @ w2
        m = z.max(1, keepdims=True)
        e = np.exp(z - m)
        s = e.sum(1, keepdims=True)
        loss = np.mean(np.log(s[:, 0]) + m[:, 0] - np.sum(Y * z, 1))
        dz = (e / s - Y) / len(z)
        dh = (dz @ w2.T) * (pre > 0)
        w2, w1 = w2 - 0.5 * (h.T @ dz), w1 - 0.5 * (X.T @ dh)
    return loss, w1, w2


def test_large_intermediates_reuse_buffers_with_the_pools_bytes():
    with _connect(True) as fast, _connect(False) as pool:
        got, want = _steps(fast, 4), _steps(pool, 4)
        memo = fast.engine.last_plan.memo
        assert "fastpath" in memo
        kept = memo["fastpath_pool"]
        assert kept and all(b.nbytes >= 128 << 10 for bufs in kept.values() for b in bufs)
        assert got == want
        loss, w1, w2 = _numpy(4)
        np.testing.assert_allclose(float(fast.tensor("L")), loss, rtol=1e-12)
        np.testing.assert_allclose(fast.tensor("W1"), w1, rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(fast.tensor("W2"), w2, rtol=1e-11, atol=1e-14)


def test_several_steps_a_call_recycle_within_the_run(monkeypatch):
    """Five steps in one plan: a buffer freed by one step is written by the next (within
    POOL_BYTES); with no pool at all the bytes are the same."""
    text = MLP * 5
    with _connect(True) as fast, _connect(True) as unpooled, _connect(False) as pool:
        got = _steps(fast, 2, text)
        kept = fast.engine.last_plan.memo["fastpath_pool"]
        assert sum(b.nbytes for bufs in kept.values() for b in bufs) <= fastpath.POOL_BYTES
        monkeypatch.setattr(fastpath, "POOL_BYTES", 0)
        assert _steps(unpooled, 2, text) == got
        assert not unpooled.engine.last_plan.memo.get("fastpath_pool")
        monkeypatch.undo()
        assert _steps(pool, 2, text) == got


def test_a_buffer_still_read_is_not_recycled():
    """H's buffer is read by the backward pass long after the forward one; a tile that is
    its operand's own value (a view) keeps it from the pool."""
    buf = np.empty((3, 4))
    view = buf[1:]
    assert fastpath._aliased(buf, {1: view}, {})
    assert fastpath._aliased(buf, {}, {2: buf})
    assert not fastpath._aliased(buf, {1: np.empty((3, 4))}, {})


def test_all_plans_kept_buffers_are_bounded_for_the_process(monkeypatch):
    """The buffers plans keep between runs are idle memory outside any statement's budget:
    past POOL_TOTAL_BYTES for the whole process, a run keeps none; a plan dropped from the
    cache gives its bytes back to the total."""
    with _connect(True) as fast:
        _steps(fast, 1)
        kept = fast.engine.last_plan.memo["fastpath_pool"]
        assert kept.nbytes == sum(b.nbytes for bufs in kept.values() for b in bufs) > 0
        assert fastpath._kept[0] >= kept.nbytes
        before = fastpath._kept[0]
        monkeypatch.setattr(fastpool, "POOL_TOTAL_BYTES", before - 1)
        got = _steps(fast, 1)  # takes the plan's buffers, finds no room to keep them again
        assert "fastpath_pool" not in fast.engine.last_plan.memo
        assert fastpath._kept[0] <= before - kept.nbytes  # (other plans may leave meanwhile)
        monkeypatch.undo()
    with _connect(False) as pool:
        assert _steps(pool, 2)[-1] == got[0]
