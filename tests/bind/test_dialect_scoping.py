"""Labels local to an aggregate call (issue 14, item 4): a label used only inside aggregate calls
belongs to each of them, so a one-line softmax and a one-line layer norm work and equal numpy;
the cases that stay errors keep their carets and change nothing."""
from __future__ import annotations

import numpy as np
import pytest

from tensordb.errors import BinderError

ROWS, COLS = 37, 53


@pytest.fixture
def db(disk_con):
    rng = np.random.default_rng(14)
    # Tiled, so that every temporary step runs over several tiles and aggregates across them.
    disk_con.load("X", rng.standard_normal((ROWS, COLS)) * 4, tile=(16, 16))
    disk_con.load("Y", rng.standard_normal((ROWS, COLS)), tile=(16, 16))
    disk_con.load("V", rng.standard_normal((COLS, 7)))
    return disk_con


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_one_line_softmax_equals_numpy(db):
    X = db.tensor("X")
    r = db.execute("S[i,j] = EXP(X[i,j] - MAX(X[i,k])) / SUM(EXP(X[i,k] - MAX(X[i,m])))")
    np.testing.assert_allclose(r.tensor(), softmax(X), rtol=1e-12, atol=0)
    assert {t["name"] for t in db.tensors()} == {"X", "Y", "V", "S"}  # no temporaries stored


def test_one_line_layer_norm_equals_numpy(db):
    X = db.tensor("X")
    n = float(COLS)
    db.execute(f"LN[i,j] = (X[i,j] - SUM(X[i,k]) / {n}) / "
               f"SQRT(SUM(SQUARE(X[i,k] - SUM(X[i,m]) / {n})) / {n} + 1e-5)")
    mean = X.mean(axis=1, keepdims=True)
    expect = (X - mean) / np.sqrt(((X - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(db.tensor("LN"), expect, rtol=1e-10, atol=1e-12)


def test_sibling_aggregates_each_own_a_shared_label(db):
    X, Y = db.tensor("X"), db.tensor("Y")
    db.execute("R[i] = MAX(X[i,k]) * SUM(Y[i,k]) - MIN(X[i,k])")
    np.testing.assert_allclose(db.tensor("R"), X.max(1) * Y.sum(1) - X.min(1), rtol=1e-12)


def test_label_in_a_term_and_in_aggregates_of_that_term(db):
    X, Y, V = db.tensor("X"), db.tensor("Y"), db.tensor("V")
    # k is used outside the MAX (in Y[i,k] * V[k,f]): the term sums over k and MAX keeps it;
    # m is used only inside the MAX: the MAX aggregates it.
    db.execute("Z[i,f] = Y[i,k] * V[k,f] * MAX(X[i,m]) + 1")
    expect = (Y @ V) * X.max(1)[:, None] + 1
    np.testing.assert_allclose(db.tensor("Z"), expect, rtol=1e-12)


@pytest.mark.parametrize("text, at, words", [
    # k is the SUM's (used outside the MAX), so the MAX has nothing of its own.
    ("E[i] = SUM(X[i,k] * MAX(Y[i,k]))", "MAX(", "also used outside it"),
    # k is used only inside MAX and MIN: each owns it, and the SUM around them has nothing left.
    ("E[i] = SUM(MAX(X[i,k]) + MIN(X[i,k]))", "SUM(", "'k' is aggregated by the aggregate calls"),
    # Used outside the MAX in the same term: the implicit SUM of the term owns k.
    ("E[i] = X[i,k] * MAX(Y[i,k])", "MAX(", "also used outside it"),
    ("E[i,k] = X[i,k] - MAX(Y[i,k])", "MAX(", "every label of its argument is on the left"),
    # The inner SUM: k belongs to the outer SUM, f is on the left.
    ("E[i,f] = SUM(X[i,k] * SUM(Y[i,k] * V[k,f]))", "SUM(Y", "also used outside it"),
    # Softmax with the inner MAX reusing the SUM's k: the SUM uses k itself, so the MAX keeps it.
    ("S[i,j] = EXP(X[i,j] - MAX(X[i,k])) / SUM(EXP(X[i,k] - MAX(X[i,k])))", "MAX(X[i,k])))",
     "also used outside it"),
])
def test_ambiguous_cases_stay_errors_with_carets(db, snapshot, text, at, words):
    before = snapshot(db)
    with pytest.raises(BinderError) as info:
        db.execute(text)
    err = info.value
    assert "aggregates no label" in err.message and words in err.message
    # The caret sits under the call that has nothing to aggregate.
    assert err.span.start == text.index(at) and text[err.span.start:err.span.end] == at[:3]
    lines = str(err).splitlines()
    [line] = [i for i, l in enumerate(lines) if l.startswith("LINE 1: ")]
    col = lines[line + 1].index("^")  # long lines are shown in a window around the caret
    assert lines[line][col:col + 3] == at[:3] and lines[line + 1][col:] == "^~~"
    assert snapshot(db) == before
