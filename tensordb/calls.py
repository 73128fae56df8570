"""One call at a time on a connection.

A connection's calls share its state: the open transaction, the plan and binding caches, the
LETs and DuckDB's connection. DB-API's ``threadsafety = 1`` says threads should not share one;
those that do anyway wait their turn here, so each call sees the connection as the one before
left it. (Without this a load from a second thread joined the transaction of a call running in
the first, and was rolled back with it after it had returned.) The lock is re-entrant: a call
may make others on its own thread (a callback of ``execute_script``, ``commit``).
"""
from __future__ import annotations

import functools

__all__ = ["one_at_a_time"]


def one_at_a_time(method):
    """Run ``method`` holding its connection's call lock (``self._call_lock``)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._call_lock:
            return method(self, *args, **kwargs)
    return call
