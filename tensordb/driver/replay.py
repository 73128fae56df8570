"""The replay of a repeated statement group (a training step): the same statements, executed
again on the same connection with nothing changed since its own last call but what that call
committed, run the prepared plan of the last call again without asking the prepared-statement
cache for it (cache.py: the group's key built and hashed, every answer and the plan's key
checked, the sparse fusion worked out again).

What the last call left is written down after its commit (``Replay.remember``): the
statements (by identity: the parser and ``bind_parameters`` hand out the very statement
objects again for the same text and parameter values), the LETs it left, the planning target,
the store's epoch just after its commit, and the bound graph with its decomposition and plan
(without readers). A call replays (``Replay.prepare``) only when all of these are the same
again: another connection or process writing the catalog, plain SQL, DDL, a rollback, a
changed setting or a new parameter value (other statement objects) each take the ordinary path.
What the last call's commit itself changed is checked as the cache would check it: for each
replaced tensor the plan reads, its fill, grid and per tile its NaN/inf flag, whether every
element is nonzero and its format (what the plan's layout key and the sparse fusion read),
against the version the plan was made for; and once, at the first call after the remembered
one, every answer binding read (``Snapshot.holds``). A replayed call's commit writes the same
catalog entries again but for the values, so only the value facts are checked at each replay.
A group that reads a slice or gather of a tensor it replaces is not replayed, nor one that
replaces one of its own inputs where a sparse kernel computes an operation of its plan
(``output_nnz``: its cuts may rest on a sparse matrix's row profile, and the estimates on the
inputs' entries); a sparse product into a tensor it does not read (``w[i] = SUM(G[i,j] *
v[j])`` again and again) reads the very versions its plan was made for, and is (since
spmv40b: its prepare was a tenth of the issue's 1 ms SpMV statement). The run and the commit are the ordinary ones
(``Prepared.run``): atomic, checked, counted as a hit of the cache.
"""
from __future__ import annotations

from .snapshot import Snapshot

__all__ = ["Replay"]


def lets_key(lets: dict) -> tuple:
    """The LETs as the prepared-statement cache's key sees them (cache.statements_key)."""
    return tuple(sorted((k, d.script, d.stmt.span.start, d.stmt.span.end, tuple(d.shape),
                         str(d.dtype)) for k, d in lets.items()))


class Replay:
    """The last statement group a connection ran, kept to be run again (module docstring)."""

    __slots__ = ("_last", "_replaying", "enabled", "replays")

    def __init__(self) -> None:
        self._last = self._replaying = None
        self.enabled = True  # False: every call takes the ordinary path (tests compare the two)
        self.replays = 0  # calls replayed

    def forget(self) -> None:
        """Replay nothing (until ``remember``): a call is under way, or the cache was cleared."""
        self._last = None

    def remember_again(self, store) -> None:
        """After the commit of a replayed call: the same group, replayable at the new epoch."""
        last, self._replaying = self._replaying, None
        if last is not None and last[3] is store:
            self._last = last[:4] + (store.epoch,) + last[5:]

    def remember(self, items, lets_before: tuple, lets: dict, prepared, bound, target,
                 store, bare) -> None:
        """After a group's commit: keep what its next call needs to replay it. ``lets_before``:
        ``lets_key`` of the LETs it started from; ``bound``: the cache's entry its graph came
        from (``PreparedCache.last_bound``); ``bare()``: its plan without readers (no replaced
        payload stays mapped by a kept plan)."""
        self._last = self._replaying = None
        graph, decomp, plan = prepared.graph, prepared.decomp, prepared.plan
        if graph is None or bound is None or bound.graph is not graph or \
                lets_key(lets) != lets_before:
            return  # nothing kept to check it by, or LETs that changed
        names = [t.name for t in graph.inputs]
        written = {(o.store_name or o.name).lower() for o in plan.outputs.values() if o.stored}
        replaced = [n for n in names if type(n) is str and n.lower() in written]
        if len(replaced) != sum(1 for n in names if _reads(n, written)):
            return  # a slice or gather of a tensor it replaces: the ordinary path checks it
        if replaced and decomp.details.get("output_nnz"):
            return  # a sparse kernel's cuts on row profiles of inputs it replaces
        read = prepared.snapshot.readers(replaced)  # the versions the plan was made for
        facts = {n: _facts(read[n]) for n in replaced}
        self._last = (tuple(items), dict(lets), target, store, store.epoch, graph,
                      prepared.pieces, decomp, bare(), names, facts, bound)

    def prepare(self, items, lets: dict, target, snapshot: Snapshot, cache):
        """(graph, pieces, decomp, plan without readers, the readers of the current versions)
        of the last group, when this call repeats it and nothing else changed (module
        docstring); else None. ``snapshot``: this call's, which the ordinary path goes on
        with when this gives None. The caller rebinds the plan (cache.rebind)."""
        last = self._last
        if last is None or not self.enabled:
            return None
        (items0, lets0, target0, store0, epoch, graph, pieces, decomp, plan, names, facts,
         bound) = last
        store = snapshot.store
        if store is not store0 or store.epoch != epoch or target is not target0 or \
                len(items) != len(items0) or len(lets) != len(lets0):
            return None
        for (script, stmt), (script0, stmt0) in zip(items, items0):
            if stmt is not stmt0 or (script is not script0 and script != script0):
                return None
        for name, d in lets.items():
            if lets0.get(name) is not d:
                return None
        readers = snapshot.readers(names)  # first: binding's questions below find them
        for name, was in facts.items():
            if _facts(readers[name]) != was:
                return None
        if bound is not None:
            # Once, at the first call after the remembered one: what binding read holds after
            # that call's own commit too (the outputs it replaced were perhaps made by another
            # statement, on another grid). A replayed call's commit writes the same entries
            # again, but for the values (the same plan): only the replaced inputs' value
            # facts are checked at each replay.
            if not snapshot.holds(bound.answers, bound.seen):
                self._last = None
                return None
            last = self._last = last[:-1] + (None,)
        self._replaying = last
        self.replays += 1
        cache.hits += 1
        cache.bound_hits += 1
        return graph, dict(pieces), decomp, plan, readers


def _reads(name, written: set) -> bool:
    """Whether input ``name`` (a plain name, a slice's or a gather's) reads a tensor in
    ``written``."""
    if type(name) is str:
        return name.lower() in written
    return any(isinstance(part, str) and part.lower() in written
               for part in (getattr(name, "base", None), getattr(name, "index", None)))


def _facts(reader) -> tuple:
    """What of a replaced input's version binding, the plan's key and the sparse fusion rest on
    besides its catalog entry's shape, dtype, dims and grid: its fill and, per stored tile,
    its NaN/inf flag, whether every element is nonzero and its format (``TensorReader.layout``
    digests these, ``facts`` and ``has_sparse`` follow from them)."""
    entries = reader.entries
    return (reader.meta.fill, reader.meta.grid, tuple(sorted(
        (c, e.nonfinite, e.nnz == _size(e.shape), e.format) for c, e in entries.items())))


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
