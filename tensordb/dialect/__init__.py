"""The tensor SQL dialect: statements in, results out.

    text --lexer.split--> statements --parser--> AST (spans) --binder/group--> plan.builder.Graph
         --executor--> Connection.run / storage / DuckDB --> Result

>>> import numpy as np, tensordb
>>> con = tensordb.connect()
>>> con.load("A", np.arange(6.0).reshape(2, 3))
>>> execute(con, "G[i,k] = A[i,j] * A[k,j]").tensor()
array([[ 5., 14.],
       [14., 50.]])
"""
from __future__ import annotations

from .executor import explain_script, run_script
from .lexer import is_complete, split
from .parser import parse

__all__ = ["execute", "explain", "run_script", "parse", "split", "is_complete"]


def execute(con, sql: str, parameters=None):
    """Run one or more statements; returns the Result of the last one (an empty status result
    when there is none)."""
    from ..result import Result
    results = run_script(con, sql, parameters)
    return results[-1] if results else Result.status("OK", sql)


def explain(con, sql: str, format: str = "text", analyze: bool = False) -> str:
    """The plan of the einsum statements in ``sql`` as text or JSON (``Connection.explain``)."""
    return explain_script(con, sql, format=format, analyze=analyze)
