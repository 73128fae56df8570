"""A reduction's join value read again by a later elementwise call of the straight-line run
(exec/reuse.py): the EXP of a LOGSUMEXP computed once for its SUM and for its GRAD. The bytes
against the pool's run (which computes it twice) and numpy, NaN, inf and -0.0 included, on one
tile and on several; and that the kept value was read."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.exec import fastpath, reuse

RNG = np.random.default_rng(2929)

STEP = ("L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b,c] * Z[b,c])); LET dZ = GRAD(L, Z); "
        "G[b,c] = dZ[b,c];")


def _connect(fast: bool, z, y, tile=None):
    con = tensordb.connect(workers=2)
    con.engine.executor().fast_path = fast
    con.load("Z", z, tile=tile)
    con.load("Y", y)
    return con


def _both(text, z, y, tile=None):
    """(fast connection's stored bytes, pool's, the fast plan's memo) of ``text``."""
    out = []
    memo = None
    for fast in (True, False):
        with _connect(fast, z, y, tile) as con:
            con.execute(text)
            con.execute(text)  # a cached plan's second run: the bound calls
            names = sorted(m.name for m in con.store.list())
            out.append({n: (str(con.tensor(n).dtype), con.tensor(n).tobytes()) for n in names})
            if fast:
                memo = con.engine.last_plan.memo
                assert "fastpath" in memo
    return out[0], out[1], memo


def _read_kept(memo) -> int:
    """How many rewritten calls (reading a kept join value) were bound in the last run."""
    return sum(a is not None and a[2] is not None for a in memo["fastpath_shared"][2])


def _numpy(z, y):
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(1, keepdims=True)
    loss = np.mean(np.log(s[:, 0]) + m[:, 0] - np.sum(y * z, 1))
    return loss, (e / s - y) / len(z)


def test_the_exp_of_a_logsumexp_is_computed_once_with_the_pools_bytes():
    z = RNG.standard_normal((50, 7))
    y = np.eye(7)[RNG.integers(0, 7, 50)]
    fast, pool, memo = _both(STEP, z, y)
    assert fast == pool
    assert _read_kept(memo) == 1
    loss, dz = _numpy(z, y)
    got = np.frombuffer(fast["G"][1]).reshape(dz.shape)
    np.testing.assert_allclose(got, dz, rtol=1e-13, atol=1e-17)
    np.testing.assert_allclose(np.frombuffer(fast["L"][1])[0], loss, rtol=1e-13)


@pytest.mark.parametrize("special", ["inf", "-inf", "nan", "-0.0", "row of -inf"])
def test_nonfinite_and_negative_zero_values_give_the_pools_bytes(special):
    z = RNG.standard_normal((20, 5))
    if special == "row of -inf":
        z[3] = -np.inf
    else:
        z[[1, 4, 4], [0, 2, 3]] = float(special)
    y = np.eye(5)[RNG.integers(0, 5, 20)]
    fast, pool, memo = _both(STEP, z, y)
    assert fast == pool
    assert _read_kept(memo) == 1


def test_a_tensor_stored_in_several_tiles():
    z = RNG.standard_normal((12, 9))
    y = np.eye(9)[RNG.integers(0, 9, 12)]
    fast, pool, memo = _both(STEP, z, y, tile=(4, 3))
    assert fast == pool
    assert _read_kept(memo) >= 1
    _, dz = _numpy(z, y)
    np.testing.assert_allclose(np.frombuffer(fast["G"][1]).reshape(dz.shape), dz,
                               rtol=1e-13, atol=1e-17)


def test_float32_and_softmax_give_the_pools_bytes():
    z = RNG.standard_normal((30, 6)).astype(np.float32)
    y = np.eye(6, dtype=np.float32)[RNG.integers(0, 6, 30)]
    text = STEP + " P[b,c] = SOFTMAX(Z[b,c], c); LET S[b,c] = SOFTMAX(Z[b,c], c); " \
        "Q = SUM(S[b,c] * Y[b,c]); LET dQ = GRAD(Q, Z); H[b,c] = dQ[b,c];"
    fast, pool, _ = _both(text, z, y)
    assert fast == pool
    assert fast["G"][0] == "float32"


def test_only_the_same_tiles_and_a_whole_join_are_shared():
    """The subexpression must read the very tiles the reduction read (its labels one to one):
    EXP(Z - m) of another tensor, or of Z transposed, is not the reduction's value."""
    z = RNG.standard_normal((6, 6))
    y = np.eye(6)[RNG.integers(0, 6, 6)]
    with _connect(True, z, y) as con:
        con.load("Z2", z.copy())
        text = ("LET m[b] = MAX(Z[b,c]); LET s[b] = SUM(EXP(Z[b,c] - m[b])); "
                "A[b,c] = EXP(Z2[b,c] - m[b]) * s[b]; B[c,b] = EXP(Z[c,b] - m[b]) * s[b]; "
                "C[b,c] = EXP(Z[b,c] - m[b]) * s[b];")
        con.execute(text)
        plan = con.engine.last_plan
        steps = fastpath.program(plan, 2)
        keep, use = reuse.shares(plan, steps, fastpath.KERNEL)
        outputs = {str(u.op.output) for u in use.values()}
        assert outputs == {"C"}
        m = z.max(1)
        s = np.exp(z - m[:, None]).sum(1)
        np.testing.assert_allclose(con.tensor("C"), np.exp(z - m[:, None]) * s[:, None],
                                   rtol=1e-14)
        np.testing.assert_allclose(con.tensor("B"), np.exp(z - m[None, :]) * s[None, :],
                                   rtol=1e-14)


def test_a_parameter_outside_the_shared_subexpression_takes_each_call_s_value():
    """The rewritten call's operation holds the parameters of the rest of its join: a cached
    plan run with a new value (cache.rebind's operations) rewrites it again, as its
    KernelSpecs are made again; the value of the first run was kept (R = EXP(Z) * 1 where
    $u was 2). Against numpy and the pool's run at each value."""
    z = RNG.standard_normal((8, 5))
    text = "s[i] = SUM(EXP(Z[i,j])); R[i,j] = EXP(Z[i,j]) * $u + $v;"
    cons = []
    for fast in (True, False):
        con = tensordb.connect(workers=1)  # one Load of Z: the reduction's and R's tile
        con.engine.executor().fast_path = fast
        con.load("Z", z)
        cons.append(con)
    try:
        for u, v in ((1.0, 0.0), (2.0, 0.5), (-3.0, 0.25), (2.0, 0.5)):
            got = []
            for con in cons:
                con.execute(text, {"u": u, "v": v})
                got.append(con.tensor("R").tobytes())
            np.testing.assert_array_equal(cons[0].tensor("R"), np.exp(z) * u + v)
            np.testing.assert_array_equal(cons[0].tensor("s"), np.exp(z).sum(1))
            assert got[0] == got[1]
            assert _read_kept(cons[0].engine.last_plan.memo) == 1  # the kept value was read
    finally:
        for con in cons:
            con.close()


def test_a_literal_zero_of_the_other_sign_is_not_the_same_subexpression():
    """0.0 == -0.0 (the literals compare equal), but Z + 0.0 and Z + -0.0 differ where Z
    holds -0.0 (1 / that is +inf or -inf): the reduction's value is not read for the other
    literal. Bytes against numpy and the pool's run."""
    z = np.array([[-0.0, 1.0, 2.0, -0.0], [0.5, -0.0, 4.0, -3.0]])
    text = "s[i] = SUM(1 / (Z[i,j] + 0.0)); R[i,j] = 2 * (1 / (Z[i,j] + -0.0));"
    same = "s[i] = SUM(1 / (Z[i,j] + -0.0)); R[i,j] = 2 * (1 / (Z[i,j] + -0.0));"
    with np.errstate(divide="ignore"):
        want = {text: (np.sum(1 / (z + 0.0), 1), 2 * (1 / (z + -0.0))),
                same: (np.sum(1 / (z + -0.0), 1), 2 * (1 / (z + -0.0)))}
    for t, kept in ((text, 0), (same, 1)):
        got = []
        for fast in (True, False):
            with tensordb.connect(workers=1) as con:  # one Load of Z: both calls' tile
                con.engine.executor().fast_path = fast
                con.load("Z", z)
                con.execute(t)
                con.execute(t)
                got.append((con.tensor("s").tobytes(), con.tensor("R").tobytes()))
                if fast:
                    assert _read_kept(con.engine.last_plan.memo) == kept
        assert got[0] == got[1]
        assert got[0] == tuple(a.tobytes() for a in want[t])
