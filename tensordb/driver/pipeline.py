"""The driver: every statement group, Graph and EXPLAIN goes through these few functions, and
their bodies are the pipeline, each stage one call, timed under TENSORDB_DEBUG=1:

    text --parse--> statements --bind--> EinGraph --optimize--> Decomposition
         --lower--> TilePlan --place--> --run--> tiles --commit--> store

``prepare(statements | Graph, snapshot)`` binds and plans against one catalog ``Snapshot``
(snapshot.py), reusing what the ``PreparedCache`` (cache.py) holds; ``Prepared.run(executor,
sink)`` runs the plan and hands its outputs to the sink (sink.py: the store's commit, or an
array). The ``Engine`` (engine.py) holds the state these need between calls.

>>> import numpy as np, tensordb
>>> from tensordb.driver import Snapshot, PreparedCache, ArraySink, prepare
>>> con = tensordb.connect()
>>> con.load("A", np.eye(2) * 3)
>>> g = tensordb.Graph().einsum("ij,jk->ik", "A", "A", into="B")
>>> target = con.engine.target()
>>> p = prepare(g, Snapshot(con.store), target, PreparedCache())
>>> p.run(con.engine.executor(), ArraySink("B")).tolist()
[[9.0, 0.0], [0.0, 9.0]]
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Hashable

from .. import optimizer, physical
from ..bind import bind_graph, bind_statements
from ..config import debug_level, format_bytes, gc_paused, stage
from ..errors import OutOfMemoryError, ProgrammingError
from ..plan import fills as plan_fills, sparse_fuse, sparse_split
from ..plan.builder import Graph
from ..plan.ir import EinGraph
from ..plan.memory import refuse_unfillable
from .cache import PreparedCache, graph_key, plan_key, rebind, statements_key
from .snapshot import Snapshot

__all__ = ["parse", "prepare", "Prepared", "Target"]


@dataclass(frozen=True)
class Target:
    """What planning needs of the executor that will run the plan, declared rather than asked
    of a live one: its ``workers``, the most partials one aggregation task combines
    (``fan_in``; None: any, physical/trees.py), the ``memory_limit`` they share, the BLAS
    threads one call may use, the tiling strategy; ``key``: all that steers a plan.
    ``cluster``: where the executor is a cluster that reports its own workers (Dask), what
    they reported (``Engine.target``: their count, threads and memory), shown by EXPLAIN."""

    workers: int
    fan_in: int | None
    memory_limit: int | None
    blas_threads: int
    tiling: str | None
    key: Hashable = ()
    fuse_sparse: bool = True  # the fused masked and sampled kernels (exec/semiring.py; on a
    #                           GPU, exec/gpu_sparse.py)
    cluster: tuple = ()  # ((name, value), ...): the cluster's own report (EXPLAIN's "target")


@dataclass
class Prepared:
    """A statement group (or Graph) bound and planned against ``snapshot``: its ``graph``
    (None when it only defines LETs), ``pieces``, ``decomp`` and placed ``plan``; ``fresh``
    when the plan was made now (not taken from the cache)."""

    snapshot: Snapshot
    graph: EinGraph | None = None
    pieces: dict = field(default_factory=dict)
    decomp: Any = None
    plan: Any = None
    fresh: bool = False

    def run(self, executor, sink, progress=None, ran=None):
        """run, commit: ``executor`` runs the placed plan; its output tiles go to ``sink``
        (computed straight into their new payload files where the executor can), which
        commits them and says what the run gives. ``ran(plan, result)`` sees the run first."""
        out = sink.open(self)
        try:
            with stage("run"):
                result = executor.run(self.plan, self.snapshot.store, progress=progress,
                                      destinations=out.buffers, finished=out.finished)
        except BaseException:
            out.abort()
            raise
        if ran is not None:
            ran(self.plan, result)
        with stage("commit"):
            return out.commit(result)


def parse(sql: str) -> list:
    """parse: text -> statements (ASTs with spans). The text of the last call again (a
    training loop's step) gives the very statements again, as the parser's cache of scripts
    does, without entering the stages around it."""
    last = _LAST_PARSED
    if type(sql) is str and (sql is last[0] or sql == last[0]) and not debug_level():
        return list(last[1])
    from ..dialect import parse as parse_text
    if not isinstance(sql, str):
        raise ProgrammingError(f"a statement must be a string, got {type(sql).__name__}")
    with gc_paused(), stage("parse"):
        stmts = parse_text(sql)
    _remember_parsed(sql, stmts)
    return stmts


_LAST_PARSED: tuple = (None, ())  # the text parse() was last given, and its statements


_PARSED_MAX = 1 << 16  # characters: a longer text is not kept (the parser keeps none either)


def _remember_parsed(sql: str, stmts: list) -> None:
    global _LAST_PARSED
    _LAST_PARSED = (sql, tuple(stmts)) if len(sql) <= _PARSED_MAX else (None, ())


def prepare(source, snapshot: Snapshot, target: Target, cache: PreparedCache, *,
            lets: dict | None = None, pieces=None) -> Prepared:
    """bind, optimize, lower, place: ``source`` (a list of (script, AssignStmt) with the
    session's ``lets``, a Graph, or a bound EinGraph) -> Prepared; nothing runs. The objects
    it builds live on: the cyclic garbage collector waits (``config.gc_paused``)."""
    with gc_paused():
        graph, pieces = bind(source, snapshot, cache, lets, pieces)
        if graph is None:
            return Prepared(snapshot)
        decomp, plan, fresh = plan_graph(graph, pieces, snapshot, target, cache)
    return Prepared(snapshot, graph, pieces, decomp, plan, fresh)


def bind(source, snapshot: Snapshot, cache: PreparedCache, lets=None, pieces=None):
    """bind: statements or a Graph -> the checked EinGraph (None when the statements only
    define LETs) and the pieces it carries; a group bound before whose catalog answers hold
    again (a training step) is taken from the cache."""
    if isinstance(source, EinGraph):
        return source, dict(pieces or {})
    graph_given = isinstance(source, Graph)
    with stage("bind"):
        key = graph_key(source) if graph_given else statements_key(source, lets)
        kept = cache.bound(key, snapshot, None if graph_given else lets, source)
        if kept is not None:
            graph, bound_pieces = kept.graph, kept.pieces
        elif graph_given:
            graph, bound_pieces = bind_graph(source, snapshot), dict(source.pieces)
            cache.keep_bound(key, snapshot, graph, bound_pieces, None, None)
        else:
            before = dict(lets)
            binder = bind_statements(snapshot, lets, source)
            graph, bound_pieces = (binder.eingraph(), dict(binder.pieces)) \
                if binder.steps and binder.outputs else (None, {})
            cache.keep_bound(key, snapshot, graph, bound_pieces, before, lets, source)
    return graph, {**bound_pieces, **(pieces or {})}


def plan_graph(graph: EinGraph, pieces, snapshot: Snapshot, target: Target,
               cache: PreparedCache):
    """optimize, lower, place: a bound graph -> (Decomposition, placed TilePlan, fresh). A
    plan is kept under the layouts of its inputs, not their versions (cache.py): a graph over
    new versions of the same layout (a training step) reuses it, reading the current ones.
    TENSORDB_DEBUG=2 prints the plan as EXPLAIN shows it, =3 its tile tasks too."""
    names = [t.name for t in graph.inputs]
    readers = snapshot.readers(names)
    if target.fuse_sparse:
        graph = fuse_sparse(graph, readers, snapshot)
    key = plan_key(graph, pieces, snapshot.layouts(names), target.key)
    cached = cache.plan(key, lambda kept: {n: readers[n].meta.version for n in kept},
                        lambda decomp: _cuts_hold(graph, decomp, snapshot, names))
    if cached is not None:
        if debug_level() >= 1:
            print(f"[tensordb] plan cache hit ({cache.hits} hits)", file=sys.stderr)
        decomp, plan = cached
        return decomp, rebind(plan, readers, graph.ops), False
    # Every output's fill value (plan/fills.py): an operation that keeps none is refused here,
    # before anything is planned or run.
    input_fills = {n: r.meta.fill for n, r in readers.items()}
    fills = plan_fills.graph_fills(graph, input_fills)
    decomp = optimize(graph, pieces, snapshot, names, target)
    # An output its sparse inputs cannot fill (a dense vector over a hypersparse matrix's
    # 10^10 rows) is refused here, before anything runs (plan/memory.py)
    refuse_unfillable(graph, {n: int(r.meta.nbytes) for n, r in readers.items()
                              if getattr(r, "has_sparse", False)},
                      {name: c.out_bytes for name, c in getattr(
                          decomp.details.get("cost"), "ops", {}).items()
                       if c.out_bytes is not None}, target.memory_limit)
    if target.cluster:  # EXPLAIN: the workers, threads and memory the plan was made for
        decomp.details["target"] = dict(target.cluster)
    decomp.details["output_fill"] = {n: f for n, f in fills.items() if f}
    sparse = {n for n, r in readers.items() if getattr(r, "has_sparse", False)}
    if sparse:  # EXPLAIN: an operation whose output is dense where its input is absent
        decomp.details["densifies"] = plan_fills.densifying(graph, input_fills, sparse, fills)
    facts = {name: snapshot.facts(name) for name in names}
    with stage("lower"):
        plan = physical.lower(graph, decomp, snapshot.store, readers, facts)
    with stage("place"):
        plan = physical.place(plan)
        plan = physical.aggregation_trees(plan, target.fan_in)  # on the workers placement chose
        plan = physical.order(plan)  # the memory-aware order the pool runs tasks in
    cache.prune(snapshot.store.has)
    cache.keep_plan(key, decomp, plan, readers, _profiled(decomp, snapshot, names))
    if debug_level() >= 2:
        from ..explain import render
        print(render(decomp, plan), physical.describe(plan), sep="\n", file=sys.stderr)
    if debug_level() >= 3:
        print(physical.describe_tasks(plan), file=sys.stderr)
    return decomp, plan, True


def _profiled(decomp, snapshot: Snapshot, names) -> dict:
    """name -> version of the stored sparse matrices whose row profiles ``decomp``'s cuts of
    equal nonzeros rest on, or may rest on in another version (optimizer/balance.py): the
    inputs that offer a profile, where a sparse kernel computes some operation."""
    if not decomp.details.get("output_nnz"):
        return {}
    readers = snapshot.readers(names)
    return {n: readers[n].meta.version for n, st in snapshot.stored_stats(names).items()
            if st.row_profile is not None}


def _cuts_hold(graph: EinGraph, decomp, snapshot: Snapshot, names) -> bool:
    """Whether the current versions of the inputs cut ``decomp``'s rows as it does (a cached
    plan over a replaced matrix: driver/cache.py)."""
    grids = {n: r.meta.grid for n, r in snapshot.readers(names).items()}
    cuts, _ = optimizer.balance_cuts(graph, decomp, snapshot.stored_stats(names), grids)
    return cuts == decomp.details.get("cuts", {})


def optimize(graph: EinGraph, pieces, snapshot: Snapshot, names, target: Target):
    """optimize: the Decomposition (pieces per label of every operation) and its cost, from
    what the snapshot read of the inputs."""
    readers = snapshot.readers(names)
    metas = {name: r.meta for name, r in readers.items()}
    # Block-sparse inputs: the optimizer counts only the kernel calls whose tiles exist, and
    # only where the partner tiles are finite (0 * inf is NaN): what the catalog knows.
    sparse = {name: r.coords() for name, r in readers.items()
              if metas[name].tile_count < metas[name].total_tiles}
    # Fixed pieces name statements: the operations computed under a statement's name (its
    # pairwise steps, temporaries, internal name) take them on; bad ones are errors here.
    pieces = optimizer.pieces_per_op(graph, pieces)
    with stage("optimize"), _cluster_budget(target):
        return optimizer.decompose(
            graph, target.workers, strategy=target.tiling, memory_limit=target.memory_limit,
            pieces=pieces, input_grids={name: m.grid for name, m in metas.items()},
            input_tiles=sparse, input_facts={name: snapshot.facts(name) for name in names},
            blas_threads=target.blas_threads, input_stats=snapshot.stored_stats(names))


@contextmanager
def _cluster_budget(target: Target):
    """On a cluster, a plan that fits no worker's share says whose limit that is: the
    workers' own, not the connection's ``memory_limit``."""
    try:
        yield
    except OutOfMemoryError as exc:
        c = dict(target.cluster)
        if not c or c.get("memory_per_worker") is None:
            raise
        exc.message = (f"{exc.message}; on this Dask cluster the budget is each worker "
                       f"thread's share of the smallest worker's memory for tiles "
                       f"({format_bytes(c['memory_per_worker'])}: its Dask memory limit less "
                       f"what its process needs, {c['threads']} thread(s) a worker)")
        exc.args = (exc.message,)
        exc.hint = ("start the Dask workers with a larger --memory-limit or fewer --nthreads, "
                    "or fix fewer pieces")
        raise


def fuse_sparse(graph: EinGraph, readers, snapshot: Snapshot) -> EinGraph:
    """``graph`` with a product that a sparse matrix masks fused with it, where the masked
    SpGEMM or SDDMM kernel computes it (plan/sparse_fuse.py): only over matrices stored with
    sparse tiles, fill 0."""
    sparse = {n for n, r in readers.items() if getattr(r, "has_sparse", False)
              and r.meta.ndim == 2 and r.meta.fill == 0}
    if not sparse:
        return graph
    graph = sparse_split.split(graph, sparse)  # a sparse part of a join: its own operation
    return sparse_fuse.fuse(graph, sparse, {n: snapshot.facts(n)[0] for n in readers})
