"""The statements of a connection's session, once parsed: the Connection parses a script
(``dialect.parse``) and hands the statements here; blocks, transactions and the handlers of
the statements that are not einsums live here, and groups of einsum statements go back to the
Connection's pipeline (bind, optimize, lower, place, run, commit). The session's state (LETs,
the open BEGIN block) is a ``Session`` on the Connection (``con.session``).

>>> import numpy as np, tensordb
>>> con = tensordb.connect()
>>> con.load("A", np.arange(6.0).reshape(2, 3))
>>> con.execute("LET G[i,k] = A[i,j] * A[k,j]").message
'LET G: float64 (2, 2)'
>>> list(con.session.lets), con.pending_statements()
(['g'], None)
"""
from __future__ import annotations

from .script import Session, explain_format, explain_script, run_script

__all__ = ["Session", "run_script", "explain_script", "explain_format"]
