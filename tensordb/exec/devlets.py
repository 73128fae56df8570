"""The values of LETs kept on the GPUs from one statement to the next (with ``devcache.py``).

A LET is inlined into every statement that reads it (``bind/group.py``): each statement's
graph holds the LET's operations again. On the GPU executor the tiles a LET's operation made
in one run stay in the device cache, and a later run whose plan computes the same value cuts
those operations out: each of its tiles found cached becomes a Load of the cached tile, and
the tasks that only fed it (the LET's kernels and aggregations, the Loads of what it reads)
are left out of the run.

"The same value" is decided from the plan alone, never from a name: a value's *identity* is
a digest of the operations that compute it (labels, sizes, join, aggregate, dtypes, and the
identities of their inputs, recursively) and of the versions of the stored tensors they read.
A redefined LET has other operations, a replaced input another version: either is another
identity, so a stale value is never served. A value that reads anything but stored tensors
and such values has no identity and is never kept. The cache's key of a LET tile is
``("=" + identity, 0, starts, stops)``: a tile of another box (the next plan cut the LET
into other pieces) is not found, and is computed as before.

Which values are kept: the results of the plan's operations that are not stored and carry a
statement's own name (a LET, or an earlier version of a name reassigned in the group), not
the temporaries and pairwise steps inside one statement.
"""
from __future__ import annotations

import copy
import hashlib

import numpy as np

from ..geometry import tile_box
from ..physical.plan import Load

__all__ = ["identities", "held_tiles", "cut_held", "HeldReader"]


def identities(plan) -> dict[str, tuple[str, frozenset]]:
    """Per value the plan computes and may keep (see the module's doc): its output name ->
    (identity, the stored ``(name, version)`` pairs it reads)."""
    memo = {}
    for name, reader in plan.readers.items():
        m = reader.meta
        memo[name] = (f"in:{m.name.lower()}:{m.version}:{m.dtype}",
                      frozenset({(m.name.lower(), int(m.version))}))
    out: dict[str, tuple[str, frozenset]] = {}
    for op in plan.ops:
        parts = [memo.get(o.tensor) for o in op.inputs]
        if any(p is None for p in parts):
            continue  # reads a tensor of no identity: not kept, nor anything that reads it
        text = repr((op.out_labels, tuple((p[0], o.labels) for p, o in zip(parts, op.inputs)),
                     op.sizes, op.join, op.agg, op.dtype, op.in_dtypes, op.backward))
        ident = hashlib.sha1(text.encode()).hexdigest()[:32]
        deps = frozenset().union(*(p[1] for p in parts))
        memo[op.output] = (ident, deps)
        result = plan.outputs.get(op.output)
        ref = op.output
        if result is not None and not result.stored and result.grid is not None and \
                not getattr(ref, "temp", 0) and not getattr(ref, "step", 0) and \
                not getattr(ref, "internal", False):
            out[op.output] = (ident, deps)
    return out


def held_tiles(plan, idents) -> dict[int, tuple]:
    """Task key -> (the cache key of the LET tile it makes, the value's dtype and shape), for
    every tile of the kept values."""
    made: dict[int, tuple] = {}
    for name, (ident, _) in idents.items():
        out = plan.outputs[name]
        for coords, key in out.tiles.items():
            starts, stops = tile_box(out.grid, coords)
            made[key] = (("=" + ident, 0, tuple(starts), tuple(stops)), out.dtype, out.shape)
    return made


class _Meta:
    __slots__ = ("name", "version", "dtype", "shape")

    def __init__(self, name, dtype, shape) -> None:
        self.name, self.version, self.dtype, self.shape = name, 0, np.dtype(dtype), shape


class HeldReader:
    """The reader a Load of a held LET tile names: its value is only ever the cached tile
    (``DeviceTiles.load``); reading it any other way is a bug."""

    held = True

    def __init__(self, name: str, dtype, shape) -> None:
        self.meta = _Meta(name, dtype, shape)

    def __getattr__(self, attr):
        raise AttributeError(f"the held LET tile '{self.meta.name}' has no '{attr}': it is "
                             "read from the device cache only")


def cut_held(plan, found: dict[int, tuple]):
    """``plan`` with the tasks of ``found`` (``held_tiles``' entries of the tiles found held)
    replaced by Loads of those tiles, and the tasks nothing else needs left out; a copy
    (the plan itself may be the plan cache's)."""
    tasks = plan.tasks
    by_key = {t.key: t for t in tasks}
    readers = dict(plan.readers)
    new: dict[int, object] = {}
    for key, (ckey, dtype, shape) in found.items():
        t = by_key[key]
        name = ckey[0]
        if name not in readers:
            readers[name] = HeldReader(name, dtype, shape)
        new[key] = Load(key, name, ckey[2], ckey[3], t.worker)
    # what runs: every task the stored outputs' tiles need, a held tile's producers not
    need: set[int] = set()
    stack = [k for o in plan.outputs.values() if o.stored for k in o.tiles.values()]
    while stack:
        k = stack.pop()
        if k in need:
            continue
        need.add(k)
        if k not in new:
            stack.extend(by_key[k].inputs)
    cut = copy.copy(plan)
    cut.__dict__.update(tasks=[new.get(t.key, t) for t in tasks if t.key in need],
                        readers=readers, memo={})
    cut.reindex()
    return cut
