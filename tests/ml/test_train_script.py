"""sql/train_mlp.sql through the command line (a subprocess): the loss it prints decreases and
matches the same training written by hand in numpy, and the trained weights match too."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensordb

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "sql" / "train_mlp.sql"
LR, ROWS = 0.5, 64


def _numpy_training(x, y, w1, b1, w2, steps):
    """SGD on the same MLP (RELU hidden layer with a bias, softmax cross-entropy), by hand."""
    losses = []
    for _ in range(steps):
        pre = x @ w1 + b1
        h = np.maximum(pre, 0)
        z = h @ w2
        e = np.exp(z - z.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        losses.append(float(-np.sum(np.log(p[y.astype(bool)])) / ROWS))
        dz = (p - y) / ROWS
        dh = (dz @ w2.T) * (pre > 0)
        w1, b1, w2 = w1 - LR * (x.T @ dh), b1 - LR * dh.sum(0), w2 - LR * (h.T @ dz)
    return losses, w1, b1, w2


def test_train_mlp_script_through_the_cli(tmp_path):
    text = SCRIPT.read_text()
    steps = len(re.findall(r"^-- step \d+$", text, flags=re.M))
    assert steps >= 10
    # The initial data and weights, from the script's own setup (before the first step).
    with tensordb.connect(tmp_path / "setup.tdb") as con:
        con.execute_script(text.split("\n-- step 1\n")[0])
        x, y, w1, b1, w2 = (con.tensor(n) for n in ("X", "Y", "W1", "b1", "W2"))
    assert set(np.unique(y)) == {0.0, 1.0} and (y.sum(1) == 1).all() and y.sum(0).min() > 0
    env = {**os.environ, "TENSORDB_DEBUG": "",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    db = tmp_path / "train.tdb"
    proc = subprocess.run([sys.executable, "-m", "tensordb", str(db), "-f", str(SCRIPT)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    found = re.findall(r"^(\d+)\s+([0-9.]+)\s*$", proc.stdout, flags=re.M)
    printed = [(int(s), float(v)) for s, v in found]
    digits = [len(v.partition(".")[2]) for _, v in found]
    assert [s for s, _ in printed] == [1] + list(range(5, steps + 1, 5))
    losses, w1, b1, w2 = _numpy_training(x, y, w1, b1, w2, steps)
    for (step, loss), d in zip(printed, digits):  # as printed: rounded to d decimals
        assert d >= 4 and abs(loss - losses[step - 1]) <= 0.5 * 10.0 ** -d + 1e-12
    assert printed[-1][1] < 0.5 * printed[0][1]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    with tensordb.connect(db, read_only=True) as con:
        np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("b1"), b1, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-10, atol=1e-12)
        # the last step's loss, before its update
        np.testing.assert_allclose(con.tensor("L"), losses[-1], rtol=1e-10)
    # the same script from Python, one execute_script call (groups cut only by the SELECTs)
    with tensordb.connect(tmp_path / "py.tdb") as con:
        con.execute_script(text)
        np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-10, atol=1e-12)


EMBEDDING = ROOT / "sql" / "train_embedding.sql"


def _numpy_embedding_step(x, tok, y, e, w, u, lo, hi, lr):
    """One mini-batch step of sql/train_embedding.sql by hand: the loss, then the weights."""
    h = e[tok].sum(1)
    z = x[lo:hi] @ w + h[lo:hi] @ u
    m = z.max(1, keepdims=True)
    p = np.exp(z - m) / np.exp(z - m).sum(1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(z - m).sum(1)) + m[:, 0] - (y[lo:hi] * z).sum(1)))
    dz = (p - y[lo:hi]) / (hi - lo)
    dh = dz @ u.T
    de = np.zeros_like(e)
    np.add.at(de, tok[lo:hi].reshape(-1), np.repeat(dh, tok.shape[1], axis=0))  # scatter-add
    return loss, e - lr * de, w - lr * (x[lo:hi].T @ dz), u - lr * (h[lo:hi].T @ dz)


def test_train_embedding_script_uses_every_construct_and_matches_numpy(tmp_path):
    """sql/train_embedding.sql (comparisons, CASE, IF, ARGMAX, MEAN, COUNT, LOGSUMEXP, SOFTMAX,
    slices of stored tensors and of a LET, a gather, GRAD through them, LETs read by SQL) through
    the command line: its loss curve, accuracy and weights against the same training in numpy;
    then one more step from Python with the learning rate as a parameter."""
    text = EMBEDDING.read_text()
    for construct in ("ARGMAX(", "MEAN(", "COUNT(", "LOGSUMEXP(", "SOFTMAX(", "IF(", "CASE ",
                      "Emb[tok[n,s], k]", "X[b 0:10, q]", "Bag[b 0:10, k]", "GRAD(", " > ",
                      " = ", "FROM acc_emb"):
        assert construct in text, construct
    steps = len(re.findall(r"^-- step \d+$", text, flags=re.M))
    with tensordb.connect(tmp_path / "setup.tdb") as con:
        con.execute_script(text.split("\n-- step 1\n")[0])
        x, tok, y, e, w, u = (con.tensor(n) for n in ("X", "tok", "Y", "Emb", "W", "U"))
    assert tok.dtype == np.int64 and set(np.unique(tok)) == set(range(12))
    assert (y.sum(1) == 1).all() and y.sum(0).min() > 0
    env = {**os.environ, "TENSORDB_DEBUG": "",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    db = tmp_path / "emb.tdb"
    proc = subprocess.run([sys.executable, "-m", "tensordb", str(db), "-f", str(EMBEDDING)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no warning: no GRAD is zeros, no EXP overflowed
    found = re.findall(r"^(\d+)\s+(-?[0-9.]+)\s*$", proc.stdout, flags=re.M)
    printed = [(int(s), float(v)) for s, v in found]
    digits = [len(v.partition(".")[2]) for _, v in found]
    losses = []
    for k in range(steps):
        lo = (k % 4) * 10
        loss, e, w, u = _numpy_embedding_step(x, tok, y, e, w, u, lo, lo + 10, 0.5)
        losses.append(loss)
    assert [s for s, _ in printed] == list(range(1, steps + 1))
    for (step, loss), d in zip(printed, digits):  # as printed: rounded to d decimals
        assert d >= 4 and abs(loss - losses[step - 1]) <= 0.5 * 10.0 ** -d + 1e-12
    assert losses[-1] < 0.75 * losses[0]
    z = x @ w + e[tok].sum(1) @ u
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    accuracy = np.mean(z.argmax(1) == y.argmax(1))
    confident = np.mean(p.max(1) > 0.5)
    acc_line = re.search(r"^(0\.\d+|1\.0+)\s+(0\.\d+|1\.0+)\s*$", proc.stdout, flags=re.M)
    assert acc_line is not None, proc.stdout
    assert float(acc_line.group(1)) == pytest.approx(accuracy, abs=1e-12)  # k / 40: exact
    assert float(acc_line.group(2)) == pytest.approx(confident, abs=1e-12)
    with tensordb.connect(db) as con:
        for name, want in (("Emb", e), ("W", w), ("U", u), ("P", p)):
            np.testing.assert_allclose(con.tensor(name), want, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(con.tensor("pred"), z.argmax(1))
        # one more step from Python: the learning rate a parameter, the step text the script's
        step_text = text.split("-- step 1\n")[1].split("INSERT INTO")[0].replace("0.5 *", "$lr *")
        con.execute("LET Bag[n,k] = SUM(Emb[tok[n,s], k]);" + step_text,  # a new session
                    {"lr": 0.25})
        loss, e, w, u = _numpy_embedding_step(x, tok, y, e, w, u, 0, 10, 0.25)
        np.testing.assert_allclose(con.tensor("L"), loss, rtol=1e-12)
        for name, want in (("Emb", e), ("W", w), ("U", u)):
            np.testing.assert_allclose(con.tensor(name), want, rtol=1e-10, atol=1e-12)
