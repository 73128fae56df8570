"""The bind stage, one binder: ASTs of einsum statements, or the Python API's ``Graph``, + a
catalog snapshot -> the ``EinGraph`` the optimizer takes. Names are resolved, labels scoped and
sizes and dtypes checked once, by the front end that knows where each part was written (every
error with a caret: ``binder.py``/``group.py`` for statements, ``graph.py`` for Graphs, which
writes the call the user made as the source), into checked steps (``emit.BoundStep``) that
``emit.Emitter`` turns into operations without checking anything again.

The binder reads the dialect's AST (``dialect.ast``) and nothing else of the dialect: it never
parses text. The catalog is anything with ``has``, ``meta`` and ``list`` (the Store).

>>> import numpy as np, tensordb
>>> from tensordb.dialect import parse
>>> con = tensordb.connect()
>>> con.load("A", np.ones((2, 3)))
>>> text = "G[i,k] = A[i,j] * A[k,j]"
>>> binder = bind_statements(con.store, {}, [(text, parse(text)[0])])
>>> binder.outputs, [(s.into, s.out_labels, s.agg) for s in binder.steps]
(['G'], [('G', ('i', 'k'), 'sum')])
>>> [(op.output, op.agg_labels, op.out_shape) for op in binder.eingraph().ops]
[('G', ('j',), (2, 2))]
"""
from __future__ import annotations

from ..errors import Error, InternalError, Span, Warning
from .binder import AGGREGATES, SCALAR_FUNCTIONS
from .graph import bind_graph
from .group import GroupBinder, LetDef

__all__ = ["bind_statements", "bind_graph", "GroupBinder", "LetDef", "AGGREGATES",
           "SCALAR_FUNCTIONS", "internal_error"]


def bind_statements(store, lets: dict[str, LetDef], items) -> GroupBinder:
    """Bind ``items`` ((script, AssignStmt) pairs) into checked steps (``binder.eingraph()`` emits
    them); LET statements are added to ``lets``. Nothing runs. A statement followed by another that assigns the same name is bound
    as a temporary version; the last one is stored."""
    binder = GroupBinder(store, lets)
    last: dict[str, int] = {}
    for k, (_, stmt) in enumerate(items):
        if stmt.mode != "let":
            last[stmt.target.name.lower()] = k
    for k, (script, stmt) in enumerate(items):
        try:
            binder.add(script, stmt, last=last.get(stmt.target.name.lower()) in (k, None))
        except Error as exc:
            raise exc.with_source(script, stmt.span)
        except Warning:  # a tensordb warning the caller's filter made an error: as it is
            raise
        except Exception as exc:
            raise internal_error(exc, script, stmt.span) from exc
    return binder


def internal_error(exc: Exception, script: str, span: Span) -> Error:
    """A bug, or a library error nobody translated, as an error with the statement's caret."""
    return InternalError(f"internal error: {type(exc).__name__}: {exc}", statement=script, span=span)
