"""A TilePlan as a few Dask tasks: each worker's tasks of one stage fused into one Dask task.

Dask costs about a millisecond per task and a scheduler round trip per dependency level (a
worker does not start the next task of its own until the scheduler tells it to), where the
local pool's threads go from one task to the next at once. The plan already places every tile
task on a worker, so the tasks a worker runs in a row, with their inputs on that worker, can be
one Dask task that runs them in order (``dask_worker.run_group``):

- A task's *stage* is the number of worker changes on its longest path of inputs: the most, over
  its inputs, of the input's stage, plus one where the input was made on another worker. A
  stored tile is read by each worker that needs it and can read the files (a Load there, placed
  in the stage of its first reader on that worker); a tile the client scattered is there from
  the start. The tasks of one worker and one stage are one *group*: a Dask task pinned to that
  worker, named by its operation (``tdb-kernel-C-<run>-<n>``: the dashboard groups by it). An
  edge between groups always goes to a higher stage, so the groups form a graph without cycles;
  workers still run their stages side by side.
- A group runs its tasks in the plan's order (``TilePlan.rank``, as the pool runs a worker's
  ready tasks) and frees each intermediate tile after its last reader; it returns only what
  others need (``GroupOut``): the tiles later groups read, the stored output tiles the client
  gathers (or, where the workers write, only their facts), and the records of the tasks it ran.
  Where another worker needs only part of what a group returns, a small ``pick`` task on the
  group's worker sends just that part (and the client gets its own part the same way).
- Facts and records are small and travel with the tiles, down the graph: the client gathers
  only the groups no other group reads (and the picks of its tiles), and has every record
  then, without another round trip to the workers.
"""
from __future__ import annotations

from collections import defaultdict
from heapq import heapify, heappop, heappush

from ..physical.plan import Aggregate, Assemble, Kernel, Load, TilePlan
from .dask_worker import Group, Step, pick, run_group
from .runtime import op_of

__all__ = ["Fusion", "group_name"]


class Fusion:
    """The fused graph of one attempt (``dask_run.Attempt``).

    ``addr``: plan key -> the worker address it is planned on; ``addresses``: the workers, in
    the plan's order; ``readers``: the workers that read the payload files themselves;
    ``copies``: the Loads each reader runs for its own tasks (a stored tile read where needed,
    never moved); ``scattered``: plan key -> Dask key of a Load tile the client scattered;
    ``outs``: the stored output tiles still to make (``slots``: those the workers write, key ->
    TileSlot); ``dead``: tasks no stored output reads, run so that they fail as on the pool.
    """

    def __init__(self, plan: TilePlan, run: str, backend: str, addr: dict, addresses: list,
                 readers: set, copies: set, scattered: dict, outs, slots: dict, dead) -> None:
        self.plan, self.run, self.backend = plan, run, backend
        self.addr, self.addresses = addr, addresses
        self.readers, self.copies, self.scattered = readers, copies, scattered
        self.outs, self.slots = set(outs), slots
        self.graph: dict = {}
        self.where: dict = {}      # Dask key -> the worker it is pinned to
        self.gather: list = []     # the Dask keys the client gathers
        self.groups: list = []     # the groups' Dask keys, in stage order
        self.sizes: dict = {}      # a group's Dask key -> how many plan tasks it runs
        self.priority: dict = {}   # Dask key -> 1 for what another worker waits for, else 0
        self._build(set(dead))

    # -- the nodes: (plan key, worker) and their stages -------------------------------------------
    def _build(self, dead: set) -> None:
        plan = self.plan
        task = {t.key: t for t in plan.tasks}
        roots = self.outs | dead
        order = _topological(task, roots, set(self.scattered))
        stage: dict[tuple, int] = {}
        inputs: dict[tuple, list] = {}  # node -> its input nodes (None: a scattered tile)
        users: dict[tuple, list] = defaultdict(list)
        for key in order:
            t = task[key]
            if isinstance(t, Load) and key in self.copies and key not in roots:
                continue  # read where its readers are (below, when they ask for it)
            a = self.addr[key]
            node, ins, s = (key, a), [], 0
            for k in t.inputs:
                if k in self.scattered:
                    ins.append(None)
                    continue
                m = (k, a) if k in self.copies and a in self.readers else (k, self.addr[k])
                if m not in stage:  # a Load, read on demand
                    stage[m], inputs[m] = 0, []
                ins.append(m)
                users[m].append(node)
                s = max(s, stage[m] + (m[1] != a))
            stage[node], inputs[node] = s, ins
        for m in stage:
            if isinstance(task[m[0]], Load) and users[m] and all(u[1] == m[1] for u in users[m]):
                stage[m] = min(stage[u] for u in users[m])  # in the stage of its first reader
        members: dict[tuple, list] = defaultdict(list)
        for node in stage:
            members[(stage[node], 0, self.addresses.index(node[1]))].append(node)
        for (s, _, w), nodes in list(members.items()):
            first = _first(nodes, inputs, users)
            if len(first) < len(nodes):
                members[(s, 0, w)] = [m for m in nodes if m in first]
                members[(s, 1, w)] = [m for m in nodes if m not in first]
        self._groups(task, members, inputs, users)

    def _groups(self, task, members, inputs, users) -> None:
        from dask.task_spec import Task, TaskRef
        plan, run, slots = self.plan, self.run, self.slots
        rank = plan.rank
        gkey: dict[tuple, str] = {}  # node -> its group's Dask key
        made = []
        for n, (s, sub, where) in enumerate(sorted(members)):
            nodes = _in_order(members[(s, sub, where)], inputs, rank)
            main = next((m for m in reversed(nodes) if not isinstance(task[m[0]], Load)),
                        nodes[-1])
            dk = f"tdb-{group_name(plan, task[main[0]])}-{run}-{n}"
            for m in nodes:
                gkey[m] = dk
            self.where[dk] = self.addresses[where]
            made.append((dk, self.addresses[where], nodes))
        # What each group returns: tiles read by other groups, by the worker that reads them
        exports: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
        for m, us in users.items():
            for u in us:
                if gkey[u] != gkey[m]:
                    exports[gkey[m]][u[1]].add(m[0])
        client_tiles = {}  # group -> whether the client gathers tiles from it
        for dk, a, nodes in made:
            client_tiles[dk] = any(m[0] in self.outs and m[0] not in slots and m[1] == a ==
                                   self.addr[m[0]] for m in nodes)
        picks: dict[tuple, str] = {}  # (group, worker or 'out') -> the Dask key to read it by

        def source(producer: str, at: str) -> str:
            """The key a group on worker ``at`` reads ``producer``'s tiles by: the group itself
            on its own worker, or where the reader needs all it returns; else a pick."""
            home = self.where[producer]
            every = set().union(*exports[producer].values())
            want = exports[producer][at]
            if at == home or (want == every and not client_tiles[producer]):
                return producer
            if (producer, at) not in picks:
                pk = f"{producer}-to{self.addresses.index(at)}"
                self.graph[pk] = Task(pk, pick, tuple(sorted(want)), False, TaskRef(producer))
                self.where[pk] = home
                picks[(producer, at)] = pk
            return picks[(producer, at)]

        for dk, a, nodes in made:
            deps: list[str] = []
            steps = []
            for m in nodes:
                t = task[m[0]]
                args, moved = [], []
                for k, inp in zip(t.inputs, inputs[m]):
                    if inp is None:  # scattered by the client
                        ref, key = self.scattered[k], None
                    elif gkey[inp] == dk:
                        args.append((-1, k))
                        moved.append(False)
                        continue
                    else:
                        ref, key = source(gkey[inp], a), k
                    if ref not in deps:
                        deps.append(ref)
                    args.append((deps.index(ref), key))
                    moved.append(inp is not None and inp[1] != a)
                key = m[0]
                mine = key in self.outs and m[1] == self.addr[key]
                steps.append(Step(
                    t, op_of(plan, t),
                    _sub_reader(plan.readers[t.tensor], t.starts, t.stops)
                    if isinstance(t, Load) else None,
                    plan.kernels[t.op] if isinstance(t, Kernel) else None,
                    tuple(args), tuple(moved),
                    slots.get(key) if mine else None,
                    any(gkey[u] != dk for u in users.get(m, ())),
                    mine and key not in slots,
                    sum(gkey[u] == dk for u in users.get(m, ()))))
            self.graph[dk] = Task(dk, run_group, self.run, self.backend, Group(dk, steps),
                                  *[TaskRef(d) for d in deps])
            self.groups.append(dk)
            self.sizes[dk] = len(steps)
            self.priority[dk] = int(any(at != a for at in exports[dk]))
        for dk, a, nodes in made:
            if client_tiles[dk] and exports[dk]:  # only its own tiles to the client
                pk = f"{dk}-out"
                self.graph[pk] = Task(pk, pick, (), True, TaskRef(dk))
                self.where[pk] = a
                self.gather.append(pk)
            elif client_tiles[dk] or not exports[dk]:  # read by no other group: gathered
                self.gather.append(dk)


def _first(nodes: list, inputs: dict, users: dict) -> set:
    """The nodes of a worker's stage that another worker waits for, and what they need: run as
    a group of their own, so that the other worker starts as soon as they are done, not once
    all of the stage is (the rest of the stage is a second group on the same worker)."""
    inside = set(nodes)
    stack = [m for m in nodes if any(u[1] != m[1] for u in users.get(m, ()))]
    if not stack:
        return inside
    first: set = set()
    while stack:
        m = stack.pop()
        if m not in first:
            first.add(m)
            stack.extend(i for i in inputs[m] if i in inside)
    return first


def _topological(task: dict, roots: set, scattered: set) -> list[int]:
    """The plan keys ``roots`` need, inputs before the tasks that read them."""
    order, seen = [], set()
    for root in sorted(roots):
        if root in seen:
            continue
        stack = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if expanded:
                order.append(key)
                continue
            if key in seen:
                continue
            seen.add(key)
            stack.append((key, True))
            stack.extend((k, False) for k in reversed(task[key].inputs)
                         if k not in seen and k not in scattered)
    return order


def _in_order(nodes: list, inputs: dict, rank: dict) -> list:
    """A group's nodes in the order its worker runs them: inputs first, and among the tasks
    ready, the plan's rank first (the local pool's order: a Load right before its reader)."""
    inside = set(nodes)
    waiting = {m: sum(1 for i in inputs[m] if i in inside) for m in nodes}
    readers = defaultdict(list)
    for m in nodes:
        for i in inputs[m]:
            if i in inside:
                readers[i].append(m)
    ready = [(rank.get(m[0], m[0]), m) for m in nodes if not waiting[m]]
    heapify(ready)
    out = []
    while ready:
        _, m = heappop(ready)
        out.append(m)
        for r in readers[m]:
            waiting[r] -= 1
            if not waiting[r]:
                heappush(ready, (rank.get(r[0], r[0]), r))
    return out


def group_name(plan: TilePlan, task) -> str:
    """The dashboard's name for a task's group: what it does and the tensor it is for (Dask
    groups keys by their words up to the first that is not all letters)."""
    kind = {Load: "load", Kernel: "kernel", Aggregate: "aggregate", Assemble: "retile"}.get(
        type(task), "task")
    name = plan.readers[task.tensor].meta.name if isinstance(task, Load) else \
        op_of(plan, task).output
    letters = "".join(c for c in str(name) if c.isalpha())
    return f"{kind}-{letters}" if letters else kind


def _sub_reader(reader, starts, stops):
    """A reader holding only the tiles that overlap the box, so each Load ships little."""
    try:
        from ..geometry import overlapping
        import itertools
        ranges = [overlapping(b, a, z) for b, a, z in zip(reader.meta.grid, starts, stops)]
        keep = [reader.entries[c] for c in itertools.product(*ranges) if c in reader.entries]
        return reader.with_entries(keep)
    except (AttributeError, TypeError):  # another reader type: ship it whole
        return reader
