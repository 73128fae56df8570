"""The straight-line run of a tiny plan (exec/fastpath.py) against the pool's general run: the
same stored bytes, dtypes, catalog statistics, NaN/inf flags and warnings on a corpus of ML
statements (training steps with GRAD, LOGSUMEXP, SOFTMAX, MEAN, ARGMAX, slices, gathers, LETs),
and against numpy; its promises (errors named, nothing stored by a failed statement, the
memory budget, EXPLAIN ANALYZE's counts)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tensordb
from tensordb.exec import fastpath

RNG = np.random.default_rng(29)
X = RNG.standard_normal((40, 6))
LABELS = RNG.integers(0, 10, 40)
Y = np.eye(10)[LABELS]  # one-hot: stored sparse
W0 = RNG.normal(0, 0.3, (6, 10))
W1 = RNG.normal(0, 0.3, (6, 8))
W2 = RNG.normal(0, 0.3, (8, 10))
E = RNG.standard_normal((7, 3))
TOK = RNG.integers(0, 7, (5, 2)).astype(np.int64)

LOGISTIC = ("LET Z[b,c] = SUM(X[b 0:30, d] * W[d,c]); "
            "L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b 0:30, c] * Z[b,c])); "
            "LET dW = GRAD(L, W); W[d,c] = W[d,c] - $lr * dW[d,c];")
MLP = ("LET H[b,h] = RELU(SUM(X[b 0:30, d] * W1[d,h])); LET Z[b,c] = SUM(H[b,h] * W2[h,c]); "
       "L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b 0:30, c] * Z[b,c])); "
       "LET dW1 = GRAD(L, W1); LET dW2 = GRAD(L, W2); "
       "W1[d,h] = W1[d,h] - $lr * dW1[d,h]; W2[h,c] = W2[h,c] - $lr * dW2[h,c];")
CORPUS = [
    ("W[d,c] = 0 * W0[d,c];", None),
    (LOGISTIC, {"lr": 0.5}),
    (LOGISTIC, {"lr": 0.25}),
    (MLP, {"lr": 0.5}),
    (MLP, {"lr": 0.5}),
    ("P[b,c] = SOFTMAX(SUM(X[b,d] * W0[d,c]), c);", None),
    ("LET Zt[b,c] = SUM(X[b 30:, d] * W[d,c]); acc = MEAN(ARGMAX(Zt[b,c]) = ARGMAX(Y[b 30:, k]));",
     None),
    ("pred[b] = ARGMAX(SUM(X[b,d] * W0[d,c]));", None),
    ("G[b,t,d] = E[tok[b,t], d] * 2;", None),
    ("LET G2[b,t,d] = E[tok[b,t], d]; s[b] = SUM(G2[b,t,d] * G2[b,t,d]);", None),
    ("big[b,c] = EXP(1000 * X[b,c]);", None),  # overflows: inf, a warning
    ("nan[b] = LOG(SUM(X[b,d]));", None),          # LOG of negatives: NaN
    ("cnt[c] = SUM(Y[b,c] > 0.5);", None),         # bool -> int
    ("ints[i] = SUM(tok[i,t] * tok[i,t]);", None),
    ("M[d,h] = MAX(X[b,d] * W1[d,h]); m = MIN(M[d,h]);", None),
    ("C[i,k] = SUM(A[i,j] * A[j,k]); D[i,k] = C[i,k] + 1;", None),  # several tiles: aggregates
]


def _connect(fast: bool, **options):
    con = tensordb.connect(workers=2, **options)
    con.engine.executor().fast_path = fast
    con.load("X", X)
    con.load("Y", Y)
    con.load("W0", W0)
    con.load("W1", W1)
    con.load("W2", W2)
    con.load("E", E)
    con.load("tok", TOK)
    con.load("A", RNG.standard_normal((12, 12)), tile=(4, 4))
    return con


def _stored(con) -> dict:
    """name -> (dtype, shape, bytes, tile count, nnz, the NaN/inf flags of its tiles)."""
    out = {}
    for m in con.store.list():
        r = con.store.open(m.name)
        flags = tuple(sorted((c, e.nonfinite, e.nnz) for c, e in r.entries.items()))
        a = con.tensor(m.name)
        out[m.name] = (str(a.dtype), a.shape, a.tobytes(), m.tile_count, m.nnz, flags)
    return out


def _run_corpus(fast: bool):
    warned, fast_runs = [], 0
    RNG2 = np.random.default_rng(5)
    with _connect(fast) as con:
        con.load("A", RNG2.standard_normal((12, 12)), tile=(4, 4), replace=True)
        for text, params in CORPUS:
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                con.execute(text, params)
            warned.append(sorted(str(w.message) for w in got))
            fast_runs += "fastpath" in con.engine.last_plan.memo
        return _stored(con), warned, fast_runs


def test_the_corpus_stores_the_same_bytes_with_and_without_the_fast_path():
    fast, fast_warned, runs = _run_corpus(True)
    slow, slow_warned, slow_runs = _run_corpus(False)
    assert runs == len(CORPUS) and slow_runs == 0  # every statement took its own path
    assert fast.keys() == slow.keys()
    for name in fast:
        assert fast[name] == slow[name], name
    assert fast_warned == slow_warned
    assert any("big" in " ".join(w) for w in fast_warned)  # the overflow was named


def test_training_steps_match_numpy():
    with _connect(True) as con:
        w1, w2 = W1.copy(), W2.copy()
        x, y = X[:30], Y[:30]
        for _ in range(4):
            con.execute(MLP, {"lr": 0.5})
            pre = x @ w1
            h = np.maximum(pre, 0)
            z = h @ w2
            m = z.max(1, keepdims=True)
            e = np.exp(z - m)
            s = e.sum(1, keepdims=True)
            loss = np.mean(np.log(s[:, 0]) + m[:, 0] - np.sum(y * z, 1))
            dz = (e / s - y) / len(z)
            dh = (dz @ w2.T) * (pre > 0)
            w2, w1 = w2 - 0.5 * (h.T @ dz), w1 - 0.5 * (x.T @ dh)
            np.testing.assert_allclose(float(con.tensor("L")), loss, rtol=1e-13)
        np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-12, atol=1e-15)
        assert "fastpath" in con.engine.last_plan.memo


def test_a_gather_and_a_slice_of_a_let_in_the_same_group():
    with _connect(True) as con:
        con.execute("LET Z[b,c] = SUM(X[b,d] * W1[d,c]); "
                    "S[b,c] = Z[b 3:9, c 2:5] + 1; "
                    "G[b,t,c] = Z[tok[b,t], c];")
        z = X @ W1
        np.testing.assert_array_equal(con.tensor("S"), z[3:9, 2:5] + 1)
        np.testing.assert_array_equal(con.tensor("G"), z[TOK])


def test_a_load_kept_between_runs_is_read_again_when_its_tensor_changes():
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        for k in range(3):
            con.execute(LOGISTIC, {"lr": 0.5})
        assert con.store.open("Y").has_sparse
        kept = con.engine.last_plan.memo["fastpath_loads"]
        assert any(v[1] is not None for v in kept.values())  # Y's densified box is kept
        y2 = np.eye(10)[(LABELS + 1) % 10]
        con.load("Y", y2, replace=True)
        with _connect(False) as ref:
            ref.load("Y", y2, replace=True)
            ref.load("W", con.tensor("W"))
            con.execute(LOGISTIC, {"lr": 0.5})
            ref.execute(LOGISTIC, {"lr": 0.5})
            assert con.tensor("L").tobytes() == ref.tensor("L").tobytes()
            assert con.tensor("W").tobytes() == ref.tensor("W").tobytes()


def test_a_kept_view_of_a_payload_file_is_a_copy_read_again_when_its_tensor_changes(
        monkeypatch):
    text = "LET Z[b,c] = SUM(X[b 0:30, d] * W0[d,c]); S = SUM(Z[b,c] * Z[b,c]);"
    with _connect(True) as unkept:  # the fast path keeping nothing: its peak with the views
        monkeypatch.setattr(fastpath, "LOAD_CACHE_BYTES", 0)
        for _ in range(3):
            unkept.execute(text)
        peak = unkept.engine.last_run.peak_bytes
        monkeypatch.undo()
    with _connect(True) as con, _connect(False) as ref:
        for _ in range(3):
            con.execute(text)
            ref.execute(text)
        kept = con.engine.last_plan.memo["fastpath_loads"]
        # X's slice and W0 are views of their payload files when read: kept as copies that
        # own their memory (the files are not kept mapped), counted as the views the pool reads
        views = [v[1] for v in kept.values() if v[1] is not None and v[2] == 0]
        assert sorted(a.shape for a in views) == [(6, 10), (30, 6)]
        assert all(a.base is None and not a.flags.writeable for a in views)
        assert con.engine.last_run.peak_bytes == peak
        assert con.tensor("S").tobytes() == ref.tensor("S").tobytes()
        x2 = X[::-1].copy()
        con.load("X", x2, replace=True)
        ref.load("X", x2, replace=True)
        con.execute(text)
        ref.execute(text)
        assert con.tensor("S").tobytes() == ref.tensor("S").tobytes()
        z = x2[:30] @ W0
        np.testing.assert_allclose(float(con.tensor("S")), np.sum(z * z), rtol=1e-13)


def test_a_failing_kernel_is_named_and_stores_nothing(snapshot):
    with _connect(True) as con:
        con.load("ex", np.array([1, 2, -1, 0, 3]))
        con.execute("n[i] = SUM(tok[i,t]);")
        before = snapshot(con)
        with pytest.raises(tensordb.DataError, match="failed on the data"):
            con.execute("n[i] = n[i] + 1; q[i,t] = POW(tok[i,t], ex[i]);")
        assert snapshot(con) == before
        assert not con.store.has("q")
        assert "fastpath" in con.engine.last_plan.memo


def test_a_gather_from_a_let_out_of_range_is_a_data_error(snapshot):
    with _connect(True) as con:
        con.load("bad", np.array([[0, 1], [2, 40]]))
        before = snapshot(con)
        with pytest.raises(tensordb.DataError, match=r"bad\[1, 1\] = 40 is out of range"):
            con.execute("LET Z[b,c] = SUM(X[b,d] * W1[d,c]); G[b,t,c] = Z[bad[b,t], c];")
        assert snapshot(con) == before
        con.load("neg", np.array([[-1, -40]]))  # numpy's negative rows, and its first
        con.execute("LET Z[b,c] = SUM(X[b,d] * W1[d,c]); G[b,t,c] = Z[neg[b,t], c];")
        np.testing.assert_array_equal(con.tensor("G"), (X @ W1)[[[-1, -40]]])


def test_explain_analyze_counts_the_kernel_calls():
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        for _ in range(2):
            con.execute(LOGISTIC, {"lr": 0.5})
        plan = con.engine.last_plan
        result = con.engine.last_run
        from tensordb.physical.plan import Kernel
        assert result.kernel_calls == sum(isinstance(t, Kernel) for t in plan.tasks)
        assert result.kernel_calls == sum(m.kernel_calls for m in result.ops)
        assert result.peak_bytes > 0
        text = con.explain(LOGISTIC.replace("$lr", "0.5"), analyze=True)
        assert "kernel" in text.lower()


def test_a_plan_past_the_memory_budget_takes_the_pool():
    with tensordb.connect(workers=2, memory_limit=1 << 20) as con:
        con.load("X", RNG.standard_normal((200, 200)))
        con.execute("S[i,k] = SUM(X[i,j] * X[j,k]);")  # 320 KB a tile, three of them
        assert "fastpath" not in con.engine.last_plan.memo
        np.testing.assert_allclose(con.tensor("S"), con.tensor("X") @ con.tensor("X"))


def test_the_program_reads_each_stored_box_once():
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        con.execute(LOGISTIC, {"lr": 0.5})
        plan = con.engine.last_plan
        steps = fastpath.program(plan, 2)
        loads = [s.task for s in steps if s.kind == fastpath.LOAD]
        boxes = [(t.tensor, t.starts, t.stops) for t in loads]
        assert len(boxes) == len(set(boxes))
        from tensordb.physical.plan import Load
        assert len({(t.tensor, t.starts, t.stops) for t in plan.tasks if isinstance(t, Load)}) \
            == len(boxes)


def test_a_replaced_tensor_is_read_from_the_tile_the_last_run_wrote(monkeypatch):
    """A training step's new weights: the next step's Load of that version takes the copy of
    the tile this plan wrote (no read of the new payload file), while a version another
    statement stored (a replace between steps) is read from its file; the bytes are the
    pool's either way."""
    reads = []
    real = fastpath.run_load

    def counted(task, reader, xp=np):
        reads.append(reader.meta.name)
        return real(task, reader, xp)
    monkeypatch.setattr(fastpath, "run_load", counted)
    with _connect(True) as con, _connect(False) as ref:
        for c in (con, ref):
            c.execute("W[d,c] = 0 * W0[d,c];")
        for _ in range(3):
            for c in (con, ref):
                c.execute(LOGISTIC, {"lr": 0.5})
            assert con.tensor("W").tobytes() == ref.tensor("W").tobytes()
        reads.clear()
        con.execute(LOGISTIC, {"lr": 0.5})
        ref.execute(LOGISTIC, {"lr": 0.5})
        assert "W" not in reads  # the tile the last step wrote, kept as that version's
        kept = con.engine.last_plan.memo["fastpath_outputs"]
        (name, version, _, _), = kept
        assert name == "w" and version == con.store.open("W").meta.version
        assert con.tensor("W").tobytes() == ref.tensor("W").tobytes()
        w2 = RNG.normal(0, 0.3, (6, 10))
        for c in (con, ref):  # another version, stored by another statement
            c.load("W", w2, replace=True)
        reads.clear()
        con.execute(LOGISTIC, {"lr": 0.5})
        ref.execute(LOGISTIC, {"lr": 0.5})
        assert "W" in reads
        assert con.tensor("W").tobytes() == ref.tensor("W").tobytes()
        assert con.tensor("L").tobytes() == ref.tensor("L").tobytes()


def test_a_kept_output_tile_is_taken_only_for_the_catalogs_tile_of_its_version():
    """``_written``: the version, the box and the catalog row (dense, its checksum and nonzero
    count) must all be the kept tile's."""
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        con.execute(LOGISTIC, {"lr": 0.5})
        reader = con.store.open("W")
        (coords, entry), = reader.entries.items()
        value = con.tensor("W")
        from tensordb.physical.plan import Load
        task = Load(0, "W", entry.starts, tuple(a + n for a, n in zip(entry.starts, entry.shape)))
        box = ("w", reader.meta.version, task.starts, task.stops)
        good = {box: (coords, value, entry.crc32, entry.nnz)}
        assert fastpath._written(task, reader, good) is value
        other = ("w", reader.meta.version + 1, task.starts, task.stops)
        assert fastpath._written(task, reader, {other: good[box]}) is None
        assert fastpath._written(task, reader, {box: (coords, value, entry.crc32 ^ 1,
                                                      entry.nnz)}) is None
        assert fastpath._written(task, reader, {box: (coords, value, entry.crc32,
                                                      entry.nnz + 1)}) is None
        assert fastpath._written(task, reader, {box: (coords, value.astype(np.float32),
                                                      entry.crc32, entry.nnz)}) is None


def test_kept_output_tiles_stay_within_the_plans_bound(monkeypatch):
    monkeypatch.setattr(fastpath, "LOAD_CACHE_BYTES", 0)
    with _connect(True) as con:
        con.execute("W[d,c] = 0 * W0[d,c];")
        for _ in range(3):
            con.execute(LOGISTIC, {"lr": 0.5})
        assert "fastpath_outputs" not in con.engine.last_plan.memo
