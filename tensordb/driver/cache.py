"""The prepared-statement cache: a statement group (or a Graph) prepared once is not bound or
planned again while nothing it depends on changed, so a repeated statement (a training step, a
dashboard) pays only for running.

One entry per statement group holds what binding it read of the catalog (``Snapshot.answers``),
the bound graph, and the LETs it defined; one entry per bound graph and input layouts holds its
plan. Both are validated in one place, ``lookup``: against the store's epoch first (nothing in
the catalog changed: every answer holds), else by asking the snapshot the same questions again
(each name's spelling, shape, dtype, dims and grid, its NaN/inf facts). A plan depends on the
bound graph, the pieces fixed, each input's *layout* (grid, present tiles, per tile its NaN/inf
flag and whether every element is nonzero: ``TensorReader.layout``), the settings that steer
planning and the executor's capabilities; not on the inputs' versions: a training step that
writes new weights of the same layout plans once. The one thing a plan takes from its inputs'
values is where it cuts a sparse matrix's rows into slabs of equal nonzeros (the matrix's row
profile: optimizer/balance.py), so a plan with such cuts notes the matrices' versions, and a
lookup over other versions of them works the cuts out again: the plan holds where they come out
the same, else it is made again (the cuts set the tasks' boxes, the tiles written and the cuts
of later operations, so re-cutting is lowering again). Plans are kept without their readers (no
replaced payload file stays mapped); ``rebind`` gives one the readers of the current versions.

    >>> cache = PreparedCache(size=2)
    >>> cache.stats()
    {'hits': 0, 'misses': 0, 'size': 0}
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

from ..bind import LetDef
from ..plan import scalar
from .replay import Replay

__all__ = ["PreparedCache", "Bound", "rebind", "statements_key", "graph_key"]


@dataclass
class Bound:
    """A bound group: the graph and pieces binding gave, what it read (``answers``) at
    ``epoch``, and the LETs it defined (name, statement index, shape, dtype) and dropped."""

    answers: tuple
    epoch: int
    graph: Any
    pieces: dict
    defined: tuple = ()
    dropped: tuple = ()
    seen: tuple = ()  # Snapshot.seen: the entries read, checked by identity first


def statements_key(items, lets) -> Hashable:
    """A group's key: its statements as bound, not only their text (EXPLAIN binds a LET's text
    as an assignment, ``mode``, which must not stand in for the LET), and the LETs it starts
    from."""
    return ("statements",
            tuple((script, stmt.span.start, stmt.span.end, type(stmt).__name__,
                   getattr(stmt, "mode", None), getattr(stmt, "params", None))
                  for script, stmt in items),
            tuple(sorted((k, d.script, d.stmt.span.start, d.stmt.span.end, tuple(d.shape),
                          str(d.dtype)) for k, d in lets.items())))


def graph_key(graph) -> Hashable:
    """A Graph's key: its steps (with their literals spelled out: ``0.0 == -0.0``) and pieces."""
    return ("graph", tuple(graph.steps), repr(graph.steps),
            tuple(sorted((k, tuple(sorted(p.items()))) for k, p in graph.pieces.items())))


def plan_key(graph, pieces, layouts: dict, target: Hashable) -> Hashable:
    """The key of a plan: everything its decomposition and tile plan depend on."""
    fixed = tuple(sorted((str(name), tuple(sorted(p.items()))) for name, p in (pieces or {}).items()))
    return (_graph_part(graph), fixed, tuple(sorted(layouts.items())), target)


class _GraphKey:
    """A bound graph and its literals as part of a plan's key, its hash taken once: the bound
    graph is reused from call to call (a training step), and hashing it afresh walked every
    operation (0.1-0.2 ms a step). Equal to another when it is the same graph, else when the
    graphs and their literals are equal."""

    __slots__ = ("graph", "literals", "hash")

    def __init__(self, graph) -> None:
        self.graph = graph
        self.literals = tuple(_literals(op.join) for op in graph.ops)
        self.hash = hash((graph, self.literals))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _GraphKey) and (self.graph is other.graph or (
            self.hash == other.hash and self.literals == other.literals
            and self.graph == other.graph))


_GRAPH_KEYS: dict[int, _GraphKey] = {}  # id(graph) -> its key part (which holds the graph)


def _graph_part(graph) -> _GraphKey:
    part = _GRAPH_KEYS.get(id(graph))
    if part is None or part.graph is not graph:
        if len(_GRAPH_KEYS) >= 256:
            _GRAPH_KEYS.clear()
        part = _GRAPH_KEYS[id(graph)] = _GraphKey(graph)
    return part


def _literals(expr) -> tuple:
    """The literals of a join as their type and spelling: equal graphs may differ in them
    (``0.0 == -0.0``, ``1 == 1.0 == True``), and each gives another result."""
    if isinstance(expr, scalar.Const):
        return ((type(expr.value).__name__, repr(expr.value)),)
    if isinstance(expr, scalar.Call):
        return tuple(x for a in expr.args for x in _literals(a))
    return ()


def rebind(plan, readers: dict, ops=None):
    """``plan`` reading through ``readers`` (input name -> TensorReader of its current version).
    Everything else in a TilePlan names tensors, never versions: its tasks, outputs and stats
    are shared with the cached plan. ``ops``: the operations of the graph it runs now, equal to
    the plan's but for the values of their parameters (``scalar.Param``), which they bring."""
    # a shallow copy (copy.copy's protocol cost 10 times this: 2.6 us a call)
    bound = object.__new__(type(plan))
    bound.__dict__.update(plan.__dict__)
    built = plan.memo.get("built") if "tasks" not in plan.__dict__ else None
    if built is not None and built[0] is plan.__dict__.get("_build"):
        bound.__dict__.update(built[1])  # the tasks an earlier copy made (TilePlan.deferred)
    bound.readers = dict(readers)
    if ops is not None and _params_in(ops):
        bound.ops = tuple(ops)
    return bound


_PARAMS: dict[int, tuple] = {}  # id(ops) -> (ops, whether a join holds a parameter)


def _params_in(ops) -> bool:
    kept = _PARAMS.get(id(ops))
    if kept is None or kept[0] is not ops:
        if len(_PARAMS) >= 256:
            _PARAMS.clear()
        kept = _PARAMS[id(ops)] = (ops, any(_has_param(op.join) for op in ops))
    return kept[1]


def _has_param(expr) -> bool:
    if isinstance(expr, scalar.Param):
        return True
    return isinstance(expr, scalar.Call) and any(_has_param(a) for a in expr.args)


class PreparedCache:
    """The last ``size`` bound groups and the last ``size`` plans, LRU; ``hits`` and ``misses``
    count plans (``Connection.plan_cache_stats``), ``bound_hits`` groups bound from the cache."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self.hits = self.misses = self.bound_hits = 0
        self.last_bound: Bound | None = None  # the entry the last ``bound``/``keep_bound`` gave
        self._bound: OrderedDict[Hashable, Bound] = OrderedDict()
        self._plans: OrderedDict[Hashable, tuple] = OrderedDict()
        self.replay = Replay()  # the last group run, to be run again (replay.py)

    # -- binding ----------------------------------------------------------------------------------
    def bound(self, key: Hashable, snapshot, lets: dict | None, items=()) -> Bound | None:
        """The group kept under ``key`` if what it read holds in ``snapshot`` (the LETs it
        defined are defined again in ``lets``), else None."""
        kept = self.last_bound = self._bound.get(key)
        if kept is None or not (kept.epoch == snapshot.epoch or snapshot.holds(kept.answers, kept.seen)):
            self.last_bound = None
            return None
        kept.epoch = snapshot.epoch
        if lets is not None:
            for name in kept.dropped:
                lets.pop(name, None)
            for name, k, shape, dtype in kept.defined:
                lets[name] = LetDef(items[k][0], items[k][1], shape, dtype)
        self._bound.move_to_end(key)
        self.bound_hits += 1
        return kept

    def keep_bound(self, key: Hashable, snapshot, graph, pieces, lets_before: dict | None,
                   lets: dict | None, items=()) -> None:
        """Keep a group just bound against ``snapshot`` (``lets`` as binding left them)."""
        self.last_bound = None
        defined = []
        if lets is not None:
            where = {id(stmt): k for k, (_, stmt) in enumerate(items)}
            for name, d in lets.items():
                if lets_before.get(name) is d:
                    continue
                if id(d.stmt) not in where:  # a LET from elsewhere: nothing to define it by
                    return
                defined.append((name, where[id(d.stmt)], d.shape, d.dtype))
        if not snapshot.keepable or self.size <= 0:
            return
        dropped = tuple(n for n in (lets_before or {}) if n not in (lets or {}))
        try:
            self._bound[key] = self.last_bound = Bound(
                snapshot.answers, snapshot.epoch, graph, dict(pieces), tuple(defined), dropped,
                snapshot.seen)
        except TypeError:  # an unhashable part: never kept
            return
        while len(self._bound) > self.size:
            self._bound.popitem(last=False)

    # -- planning ---------------------------------------------------------------------------------
    def plan(self, key: Hashable, versions: Callable[[Iterable[str]], dict] | None = None,
             recut: Callable[[Any], bool] | None = None):
        """The kept (Decomposition, TilePlan) of ``key`` (its readers empty: ``rebind`` it).
        A plan whose cuts of equal nonzeros rest on stored matrices' row profiles
        (``keep_plan``'s ``profiled``) holds for other versions of them only where
        ``recut(decomp)`` says the current ones are cut the same; ``versions(names)`` gives
        their current versions. Else it is dropped and made again (a miss)."""
        try:
            entry = self._plans[key]
        except (KeyError, TypeError):  # TypeError: an unhashable part (never kept)
            self.misses += 1
            return None
        profiled = entry[3]
        if profiled and versions is not None:
            now = versions(profiled)
            if now != profiled:
                if recut is None or not recut(entry[0]):
                    del self._plans[key]
                    self.misses += 1
                    return None
                self._plans[key] = entry[:3] + (now,)
        self._plans.move_to_end(key)
        self.hits += 1
        return entry[:2]

    def keep_plan(self, key: Hashable, decomp, plan, inputs, profiled: dict | None = None) -> None:
        """Keep ``plan`` (a copy without its readers); ``inputs``: the names it reads;
        ``profiled``: name -> version of the sparse matrices whose row profiles its cuts rest
        on (``plan`` checks them)."""
        if self.size <= 0:
            return
        try:
            self._plans[key] = (decomp, rebind(plan, {}), frozenset(inputs), dict(profiled or {}))
        except TypeError:
            return
        self._plans.move_to_end(key)
        while len(self._plans) > self.size:
            self._plans.popitem(last=False)

    def prune(self, exists: Callable[[str], bool]) -> None:
        """Drop the plans that read a tensor that no longer exists (``exists(name)`` False)."""
        stale = [k for k, (_, _, inputs, _) in self._plans.items()
                 if not all(exists(name) for name in inputs)]
        for k in stale:
            del self._plans[k]

    def clear(self, bound: bool = True) -> None:
        """Forget the plans, and with ``bound`` the bound groups too."""
        if bound:
            self._bound.clear()
        self._plans.clear()
        self.last_bound = None
        self.replay.forget()

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._plans)}
