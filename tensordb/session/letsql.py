"""LETs seen by plain SQL: a SQL statement of a script (or of a later call of the session) that
names a LET reads it as a relation, like a stored tensor's (one column per label of the LET's
left side, then ``value``; one row per nonzero element).

The LET is computed when the statement runs, from the tensors current then (as a statement
using it would compute it), held in memory and registered with DuckDB for that statement only:
nothing is stored, and no view is left behind. A view over a LET (``CREATE VIEW v AS SELECT ...
FROM Z``) would outlive it and is refused; ``CREATE TABLE t AS SELECT ... FROM Z`` copies it.

>>> import numpy as np, tensordb
>>> con = tensordb.connect()
>>> con.load("A", np.array([[1.0, 0.0], [2.0, 3.0]]))
>>> con.execute("LET Z[i,k] = A[i,j] * A[k,j]; SELECT i, k, value FROM Z ORDER BY i, k").fetchall()
[(0, 0, 1.0), (0, 1, 2.0), (1, 0, 2.0), (1, 1, 13.0)]
"""
from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa

from ..errors import ProgrammingError
from ..sqlfront import pyobjects
from ..storage.views import referenced_names

__all__ = ["let_relations"]


@contextlib.contextmanager
def let_relations(con, script: str, stmt):
    """Register, for the block, each LET of ``con``'s session that the SQL statement ``stmt``
    (of ``script``) names and that no table, view or tensor of that name hides."""
    lets = con.session.lets
    wanted = [lets[n] for n in referenced_names(stmt.text) if n in lets] if lets else []
    if not wanted:
        yield
        return
    hidden = {r[0] for r in con.store.query(
        "SELECT lower(table_name) FROM duckdb_tables() UNION ALL "
        "SELECT lower(view_name) FROM duckdb_views() WHERE NOT internal")}
    wanted = [let for let in wanted if let.name.lower() not in hidden]
    if wanted and _creates_view(stmt.text):
        raise ProgrammingError(f"a view over the LET '{wanted[0].name}' would outlive it: a LET "
                               "is seen by SQL only while a statement runs", statement=script,
                               span=stmt.span,
                               hint=f"CREATE TABLE ... AS SELECT ... FROM {wanted[0].name} copies "
                                    "its values; or store it (CREATE TENSOR)")
    scans = {let.name: _relation(con, let) for let in wanted}
    with pyobjects.scanning(con.store, scans):
        yield


def _creates_view(text: str) -> bool:
    words = text.split(None, 4)
    upper = [w.upper() for w in words[:4]]
    return bool(upper) and upper[0] == "CREATE" and "VIEW" in upper


def _relation(con, let) -> pa.Table:
    """The LET's value now, as the rows of a tensor's relation (nonzeros, label columns)."""
    from ..bind import bind_statements
    from ..dialect import parse
    labels = [l.name for l in let.stmt.target.labels] if let.stmt.target.labels else \
        [f"d{k}" for k in range(len(let.shape))]
    into = f"let_value_{let.name}"
    sub = f"[{','.join(f'd{k}' for k in range(len(let.shape)))}]" if let.shape else ""
    text = f"{into}{sub} = {let.name}{sub}"
    binder = bind_statements(con.store, dict(con.session.lets), [(text, parse(text)[0])])
    value = np.asarray(con.engine.compute(binder.eingraph(), into))
    if value.ndim == 0:  # a scalar: one row, unless it is 0 (absent, as a tensor's)
        return pa.table({"value": pa.array(value.reshape(1)[value.reshape(1) != 0])})
    coords = np.nonzero(value)
    columns = {name: pa.array(c.astype(np.int64)) for name, c in zip(labels, coords)}
    columns["value"] = pa.array(value[coords])
    return pa.table(columns)
