"""After a group of statements ran: a ``NonFiniteWarning`` for each stored result that holds inf
or NaN although its stored inputs are finite, when its computation passes through EXP (SOFTMAX
and LOGSUMEXP are stable; a bare EXP of more than about 709 is inf in float64, 88 in float32).

The warning names the statement whose EXP overflowed (a caret at the EXP call), or, when that
statement is not one of the group's (a LET defined earlier), the statement that stored the result.
"""
from __future__ import annotations

import warnings

from ..dialect import ast as A
from ..errors import NonFiniteWarning, warning_text
from ..plan.ir import EinGraph
from ..plan.scalar import Call

__all__ = ["warn_nonfinite"]

_EXPS = ("exp", "softmax", "logsumexp")


def _has_exp(expr) -> bool:
    return isinstance(expr, Call) and (expr.fn == "exp" or any(_has_exp(a) for a in expr.args))


def warn_nonfinite(graph: EinGraph, nonfinite, items, finite) -> None:
    """``nonfinite``: the graph's outputs holding NaN or inf; ``items``: the group's (script,
    statement) pairs; ``finite(name)``: whether a stored input is free of NaN and inf."""
    found: dict = {}  # (script, span) of the EXP -> the results it made inf or NaN
    for output in nonfinite:
        upstream, exps = {output}, []
        for op in reversed(graph.ops):
            if op.output in upstream:
                upstream |= {o.tensor for o in op.inputs}
                if _has_exp(op.join):
                    exps.append(op)
        if not exps or not all(finite(t.name) for t in graph.inputs if t.name in upstream):
            continue
        stored = graph.stored_name(output)
        where = _statement(items, exps[-1].output.name) or _statement(items, stored)
        found.setdefault(where, []).append(stored)
    for where, names in found.items():
        script, span = where if where is not None else (None, None)
        which = f"{names[0]} holds" if len(names) == 1 else f"{', '.join(names)} hold"
        warnings.warn(NonFiniteWarning(warning_text(
            f"{which} inf or NaN: an EXP in the computation overflowed (the stored inputs are "
            "finite)", script, span,
            hint="shift the argument (EXP(x - MAX(x))), or use SOFTMAX or LOGSUMEXP, which are "
                 "stable; a smaller learning rate if the weights grew")), stacklevel=4)


def _statement(items, name: str):
    """(script, span) of the last statement of ``items`` assigning ``name``: at its EXP call
    when it has one, else its target."""
    for script, stmt in reversed(items):
        if not isinstance(stmt, A.AssignStmt) or stmt.target.name.lower() != name.lower():
            continue
        call = next((n for n in A.walk(stmt.expr) if isinstance(n, A.Call) and n.fn in _EXPS),
                    None)
        return script, call.span if call is not None else stmt.target.span
    return None
