"""GraphBLAS matrices of stored sparse boxes kept from one statement to the next (the graph cache).

A shortest-path step (``dist[k] = MIN(dist[j] + D[j,k])``, D of fill +inf) reads the same
stored graph every statement, and its kernel (exec/semiring.py) hands it to GraphBLAS, which
copies it in: 1.1M entries of an R-MAT graph were a 6 ms copy a step beside GraphBLAS's 6 ms
``vxm``, and the check of its values for a NaN or an infinity that meets the fill 1 ms more.
So a Load of a box of a stored matrix whose absent entries are not 0 (``storage.sparse.Filled``:
only the semiring kernels read such a box as it is) gives a ``Sourced`` box: the same ``Filled``,
named by what names its contents, ``(tensor, version, starts, stops)`` of one database's payload
file and that file's identity (``verify.file_identity``: its inode and times; an in-memory
payload's serial), with a ``slot`` where the kernel keeps what it made of it (the GraphBLAS
matrix in each dtype, the values' check). Payloads are immutable once committed and versions are
never reused while a database is open; a database reopened numbers them from the highest it
finds, so a tensor dropped and made again can get an old version and payload name, and only the
identity tells the files apart (a kept view keeps its file's inode from being reused).

The cache is ``devcache.DeviceCache``'s (the GPU executor's tiles kept between runs, by the same
key), its "device" the database's payload file: least recently used first, every entry idle (a
kernel holds what it reads by reference), the versions a commit replaced or dropped leave when the
store reports it (``listen``; a Load also drops the other versions of what it reads), and the
pool's admission drops entries first when a run needs room under its ``memory_limit``
(``HostTiles.cache``, exec/budget.py). It holds at most ``CAPACITY_SHARE`` of the default
memory limit, least recently used entries leaving first. A box that is a view of its payload's
mapping is kept as the view (0 bytes: the memory is the mapping's, not a copy): a hit costs no
read, no decode and no scipy object (the issue's 50,000-node SpMV read its view again each
statement: a tenth of its time). The view keeps its payload mapped, and a mapped payload is
never recycled (``storage/payloads.rename_unused``; an in-memory payload's allocation is not
taken while referenced, ``memfiles.take``), so its bytes stay that version's; the entry leaves
when the version is retired or dropped (``listen``), another version is read, or the database
closes (``closed``: a closed in-memory database's deleted files stayed mapped before). A box that is a
copy (a column slab cut from a CSR tile) is kept as well.

A box of a stored matrix of fill 0 that is a view of its payload (a whole CSR tile, a band of
its rows) is a plain scipy CSR array (the same object at each hit: nobody writes into it, its
arrays are read-only views), tagged with a ``Sourced`` entry of its
own (``source_of``): the SpGEMM kernel's GraphBLAS copy of a stored graph is kept there too (a
2,048-node R-MAT graph's ``G @ G`` copied both operands into GraphBLAS at every statement). A
fill-0 box that is a copy is not kept (it would hold memory nothing asked it to). Such an entry
counts 0 bytes until a kernel keeps something in its slot, so the cache also holds at most
``MAX_ENTRIES`` entries, the least recently used leaving first.

>>> import numpy as np, scipy.sparse as sp
>>> from tensordb.storage.sparse import Filled
>>> box = Sourced(sp.csr_array(np.eye(2)), np.inf, ("d", 1, (0, 0), (2, 2)), "db")
>>> isinstance(box, Filled), remember(box, "n", lambda: 7), remember(box, "n", lambda: 9)
(True, 7, 7)
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..storage.sparse import Filled, tile_nbytes
from .devcache import DeviceCache, _Entry

__all__ = ["Sourced", "GraphCache", "GRAPHS", "remember", "source_of", "CAPACITY_SHARE",
           "MAX_ENTRIES"]

CAPACITY_SHARE = 8  # the cache holds at most 1/8 of the default memory limit
# and at most this many entries: a fill-0 view box's entry counts 0 bytes until a kernel keeps
# something in its slot, so the byte cap alone let one accumulate for every distinct box read
# (a scan over many row bands of many tensors) until its version left
MAX_ENTRIES = 4096


@dataclass(frozen=True, eq=False)
class Sourced(Filled):
    """A ``Filled`` box of a stored matrix named by ``origin`` (tensor, version, starts, stops)
    of the payload ``where``; ``slot``: what kernels made of it, kept with it in the cache."""

    origin: tuple = ()
    where: object = None
    slot: dict = field(default_factory=dict, repr=False)

    def __reduce__(self):  # shipped to another process: a plain box (the slot stays here)
        return (Filled, (self.csr, self.fill))


_SLOT_LOCK = threading.Lock()

# fill-0 boxes (plain scipy CSR arrays, kept by their cache entries) and the entries whose slot
# they share: id -> (a weak reference to the box, one to its Sourced); a tag leaves with its box.
# Both weak: the Sourced holds the box, so a strong one here kept every box ever read (and its
# payload's mapping) alive after its entry left.
_TAGS: dict[int, tuple] = {}
_TAGS_LOCK = threading.Lock()


def _tag(csr, box: "Sourced"):
    """``csr`` (a Load's fill-0 box) with the slot of cache entry ``box`` (``source_of``)."""
    key = id(csr)

    def gone(ref, key=key, tags=_TAGS, lock=_TAGS_LOCK):
        # the dict and lock bound here: at interpreter exit the module's globals are None
        with lock:
            if tags.get(key, (None,))[0] is ref:
                del tags[key]

    with _TAGS_LOCK:
        _TAGS[key] = (weakref.ref(csr, gone), weakref.ref(box))
    return csr


def source_of(x):
    """The ``Sourced`` whose slot keeps what kernels made of box ``x``: ``x`` itself, or the
    entry of a tagged fill-0 box (the very object a Load gave: a transposed or converted copy
    of it is not tagged); None for any other box."""
    if isinstance(x, Sourced):
        return x
    found = _TAGS.get(id(x))
    if found is not None and found[0]() is x:
        return found[1]()  # None once its entry left the cache
    return None


def remember(box, key, make, size=None):
    """``box.slot[key]``, made by ``make()`` the first time (``size(value)``: the bytes it
    holds, added to its cache entry's); for a box that is not ``Sourced``, ``make()``."""
    slot = getattr(box, "slot", None)
    if slot is None:
        return make()
    found = slot.get(key)
    if found is not None:
        return found
    value = make()
    with _SLOT_LOCK:
        if key in slot:  # another worker made it meanwhile
            return slot[key]
        slot[key] = value
    if size is not None:
        GRAPHS.grew(box, int(size(value)))
    return value


def _owned(csr) -> bool:
    """Whether a CSR box owns its arrays (a copy), rather than viewing a payload's mapping."""
    base = csr.data
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, np.ndarray)


class GraphCache(DeviceCache):
    """Sourced boxes by ``(name, version, starts, stops)`` on "device" ``(database, payload)``
    (see the module's doc)."""

    def __init__(self, capacity: int | None = None, max_entries: int = MAX_ENTRIES) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_entries = max_entries
        self.hits = self.misses = 0
        self._stores: list = []  # weak references to the stores that report commits here

    def _cap(self) -> int:
        if self.capacity is None:
            from ..config import default_memory_limit
            self.capacity = int(default_memory_limit()) // CAPACITY_SHARE
        return self.capacity

    def box(self, reader, starts, stops, read):
        """The box ``[starts, stops)`` of ``reader``'s tensor, a ``Filled`` that ``read()``
        gives (or a fill-0 view of a payload, tagged): from the cache, else read and kept."""
        m = reader.meta
        name = m.name.lower()
        key = (name, m.version, tuple(int(x) for x in starts), tuple(int(x) for x in stops))
        where = (getattr(reader, "database", None), getattr(reader, "path", None), _ident(reader))
        with self.lock:
            for w in [w for w in self.names.get(name, ())
                      if w[1][0] == where[0] and w[0][1] != m.version]:
                self._drop(w)  # another version of it, in this database: stale
            e = self.entries.get((key, where))
            if e is not None:
                self.entries.move_to_end((key, where))
                self.hits += 1
        if e is not None:
            kept = e.array
            if m.fill != 0:
                return kept
            return kept.csr  # a fill-0 box: the view kept, tagged with the entry's slot
        out = read()
        if m.fill == 0 and _plain_csr(out) and not _owned(out):
            self.misses += 1
            box = Sourced(out, 0.0, key, where)
            with self.lock:
                if (key, where) not in self.entries:
                    self._add((key, where), _entry(box, 0))
                else:
                    box = self.entries[(key, where)].array
            self._trim()
            return _tag(out, box)
        if not isinstance(out, Filled):
            return out
        self.misses += 1
        csr = out.csr
        owned = _owned(csr)
        if owned:  # shared by later runs: nobody writes into it
            for a in (csr.data, csr.indices, csr.indptr):
                a.flags.writeable = False
        box = Sourced(csr, out.fill, key, where)
        with self.lock:
            if (key, where) not in self.entries:
                self._add((key, where), _entry(box, tile_nbytes(csr) if owned else 0))
        self._trim()
        return box

    def grew(self, box, nbytes: int) -> None:
        """``box``'s entry holds ``nbytes`` more (a kernel kept a GraphBLAS matrix in its slot)."""
        with self.lock:
            e = self.entries.get((box.origin, box.where))
            if e is None or e.array.slot is not box.slot:
                return
            e.nbytes += nbytes
            self.bytes += nbytes
            self.idle_bytes += nbytes
        self._trim()

    def _trim(self) -> None:
        """Least recently used entries leave while the cache holds more than its bytes or more
        than ``max_entries`` entries (every entry is idle: a kernel holds what it reads)."""
        over = self.bytes - self._cap()
        if over > 0:
            self.make_room(over)
        with self.lock:
            while len(self.entries) > self.max_entries:
                self._drop(next(iter(self.entries)))  # the least recently used
                self.evicted += 1

    def listen(self, store) -> None:
        """Have ``store`` tell the cache its commits: replaced and dropped versions leave."""
        with self.lock:
            for r in self._stores:  # every run asks: a store told already returns here
                if r() is store:
                    return
            self._stores = [r for r in self._stores if r() is not None]
            self._stores.append(weakref.ref(store))
        listeners = getattr(store, "commit_listeners", None)
        if listeners is None:
            return
        ref = weakref.ref(self)

        def committed(stored, retired, ref=ref):
            cache = ref()
            if cache is not None:
                cache.committed(stored, retired)

        def closed(store, ref=ref):
            cache = ref()
            if cache is not None:
                cache.closed(store)

        listeners.append(committed)
        closers = getattr(store, "close_listeners", None)
        if closers is not None:
            closers.append(closed)

    def closed(self, store) -> None:
        """``store`` closed: the entries of its database leave (a kept view would hold its
        payload mapped, an in-memory database's deleted file or bytes included, counted 0
        bytes, until 4096 other entries pushed it out)."""
        database = getattr(store, "database", None)
        with self.lock:
            for where in [w for w in self.entries if w[1][0] == database]:
                self._drop(where)
            self._stores = [r for r in self._stores if r() is not None and r() is not store]


def _ident(reader):
    """The identity of the payload ``reader`` maps (verify.file_identity: the file's inode and
    times; an in-memory payload's serial): part of an entry's name, as a version number is not
    unique across opens of a database (the next one is the highest found plus one, so a tensor
    dropped and made again after a reopen can have its old version and payload name). Mapped
    once per reader; a kept view keeps its file, and so its inode, from being reused."""
    mapping = getattr(reader, "mapping", None)
    if mapping is None or getattr(reader, "path", None) is None:
        return None
    mapping()
    return getattr(reader, "_ident", None)


def _plain_csr(x) -> bool:
    """Whether ``x`` is a scipy CSR array (a fill-0 box of one stored tile or part of one)."""
    return getattr(x, "format", None) == "csr" and not isinstance(x, Filled) and \
        hasattr(x, "indptr")


def _entry(box, nbytes: int) -> _Entry:
    return _Entry(box, nbytes, 0)


GRAPHS = GraphCache()
