"""sql/train_mlp.sql through the command line (a subprocess): the loss it prints decreases and
matches the same training written by hand in numpy, and the trained weights match too."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

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
