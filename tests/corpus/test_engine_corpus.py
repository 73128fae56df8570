"""The correctness corpus: hundreds of random extended einsums, under random tilings, stored
tilings and absent tiles, for every registered tiling strategy, checked against the numpy oracle
of tests/fuzz_oracle.py (the fuzz test's, written without tensordb).
``TENSORDB_TEST_EXECUTOR=gpu`` runs it on the GPU executor (CuPy)."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from conftest import corpus_executor
from tensordb.optimizer import STRATEGIES

from tests.fuzz_oracle import Answer, Case, Operand, answer, compare

N_CASES = 160
POOL = "abcdef"
X0, X1, X2 = ("in", 0), ("in", 1), ("in", 2)
# Each join as the engine reads it (the Python API's syntax) and as the oracle evaluates it (an
# expression tree of tests/fuzz_oracle.py, written by hand: nothing of the engine's parser).
JOINS = {
    1: {"x0": X0, "exp(x0)": ("exp", X0), "relu(x0)": ("relu", X0), "x0 * x0": ("*", X0, X0),
        "-x0": ("neg", X0), "abs(x0) + 1": ("+", ("abs", X0), ("lit", 1)),
        "2 * x0": ("*", ("lit", 2), X0)},
    2: {"x0 * x1": ("*", X0, X1), "x0 + x1": ("+", X0, X1), "x0 - x1": ("-", X0, X1),
        "max(x0, x1)": ("max", X0, X1), "relu(x0 * x1)": ("relu", ("*", X0, X1)),
        "x0 + 2 * x1": ("+", X0, ("*", ("lit", 2), X1)),
        "min(x0, x1) * 3": ("*", ("min", X0, X1), ("lit", 3))},
    3: {"x0 * x1 * x2": ("*", ("*", X0, X1), X2), "x0 + x1 + x2": ("+", ("+", X0, X1), X2),
        "max(x0, x1) + x2": ("+", ("max", X0, X1), X2),
        "x0 * x1 + x2": ("+", ("*", X0, X1), X2)},
}
INT_SAFE = {"x0", "relu(x0)", "x0 * x0", "-x0", "abs(x0) + 1", "2 * x0", "x0 * x1", "x0 + x1",
            "x0 - x1", "max(x0, x1)", "relu(x0 * x1)", "x0 + 2 * x1", "min(x0, x1) * 3",
            "x0 * x1 * x2", "x0 + x1 + x2", "max(x0, x1) + x2", "x0 * x1 + x2"}


def oracle(operands, out, arrays, join, agg) -> Answer:
    """numpy's answer to a case of ``make_case`` (tests/fuzz_oracle.py); ``join`` None is the
    product of every operand, in order."""
    n = len(arrays)
    if join is None:
        tree = ("in", 0)
        for k in range(1, n):
            tree = ("*", tree, ("in", k))
    else:
        tree = JOINS[n][join]
    ops = [Operand(f"x{k}", tuple(ls), a) for k, ((a, _), ls) in enumerate(zip(arrays, operands))]
    return answer(Case(tuple(out), ops, tree, agg))


def assert_matches(got: np.ndarray, want: Answer, rtol32: float = 1e-4,
                   rtol64: float = 1e-9) -> None:
    """``got`` is numpy's answer: its dtype, shape, NaNs and infinities, each float element
    within the oracle's rounding bound and within ``rtol`` of the largest (ints exactly)."""
    assert want.error is None, want.why
    problem = compare(got, want)
    assert problem is None, problem
    if np.issubdtype(got.dtype, np.floating):
        tol = rtol32 if got.dtype == np.float32 else rtol64
        value = want.value
        np.testing.assert_allclose(got, value, rtol=tol,
                                   atol=tol * max(1.0, float(np.abs(value).max(initial=0))))
    else:
        np.testing.assert_array_equal(got, want.value)


def make_case(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 2, 2, 2, 3, 3, 4, 5]))
    sizes = {l: int(rng.integers(1, 8)) for l in POOL}
    operands = []
    for _ in range(n):
        rank = int(rng.integers(0, 4))
        labels = [str(l) for l in rng.choice(list(POOL[:5]), size=rank)]
        operands.append(labels)
    labels = list(dict.fromkeys(l for ls in operands for l in ls))
    k = int(rng.integers(0, len(labels) + 1))
    out = [str(l) for l in rng.permutation(labels)[:k]]
    dtype = str(rng.choice(["float64", "float64", "float32", "int64", "int32"]))
    product = n > 3 or rng.random() < 0.45
    if product:
        join, agg = None, "sum"
    else:
        options = list(JOINS[n])
        if dtype.startswith("int"):
            options = [j for j in options if j in INT_SAFE]
        join = str(rng.choice(options))
        agg = str(rng.choice(["sum", "max", "min", "prod"]))
    arrays = []
    for ls in operands:
        shape = tuple(sizes[l] for l in ls)
        if dtype.startswith("int"):
            a = rng.integers(-3, 4, size=shape).astype(dtype)
        elif agg == "prod":
            a = rng.uniform(0.5, 1.5, size=shape).astype(dtype)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        tile = tuple(int(rng.integers(1, s + 1)) for s in shape)
        if shape and rng.random() < 0.5:  # knock out random tiles: absent (all-zero) tiles
            for idx in np.ndindex(*[-(-s // t) for s, t in zip(shape, tile)]):
                if rng.random() < 0.35:
                    a[tuple(slice(i * t, (i + 1) * t) for i, t in zip(idx, tile))] = 0
        arrays.append((a, tile))
    pins = {l: int(rng.integers(1, sizes[l] + 1)) for l in labels if rng.random() < 0.5}
    return operands, out, arrays, join, agg, pins, dtype


@pytest.fixture(scope="module")
def con():
    with tensordb.connect(workers=3, executor=corpus_executor()) as c:
        yield c


def _strategies():
    return sorted(STRATEGIES)


@pytest.mark.parametrize("strategy", _strategies())
@pytest.mark.parametrize("seed", range(N_CASES))
def test_random_einsum_matches_oracle(con, seed, strategy):
    run_case(con, seed, strategy)


def run_case(con, seed: int, strategy: str) -> None:
    """Case ``seed`` of the corpus, under tiling ``strategy``, on ``con``, against the oracle;
    its tensors are dropped after."""
    operands, out, arrays, join, agg, pins, dtype = make_case(seed)
    con.set("tiling", strategy)
    names = []
    for k, (a, tile) in enumerate(arrays):
        name = f"in{seed}_{k}"
        con.load(name, a, tile=tile or None, replace=True)
        names.append(name)
    into = f"out{seed}"
    g = tensordb.Graph().op(into, out, list(zip(names, operands)), join=join, agg=agg, pieces=pins)
    try:
        con.run(g, replace=True)
        got = con.tensor(into)
    finally:
        for name in names + [into]:
            con.drop(name, if_exists=True)
    assert_matches(got, oracle(operands, out, arrays, join, agg))


NUMPY_SPECS = [
    ("ij,jk->ik", [(5, 4), (4, 3)]),
    ("ij,jk", [(5, 4), (4, 3)]),
    ("ii->i", [(6, 6)]),
    ("ii", [(6, 6)]),
    ("ij->ji", [(3, 7)]),
    ("ij->", [(3, 7)]),
    ("i,i->", [(9,), (9,)]),
    ("i,j->ij", [(4,), (5,)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("...ij,...jk->...ik", [(1, 4, 5), (3, 5, 2)]),
    ("...i,...i", [(2, 3, 4), (4,)]),
    ("ij,jk,kl->il", [(10, 30), (30, 5), (5, 20)]),
    ("ij,jk,kl,lm,mn->in", [(6, 5), (5, 7), (7, 4), (4, 8), (8, 3)]),
    ("bdik,acaj,ikab,ajac,ikbd->", [(2, 3, 4, 2), (2, 3, 2, 3), (4, 2, 2, 2), (2, 3, 2, 3), (4, 2, 2, 3)]),
    ("iij,jk->ik", [(4, 4, 3), (3, 5)]),
]


@pytest.mark.parametrize("spec,shapes", NUMPY_SPECS)
def test_numpy_spec_semantics(con, spec, shapes):
    rng = np.random.default_rng(len(spec))
    arrays = [rng.standard_normal(s) for s in shapes]
    names = [f"np{i}" for i in range(len(arrays))]
    for n, a in zip(names, arrays):
        con.load(n, a, replace=True)
    try:
        con.einsum(spec, *names, into="npout", replace=True)
        got = con.tensor("npout")
    finally:
        for n in names + ["npout"]:
            con.drop(n, if_exists=True)
    np.testing.assert_allclose(got, np.einsum(spec, *arrays), rtol=1e-9, atol=1e-9)
