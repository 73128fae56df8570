"""The aggregates, in one table that every stage reads: the binder's names, the IR's checks, the
lowering's zero-filling and the kernels' reductions.

>>> [a.name for a in AGGREGATES.values()]
['sum', 'max', 'min', 'prod', 'argmax', 'argmin']
>>> AGGREGATES["prod"].identity, AGGREGATES["max"].identity
(1, None)
>>> int(AGGREGATES["prod"].ufunc.reduce([2, 3, 4]))
24
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import DataError

__all__ = ["AggregateFn", "AGGREGATES", "AGGS", "ARG_AGGS", "empty_aggregate"]


@dataclass(frozen=True)
class AggregateFn:
    """One aggregate. ``ufunc`` combines two partials (and reduces along an axis with NumPy);
    ``xp_reduce`` names the array-module function that reduces along several axes (CuPy has
    ``ufunc.reduce`` for a few ufuncs only); ``identity`` is its value over no element, None when
    it has none (numpy raises for an empty maximum: such an aggregate is refused).

    ARGMAX and ARGMIN (numpy.argmax: the first index of the maximum, or of the first NaN; int64)
    aggregate one label, which the optimizer never splits (``optimizer.candidates``): one kernel
    call sees the whole label and there are no partials to combine (``ufunc`` is None)."""

    name: str
    ufunc: np.ufunc | None
    xp_reduce: str
    identity: int | None

    @property
    def zero_is_identity(self) -> bool:
        """Whether a 0 leaves the aggregate unchanged: then a skipped (certainly 0) combination
        needs no place in it; otherwise it takes part (a PROD becomes 0, a MAX is at least 0)."""
        return self.identity == 0


AGGREGATES: dict[str, AggregateFn] = {a.name: a for a in (
    AggregateFn("sum", np.add, "sum", 0),
    AggregateFn("max", np.maximum, "amax", None),
    AggregateFn("min", np.minimum, "amin", None),
    AggregateFn("prod", np.multiply, "prod", 1),
    AggregateFn("argmax", None, "argmax", None),
    AggregateFn("argmin", None, "argmin", None),
)}
ARG_AGGS = ("argmax", "argmin")  # give an index (int64), over one label kept in one piece
AGGS = tuple(AGGREGATES)  # the names, in the order error hints list them


def empty_aggregate(agg: str, labels: Sequence[str], what: str) -> DataError:
    """The DataError of a MAX or MIN over a label of size 0 (as numpy, which raises for an empty
    maximum; an empty SUM is 0 and an empty PROD is 1)."""
    names = ", ".join(f"'{l}'" for l in labels)
    extreme = {"max": "maximum", "min": "minimum"}.get(agg, f"{agg.upper()}")
    return DataError(f"{what}: {agg.upper()} over label{'s' if len(labels) > 1 else ''} {names} "
                     f"of size 0: the {extreme} of no elements has no value",
                     hint="an empty SUM is 0 and an empty PROD is 1; MAX, MIN, ARGMAX and ARGMIN "
                          "need at least one element")
