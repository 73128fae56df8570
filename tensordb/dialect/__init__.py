"""The tensor SQL dialect: text in, statements (ASTs with source spans) out. Nothing here runs
or binds a statement; the dialect imports only ``errors`` and its own modules.

    text --lexer.split--> statements --parser (lark grammar)--> tree --build--> AST (ast.py, spans)

The Connection parses a script with ``parse`` and drives the rest (tensordb/session/,
tensordb/bind/).

>>> [type(s).__name__ for s in parse("G[i,k] = A[i,j] * A[k,j]; SHOW TENSORS; SELECT 1")]
['AssignStmt', 'ShowTensorsStmt', 'SqlStmt']
"""
from __future__ import annotations

from .lexer import is_complete, split
from .parser import SETTINGS, parse

__all__ = ["parse", "split", "is_complete", "SETTINGS"]
