"""The straight-line run's statistics of a small stored tile (``fastrows.facts``) against
storage's ``tile_stats``: the same nonzero count, NaN/inf flag and CRC-32."""
from __future__ import annotations

import numpy as np
import pytest

from tensordb.exec import fastrows
from tensordb.storage.tilestats import tile_stats

RNG = np.random.default_rng(7)


def _cases():
    a = RNG.standard_normal((64, 10))
    yield "normal", a
    yield "scalar", np.array(0.25)
    yield "zero scalar", np.array(0.0)
    yield "-0.0", np.array([0.0, -0.0, 1.0])
    for v in (np.nan, np.inf, -np.inf, -0.0):
        yield f"{v} scalar", np.array(v)
        yield f"{v} float32 scalar", np.array(v, dtype=np.float32)
    yield "float16 scalar", np.array(65504, dtype=np.float16)
    b = RNG.standard_normal(4096)
    b[::7] = 0.0
    b[1::7] = -0.0
    b[2] = np.nan
    yield "zeros, -0.0 and NaN", b
    yield "past count_nonzero's bound", np.concatenate([b, [0.0, np.nan]])
    yield "empty", np.zeros((0, 3))
    for special in (np.nan, np.inf, -np.inf):
        b = a.copy()
        b[3, 4] = special
        yield f"{special}", b
    yield "overflowing sum", np.full(8, 1e308)  # finite elements whose sum is inf
    yield "float32", RNG.standard_normal((5, 7)).astype(np.float32)
    yield "float16 with inf", np.array([1.0, np.inf], dtype=np.float16)
    yield "ints", np.arange(-3, 3)
    yield "bools", np.array([True, False, True])
    yield "large", RNG.standard_normal(40000)


@pytest.mark.parametrize("name,a", list(_cases()), ids=[n for n, _ in _cases()])
def test_small_tile_facts_are_tile_stats(name, a):
    with np.errstate(all="ignore"):  # as the run calls it
        got = fastrows.facts(a)
    want = tile_stats(a)
    assert got == want
    assert [type(v) for v in got] == [type(v) for v in want]
