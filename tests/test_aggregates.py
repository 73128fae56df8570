"""The one table of aggregates (plan/aggregates.py) against NumPy: every stage reads its facts, so
each must be NumPy's."""
from __future__ import annotations

import numpy as np
import pytest

from tensordb.plan.aggregates import AGGREGATES, AGGS

RNG = np.random.default_rng(7)
DATA = RNG.integers(-5, 6, size=(3, 4, 5)).astype(np.float64)


def test_the_names_are_the_dialects_aggregates():
    assert AGGS == ("sum", "max", "min", "prod") == tuple(a.name for a in AGGREGATES.values())


@pytest.mark.parametrize("name", AGGS)
def test_identity_is_numpys_value_over_no_element(name):
    agg = AGGREGATES[name]
    empty = np.zeros((2, 0))
    if agg.identity is None:
        with pytest.raises(ValueError):
            agg.ufunc.reduce(empty, axis=1)
    else:
        np.testing.assert_array_equal(agg.ufunc.reduce(empty, axis=1), [agg.identity] * 2)


@pytest.mark.parametrize("name", AGGS)
def test_the_reduction_over_several_axes_is_the_ufuncs(name):
    agg = AGGREGATES[name]
    np.testing.assert_array_equal(getattr(np, agg.xp_reduce)(DATA, axis=(0, 2)),
                                  agg.ufunc.reduce(DATA, axis=(0, 2)))


@pytest.mark.parametrize("name", AGGS)
def test_zero_is_identity_says_whether_a_zero_changes_the_result(name):
    agg = AGGREGATES[name]
    with_zero = agg.ufunc(DATA, 0)
    assert agg.zero_is_identity == bool(np.array_equal(with_zero, DATA))
