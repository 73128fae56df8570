"""tensordb's warnings (tensordb.Warning, a Python warning category): a GRAD that is zeros by
construction (GradientWarning) and an EXP that overflowed into a stored result
(NonFiniteWarning), each naming the statement with a caret; in the CLI, ``warning:`` lines."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb.plan.builder import Graph

ROOT = Path(__file__).resolve().parents[2]


def run(con, text, params=None):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error")  # numpy's warnings stay errors
        warnings.simplefilter("always", tensordb.Warning)
        con.execute(text, params)
    return [(type(w.message), str(w.message)) for w in seen]


def caret_at(text: str, message: str) -> str:
    """What the caret points at, in the LINE shown (which may be cut with '...')."""
    lines = message.splitlines()
    src = next(l for l in lines if l.startswith("LINE"))
    return src[lines[lines.index(src) + 1].index("^"):]


@pytest.fixture
def con():
    with tensordb.connect() as c:
        c.load("W", np.array([0.5, -1.0, 2.0]))
        c.load("A", np.ones((2, 3)))
        yield c


@pytest.mark.parametrize("text, match, at", [
    ("L = SUM(A[i,j] * A[i,j]); g = GRAD(L, W)", "GRAD(L, W) is zeros: 'L' does not read 'W'",
     "W)"),
    ("L = SUM(W[i] * W[i]); W[i] = W[i] - 1; g = GRAD(L, W)",
     "GRAD(L, W) is zeros: 'W' was assigned after 'L' was computed", "W)"),
    ("H[i] = W[i] * 2; L = SUM(A[i,j]); g = GRAD(L, H)", "'L' does not read 'H'", "H)"),
])
def test_grad_of_a_tensor_the_loss_does_not_depend_on_warns(con, text, match, at):
    seen = run(con, text)
    assert [c for c, _ in seen] == [tensordb.GradientWarning]
    assert match in seen[0][1]
    assert caret_at(text, seen[0][1]).startswith(at)
    assert not con.tensor("g").any()  # still zeros, as documented


@pytest.mark.parametrize("text", [
    "L = SUM(W[i] * W[i]); g = GRAD(L, W); W[i] = W[i] - 0.1 * g[i]",
    "LET L2 = SUM(W[i] * W[i]); LET g2 = GRAD(L2, W); W[i] = W[i] - 0.1 * g2[i]",
    "H[i] = W[i] * 2; L = SUM(H[i] * H[i]); g = GRAD(L, H)",
    "L = SUM(A[i 0:1, j] * W[j]); g = GRAD(L, A)",
])
def test_grads_the_loss_depends_on_do_not_warn(con, text):
    assert run(con, text) == []


def test_python_api_grad_warns(con):
    g = Graph().einsum("ij,ij->", "A", "A", into="L").grad("L", ["W"])
    with pytest.warns(tensordb.GradientWarning, match="grad\\('L', 'W'\\) is zeros"):
        con.run(g)


def test_warnings_made_errors_fail_the_statement_and_change_nothing(con):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tensordb.Warning)
        with pytest.raises(tensordb.GradientWarning):
            con.execute("L = SUM(A[i,j]); g = GRAD(L, W)")
    assert not con.store.has("g") and not con.store.has("L")


def test_exp_overflow_warns_naming_the_exp(con):
    con.load("X", np.array([[1.0, 800.0], [2.0, 3.0]]))
    text = "P[i,j] = X[i,j] + 1; Q[i] = SUM(EXP(X[i,j]))"
    seen = run(con, text)
    assert [c for c, _ in seen] == [tensordb.NonFiniteWarning]
    assert "Q holds inf or NaN" in seen[0][1]
    assert caret_at(text, seen[0][1]).startswith("EXP(X[i,j])")
    assert np.isinf(con.tensor("Q")[0])  # numpy's answer, stored all the same


def test_an_overflowing_training_step_warns(con):
    """The weights turn inf after a step whose loss's EXP overflowed: the warning says so."""
    con.load("X", np.array([[1.0, -800.0, 0.0], [2.0, 3.0, 1.0]]))
    seen = run(con, "L = SUM(EXP(SUM(X[b,d] * W[d]))); LET g = GRAD(L, W); "
                    "W[d] = W[d] - 0.1 * g[d]")
    assert {c for c, _ in seen} == {tensordb.NonFiniteWarning}
    assert any("W hold" in m or "W holds" in m for _, m in seen)
    assert not np.isfinite(con.tensor("W")).all()


@pytest.mark.parametrize("text", [
    "S[i,j] = SOFTMAX(X[i,j], j)",           # stable
    "S[i] = LOGSUMEXP(X[i,j])",              # stable
    "S[i,j] = EXP(X[i,j] - 1000)",           # finite
    "S[i,j] = EXP(Y[i,j])",                  # the input holds inf already
    "S[i,j] = LOG(X[i,j] - 1)",              # -inf, but no EXP
])
def test_no_warning_without_an_exp_overflow(con, text):
    con.load("X", np.array([[1.0, 800.0], [2.0, 3.0]]))
    con.load("Y", np.array([[1.0, np.inf], [2.0, 3.0]]))
    with np.errstate(all="ignore"):
        assert [c for c, _ in run(con, text) if issubclass(c, tensordb.Warning)] == []


def test_cli_prints_warnings(tmp_path):
    env = {**os.environ, "TENSORDB_DEBUG": "",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    text = ("CREATE TENSOR W (d 3) FLOAT64; L = SUM(W[i] * W[i]); W[i] = W[i] + 1; "
            "g = GRAD(L, W)")
    proc = subprocess.run([sys.executable, "-m", "tensordb", str(tmp_path / "w.tdb"), "-c", text],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: GRAD(L, W) is zeros: 'W' was assigned after 'L'")
    assert "LINE 1:" in proc.stderr and "^" in proc.stderr
