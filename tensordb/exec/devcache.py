"""Tiles of stored tensors kept on the GPUs from one query to the next (the device cache).

A query on the GPU executor reads its stored inputs with Loads, each a box of one tensor version
copied host -> device. The cache keeps those device arrays after the run, keyed by
``(tensor, version, starts, stops)`` and the device, so that the next query reading the same
box of the same version copies nothing (a *hit*); a box cached on another device is copied
from there (a *peer* copy, device to device). Versions are never reused while a database is
open, so a key names the bytes; a tensor replaced or dropped has its older versions' tiles
removed when the catalog commit lands (``committed``, a listener of the store), and a run also
drops any tile of a tensor it reads at another version (``keep_version``).

Stored outputs stay too: at the end of a run the device arrays of its stored output tiles are
held as *pending* under the output's name and box; when the store commits that name, they
become the cache's tiles of the committed version (a training step's new weights are read by
the next step without a copy). Pending tiles of a run whose commit never came are dropped at
the next commit.

The tiles of LETs stay too (``devlets.py``): keyed ``("=" + digest, 0, starts, stops)``, the
digest naming the operations that compute the value and the versions they read (``deps``,
``let_reads``); they leave when one of those versions is replaced or dropped. A run pins the
LET tiles its plan will read (``pin``) until it reads them (``unpin``).

Memory: the cache's tiles count against the executor's ``memory_limit``, as the run's tiles
do. A tile in use by the running query is counted by the run's ledger (it is one of its
tiles); a cached tile no run holds is *idle* and counted here (``idle_bytes``). Before a run,
idle tiles are dropped (least recently used first, those the plan does not read before those
it does) until the cache and the plan's tiles fit the limit; during a run, the pool's admission
drops idle tiles first when a task needs room (``make_room``), before it moves any tile of the
run to host memory. The cache is thread-safe: worker threads of several devices use it at once.
A sparse tile is kept as it is on the device (a cupyx CSR matrix, gpu_sparse.py), counted by
the bytes of its three arrays, not by its dense extent.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..physical.plan import Load
from .devlets import held_tiles, identities
from .gpu_sparse import tile_bytes

__all__ = ["DeviceCache", "load_key"]


def load_key(task, reader) -> tuple:
    """The cache key of Load ``task``'s box: (tensor, version, starts, stops)."""
    m = reader.meta
    return (m.name.lower(), m.version, tuple(task.starts), tuple(task.stops))


@dataclass
class _Entry:
    array: object
    nbytes: int
    uses: int = 0   # Loads of the running query holding it (0: idle)


class DeviceCache:
    """Device arrays of stored tiles, least recently used first (see the module's doc).

    Keys are ``(name.lower(), version, starts, stops)``; an entry is one key on one device.
    Pending output tiles have version None until their commit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()  # (key, device) -> entry
        self.ids: dict[int, tuple] = {}   # id(array) -> its (key, device), for ``release``
        self.names: dict[str, set] = {}   # name -> its entries' (key, device)
        self.bytes = 0        # all cached bytes (idle or held by the run)
        self.idle_bytes = 0   # bytes of entries no run holds
        self.evicted = 0      # entries dropped for room (a figure for tests and EXPLAIN)
        # LET values (devlets.py), by their cache name "=identity": the stored (name, version)
        # pairs each reads; it leaves when one of those is replaced or dropped
        self.deps: dict[str, frozenset] = {}

    def __len__(self) -> int:
        return len(self.entries)

    # -- the run's Loads -----------------------------------------------------------------------
    def get(self, key: tuple, device: int, held: bool = True):
        """The cached array of ``key`` on ``device`` (now held by the run, unless ``held`` is
        False), or None."""
        with self.lock:
            e = self.entries.get((key, device))
            if e is None:
                return None
            self._used(key, device, e, held)
            return e.array

    def peer(self, key: tuple, device: int, devices):
        """``(device, array)`` of ``key`` cached on another of ``devices`` than ``device``, or
        None."""
        with self.lock:
            for d in devices:
                e = self.entries.get((key, d)) if d != device else None
                if e is not None:
                    return d, e.array
        return None

    def pin(self, key: tuple, devices) -> int | None:
        """Hold ``key`` where it is cached (the first of ``devices`` that has it) until the run
        reads it (``unpin``), so that no room is made with it before; that device, or None."""
        with self.lock:
            for d in devices:
                e = self.entries.get((key, d))
                if e is not None:
                    self._hold(e)
                    return d
        return None

    def cover(self, key: tuple, devices) -> list[tuple] | None:
        """Cached tiles of ``key``'s name (a LET value's: the boxes of another tiling) that
        together cover ``key``'s box, ``[(key, device)]``, pinned as ``pin`` does; None when
        they do not cover it."""
        name, starts, stops = key[0], key[2], key[3]
        with self.lock:
            boxes = {}
            for (k, d) in self.names.get(name, ()):
                if d in devices and k[1] == key[1] and k not in boxes and \
                        all(a < q and p < b for a, b, p, q in zip(starts, stops, k[2], k[3])):
                    boxes[k] = d
            picked = _cover(starts, stops, sorted(boxes, key=lambda k: -_overlap(k, starts, stops)))
            if picked is None:
                return None
            for k in picked:
                self._hold(self.entries[(k, boxes[k])])
            return [(k, boxes[k]) for k in picked]

    def unpin(self, key: tuple, device: int) -> None:
        """The run read ``key`` (pinned on ``device``): it counts as its Load's from now on."""
        with self.lock:
            e = self.entries.get((key, device))
            if e is not None and e.uses > 0:
                self._let_go(e)

    def put(self, key: tuple, device: int, array, held: bool = True):
        """Cache ``array`` as ``key`` on ``device`` (held by the run unless ``held`` is False);
        the array to use (the one cached already, when another thread put it first)."""
        nbytes = tile_bytes(array)  # a CSR tile's three arrays (gpu_sparse.py)
        with self.lock:
            e = self.entries.get((key, device))
            if e is not None:
                self._used(key, device, e, held)
                return e.array
            self._add((key, device), _Entry(array, nbytes, 1 if held else 0))
            return array

    def _used(self, key: tuple, device: int, e: _Entry, held: bool) -> None:
        """``e`` (``key`` on ``device``) was just asked for: the most recently used, and held
        by the run when ``held``. The caller holds the lock."""
        self.entries.move_to_end((key, device))
        if held:
            self._hold(e)

    def _hold(self, e: _Entry) -> None:  # the caller holds the lock
        if e.uses == 0:
            self.idle_bytes -= e.nbytes
        e.uses += 1

    def _let_go(self, e: _Entry) -> None:  # the caller holds the lock; e.uses > 0
        e.uses -= 1
        if e.uses == 0:
            self.idle_bytes += e.nbytes

    def _add(self, where, e: _Entry) -> None:  # the caller holds the lock
        self.entries[where] = e
        self.ids[id(e.array)] = where
        self.names.setdefault(where[0][0], set()).add(where)
        self.bytes += e.nbytes
        if e.uses == 0:
            self.idle_bytes += e.nbytes

    def release(self, array) -> None:
        """The run let ``array`` go (its last reader ran): idle again, if it is cached."""
        with self.lock:
            where = self.ids.get(id(array))
            e = self.entries.get(where) if where is not None else None
            if e is None or e.array is not array or e.uses == 0:
                return
            self._let_go(e)

    def run_ended(self) -> None:
        """The run is over: it holds nothing any more."""
        with self.lock:
            for e in self.entries.values():
                e.uses = 0
            self.idle_bytes = self.bytes

    def discard(self, array) -> None:
        """``array`` leaves the cache (the budget moved it to host memory)."""
        with self.lock:
            where = self.ids.get(id(array))
            e = self.entries.get(where) if where is not None else None
            if e is not None and e.array is array:
                self._drop(where)

    # -- room ----------------------------------------------------------------------------------
    def resident_bytes(self, where) -> int:
        """The bytes of the cached arrays at ``where``, a set of ``(key, device)``: a box
        counts on the device that holds it, not for a Load on another (which copies it)."""
        with self.lock:
            return sum(self.entries[w].nbytes for w in where if w in self.entries)

    def make_room(self, nbytes: int, keep=frozenset()) -> int:
        """Drop idle entries, least recently used first (pending outputs first of all, then
        those whose key is not in ``keep``, then the rest), until ``nbytes`` are freed or none
        is left; the bytes freed."""
        freed = 0
        with self.lock:
            idle = [(k, e) for k, e in self.entries.items() if e.uses == 0]
            order = [k for k, e in idle if k[0][1] is None] + \
                [k for k, e in idle if k[0][1] is not None and k[0] not in keep] + \
                [k for k, e in idle if k[0][1] is not None and k[0] in keep]
            for where in order:
                if freed >= nbytes:
                    break
                freed += self._drop(where)
                self.evicted += 1
        return freed

    def _drop(self, where) -> int:  # the caller holds the lock
        e = self.entries.pop(where)
        if self.ids.get(id(e.array)) == where:
            del self.ids[id(e.array)]
        same = self.names.get(where[0][0])
        if same is not None:
            same.discard(where)
            if not same:
                del self.names[where[0][0]]
                self.deps.pop(where[0][0], None)
        self.bytes -= e.nbytes
        if e.uses == 0:
            self.idle_bytes -= e.nbytes
        return e.nbytes

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.ids.clear()
            self.names.clear()
            self.deps.clear()
            self.bytes = self.idle_bytes = 0

    # -- versions --------------------------------------------------------------------------
    def keep_version(self, name: str, version: int) -> None:
        """Drop the tiles of ``name`` at any version but ``version`` (the one a run reads)."""
        name = name.lower()
        with self.lock:
            for where in [w for w in self.names.get(name, ()) if w[0][1] not in (None, version)]:
                self._drop(where)
            self._drop_lets(lambda n, v: n == name and v != version)

    def let_reads(self, name: str, deps: frozenset) -> None:
        """LET value ``name`` ("=identity", devlets.py) reads the stored ``deps``."""
        with self.lock:
            self.deps[name] = deps

    def _drop_lets(self, stale) -> None:  # the caller holds the lock
        """Drop every tile of the LET values that read a ``stale(name, version)``."""
        for let in [n for n, deps in self.deps.items() if any(stale(*d) for d in deps)]:
            for where in list(self.names.get(let, ())):
                self._drop(where)
            self.deps.pop(let, None)

    def hold_outputs(self, name: str, version: int, tiles) -> None:
        """The device arrays of a stored output's tiles, ``[(starts, stops, device, array)]``,
        kept until the store commits ``version`` of ``name`` (``committed``); those of an
        earlier run of the same name are replaced."""
        name = name.lower()
        with self.lock:
            for where in [w for w in self.names.get(name, ()) if w[0][1] is None]:
                self._drop(where)
        for starts, stops, device, array in tiles:
            self.put((name, None, tuple(starts), tuple(stops), int(version)), device, array,
                     held=False)

    def committed(self, stored, retired) -> None:
        """The store committed: ``stored`` (TensorMetas) are the new versions (the pending
        tiles held for one of them become its tiles), ``retired`` the versions replaced or
        dropped (their tiles go). Every other pending tile goes too: its run's outputs were
        not committed, or were replaced again in the same transaction."""
        if not self.entries and not self.deps:  # nothing held (a CPU run's graph cache,
            with self.lock:                      # mostly): nothing to drop or promote
                if not self.entries and not self.deps:
                    return
        final = {m.name.lower(): m for m in stored}  # a name stored twice: its last version
        gone = {(m.name.lower(), m.version) for m in retired}
        with self.lock:
            self._drop_lets(lambda n, v: (n, v) in gone or n in final and final[n].version != v)
            names = {n for n, _ in gone} | set(final) | \
                {n for n in self.names if any(w[0][1] is None for w in self.names[n])}
            for where in [w for n in names for w in list(self.names.get(n, ()))]:
                key, device = where
                m = final.get(key[0])
                if (key[0], key[1]) in gone or \
                        (key[1] is not None and m is not None and key[1] != m.version):
                    self._drop(where)
                elif key[1] is None:
                    e = self.entries[where]
                    self._drop(where)
                    if m is not None and key[4] == m.version:
                        new = ((key[0], m.version, key[2], key[3]), device)
                        if new not in self.entries:
                            self._add(new, _Entry(e.array, e.nbytes, 0))

    # -- what EXPLAIN shows ----------------------------------------------------------------
    def nbytes(self, key: tuple, device: int) -> int:
        """The bytes of ``key``'s tile cached on ``device`` (a CSR tile's arrays); 0 if none."""
        with self.lock:
            e = self.entries.get((key, device))
            return e.nbytes if e is not None else 0

    def resident(self, plan, devices, device_of) -> dict:
        """Per stored input of ``plan``: its Loads, how many find their tile cached on their
        device (``device_of(worker)``), how many on another of ``devices`` only (a peer copy),
        and the bytes already in place (a CSR tile's arrays); the same for the LET values the
        plan computes that are held already (``"name (LET)"``; cut out of the run)."""
        out: dict[str, dict] = {}

        def count(name, key, worker):
            on = self.where(key, devices)
            r = out.setdefault(name, {"loads": 0, "resident": 0, "peer": 0, "bytes": 0})
            r["loads"] += 1
            if device_of(worker) in on:
                r["resident"] += 1
                r["bytes"] += self.nbytes(key, device_of(worker))
            elif on:
                r["peer"] += 1
        for t in plan.tasks:
            if isinstance(t, Load):
                reader = plan.readers[t.tensor]
                count(reader.meta.name, load_key(t, reader), t.worker)
        idents = identities(plan)
        workers = {t.key: t.worker for t in plan.tasks} if idents else {}
        for key, (ckey, _, _) in held_tiles(plan, idents).items():
            name = next(n for n, (i, _) in idents.items() if "=" + i == ckey[0])
            count(f"{name} (LET)", ckey, workers.get(key, 0))
        return out

    def where(self, key: tuple, devices) -> list[int]:
        """Which of ``devices`` ``key`` is cached on."""
        with self.lock:
            return [d for d in devices if (key, d) in self.entries]


def _overlap(k: tuple, starts, stops) -> int:
    n = 1
    for a, b, p, q in zip(starts, stops, k[2], k[3]):
        n *= max(0, min(b, q) - max(a, p))
    return n


def _cover(starts, stops, keys) -> list | None:
    """Some of ``keys`` (largest overlap first) whose boxes cover the box ``starts``-``stops``
    (checked on the cells their boundaries cut it into), or None."""
    cuts = [sorted({a, b} | {c for k in keys for c in (k[2][d], k[3][d]) if a < c < b})
            for d, (a, b) in enumerate(zip(starts, stops))]
    cells = [()]
    for c in cuts:
        cells = [cell + ((lo, hi),) for cell in cells for lo, hi in zip(c, c[1:])]
    if len(cells) > 1 << 16:  # cut into too many pieces to be worth assembling
        return None
    picked, left = [], set(cells)
    for k in keys:
        inside = {cell for cell in left
                  if all(p <= lo and hi <= q for (lo, hi), p, q in zip(cell, k[2], k[3]))}
        if inside:
            picked.append(k)
            left -= inside
        if not left:
            return picked
    return None
