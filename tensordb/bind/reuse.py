"""A bound group kept for its repeat: a training step binds its statements (GRAD's backward
derived included) once, not every step.

Binding reads the session's LETs and, through the catalog, whether a name is a tensor, its
spelling, shape, dtype and dims, and whether it holds NaN or inf (``open(name).facts()``). A
group is kept under its statements (their source and place in it) and the LETs it started from,
with every answer the catalog gave. A repeat whose answers are all the same again (a training
step's new weights keep them) gets the same graph and pieces without binding, and the LETs the
group defines are defined again from its own statements. Any other question to the catalog (a
listing, for an error's hint) keeps nothing; a failed bind keeps nothing either.

>>> import numpy as np, tensordb
>>> from tensordb.dialect import parse
>>> from tensordb.bind import bind_statements
>>> con = tensordb.connect()
>>> con.load("A", np.ones((2, 3)))
>>> text = "LET T[i,j] = A[i,j] * 2; G[i,k] = SUM(T[i,j] * A[k,j])"
>>> items = [(text, s) for s in parse(text)]
>>> def bind(store, lets, items):
...     b = bind_statements(store, lets, items)
...     return b.eingraph(), dict(b.pieces)
>>> cache, lets = BoundCache(), {}
>>> g1, _ = cache.bind(con.store, lets, items, bind)  # no LETs yet: it defines T
>>> g2, _ = cache.bind(con.store, lets, items, bind)  # from T: bound, kept
>>> g3, _ = cache.bind(con.store, lets, items, bind)  # the same again: reused
>>> g2 is g3, g1 is g2, g1 == g3, cache.hits, sorted(lets)
(True, False, True, 1, ['t'])
"""
from __future__ import annotations

from collections import OrderedDict

from ..errors import Error
from .group import LetDef

__all__ = ["BoundCache"]


def _meta(m) -> tuple:
    """What the binder reads of a tensor's catalog entry (not its version). The dtype by its
    code (``'<f4'``): ``str`` of a NumPy dtype is Python code, and a repeated statement
    compares these for every tensor it names."""
    return (m.name, tuple(m.shape), m.dtype.str, tuple(m.dims), m.grid)


class _Recorder:
    """The catalog as the binder sees it, every answer written down once: a script of 60
    statements over two tensors asks about them 2,040 times, and a repeat checks each
    answer again."""

    def __init__(self, store) -> None:
        self._store = store
        self._answers: dict[tuple[str, str], object] = {}
        self.keepable = True

    @property
    def answers(self) -> list[tuple[str, str, object]]:
        return [(q, name, a) for (q, name), a in self._answers.items()]

    def _note(self, question: str, name: str, answer) -> None:
        key = (question, name)
        if key not in self._answers:
            self._answers[key] = answer
        elif self._answers[key] != answer:  # the catalog changed while binding: keep nothing
            self.keepable = False

    def has(self, name):
        out = self._store.has(name)
        self._note("has", name, out)
        return out

    def meta(self, name):
        m = self._store.meta(name)
        self._note("meta", name, _meta(m))
        return m

    def open(self, name):
        reader = self._store.open(name)
        self._note("open", name, reader.facts())
        return reader

    def __getattr__(self, attr):  # a question not written down: nothing to check it by
        self.keepable = False
        return getattr(self._store, attr)


def _answer(store, question: str, name: str):
    if question == "has":
        return store.has(name)
    if question == "meta":
        return _meta(store.meta(name))
    return store.open(name).facts()


def _lets_key(lets) -> tuple:
    return tuple(sorted((k, d.script, d.stmt.span.start, d.stmt.span.end, tuple(d.shape),
                         str(d.dtype)) for k, d in lets.items()))


class BoundCache:
    """The last ``size`` bound groups (see the module's docstring); ``hits`` counts reuses."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self.hits = 0
        self._kept: OrderedDict = OrderedDict()

    def clear(self) -> None:
        self._kept.clear()

    def bind(self, store, lets: dict, items, bind):
        """``bind(store, lets, items)`` -> (graph, pieces), or what it gave before for the same
        statements, LETs and catalog answers. ``lets`` ends as ``bind`` leaves it."""
        # The statement as bound, not only its text: EXPLAIN binds a LET's text as an
        # assignment (``mode``), which must not stand in for the LET, nor the LET for it.
        key = (tuple((script, stmt.span.start, stmt.span.end, type(stmt).__name__,
                      getattr(stmt, "mode", None), getattr(stmt, "params", None))
                     for script, stmt in items),
               _lets_key(lets))
        kept = self._kept.get(key)
        if kept is not None and self._still(store, kept[0]):
            answers, result, defined, dropped = kept
            for name in dropped:
                lets.pop(name, None)
            for name, k, shape, dtype in defined:
                lets[name] = LetDef(items[k][0], items[k][1], shape, dtype)
            self._kept.move_to_end(key)
            self.hits += 1
            graph, pieces = result
            return graph, dict(pieces)
        before = dict(lets)
        recorder = _Recorder(store)
        graph, pieces = bind(recorder, lets, items)
        where = {id(stmt): k for k, (_, stmt) in enumerate(items)}
        defined = []
        for name, d in lets.items():
            if before.get(name) is d:
                continue
            if id(d.stmt) not in where:  # a LET from elsewhere: nothing to define it again by
                recorder.keepable = False
                break
            defined.append((name, where[id(d.stmt)], d.shape, d.dtype))
        dropped = [name for name in before if name not in lets]
        if recorder.keepable:
            self._kept[key] = (recorder.answers, (graph, dict(pieces)), defined, dropped)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return graph, pieces

    @staticmethod
    def _still(store, answers) -> bool:
        try:
            return all(_answer(store, q, name) == a for q, name, a in answers)
        except Error:  # a tensor gone meanwhile: bind again, and let the binder say so
            return False
