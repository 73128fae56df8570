"""The one table of aggregates (plan/aggregates.py) against NumPy: every stage reads its facts, so
each must be NumPy's; and the kernels and aggregations that read it, on NumPy and on the
array-module path CuPy takes."""
from __future__ import annotations

import types

import numpy as np
import pytest

from tensordb.exec.kernels import KernelSpec, combine
from tensordb.exec.tasks import finish_aggregate, start_aggregate
from tensordb.physical.plan import Aggregate
from tensordb.plan.aggregates import AGGREGATES, AGGS, ARG_AGGS
from tensordb.plan.ir import EinOp
from tensordb.plan.scalar import parse_join

RNG = np.random.default_rng(7)
DATA = RNG.integers(-5, 6, size=(3, 4, 5)).astype(np.float64)


# ARGMAX and ARGMIN have no partials to combine (their label is one piece): tests/ml/test_ml_aggregates.py
COMBINING = tuple(a for a in AGGS if a not in ARG_AGGS)


def test_the_names_are_the_dialects_aggregates():
    assert AGGS == ("sum", "max", "min", "prod", "argmax", "argmin") == \
        tuple(a.name for a in AGGREGATES.values())
    assert all(AGGREGATES[a].ufunc is None and AGGREGATES[a].identity is None for a in ARG_AGGS)


@pytest.mark.parametrize("name", COMBINING)
def test_identity_is_numpys_value_over_no_element(name):
    agg = AGGREGATES[name]
    empty = np.zeros((2, 0))
    if agg.identity is None:
        with pytest.raises(ValueError):
            agg.ufunc.reduce(empty, axis=1)
    else:
        np.testing.assert_array_equal(agg.ufunc.reduce(empty, axis=1), [agg.identity] * 2)


@pytest.mark.parametrize("name", COMBINING)
def test_the_reduction_over_several_axes_is_the_ufuncs(name):
    agg = AGGREGATES[name]
    np.testing.assert_array_equal(getattr(np, agg.xp_reduce)(DATA, axis=(0, 2)),
                                  agg.ufunc.reduce(DATA, axis=(0, 2)))


@pytest.mark.parametrize("name", COMBINING)
def test_zero_is_identity_says_whether_a_zero_changes_the_result(name):
    agg = AGGREGATES[name]
    with_zero = agg.ufunc(DATA, 0)
    assert agg.zero_is_identity == bool(np.array_equal(with_zero, DATA))


class _ArrayModule(types.ModuleType):
    """NumPy under another name: kernels and aggregations take the path they take for CuPy
    (``xp is not np``), which no GPU-less machine would run otherwise."""

    def __getattr__(self, name):
        return getattr(np, name)


XP = _ArrayModule("xp")


@pytest.mark.parametrize("name", COMBINING)
@pytest.mark.parametrize("xp", [np, XP], ids=["numpy", "array-module"])
def test_kernels_and_aggregations_reduce_as_numpy(name, xp):
    agg = AGGREGATES[name]
    a, b = DATA[0], DATA[1]
    op = EinOp.contraction("C", "i", [("A", "ij"), ("B", "ij")], {"i": 4, "j": 5},
                           join=parse_join("x0 + x1"), agg=name)
    got = KernelSpec(op, xp=xp)([a, b], [a.shape, b.shape], (4,))
    np.testing.assert_array_equal(got, agg.ufunc.reduce(a + b, axis=1))
    # Partials of one output tile combined, then the skipped (zero) combinations folded in.
    task = Aggregate(0, name, (1, 2), (4, 5), "float64", fill_zero=True)
    acc = start_aggregate(task, a.copy(), xp)
    acc = finish_aggregate(task, combine(name, acc, b, xp), xp)
    np.testing.assert_array_equal(acc, agg.ufunc.reduce(np.stack([a, b, np.zeros_like(a)]), axis=0))
