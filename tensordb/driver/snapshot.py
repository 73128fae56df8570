"""The catalog as one statement group sees it: read once, handed to every stage.

A ``Snapshot`` is taken when a group starts (``Engine.snapshot``); the binder asks it what a
name is (``has``, ``meta``, ``open``), planning reads the inputs' readers, layouts, NaN/inf and
zero facts and stored formats from it, and the lowering and the run read the very readers it
opened. Each answer is read from the store once (the store caches rows by name and tile entries
by version) and written down, so that a prepared group can later be checked by asking the same
questions again (``holds``). No stage reads the catalog during the group for what the snapshot
has: the tile-join SQL of the lowering (presence of tiles at an operation's grid) is the one
read left, and runs only for grids the stored tiles do not give directly.

>>> import numpy as np, tensordb
>>> con = tensordb.connect()
>>> con.load("A", np.ones((2, 3)))
>>> snap = Snapshot(con.store)
>>> snap.has("A"), snap.facts("A"), snap.holds(snap.answers)
(True, (True, True), True)
"""
from __future__ import annotations

import functools
from typing import Iterable

import numpy as np

from ..errors import Error
from ..optimizer import StoredStats
from ..storage.reader import TensorReader

__all__ = ["Snapshot", "meta_key", "row_profile", "row_reach"]


def row_profile(reader) -> np.ndarray:
    """The nonzeros of a stored matrix before each of its rows (rows + 1 counts): the sum over
    its column tiles of each row tile's CSR row pointers; a dense or COO tile counts its
    ``nnz`` spread evenly over its rows.

    >>> import numpy as np, scipy.sparse as sp, tensordb
    >>> con = tensordb.connect()
    >>> con.load("S", sp.csr_array(np.array([[1.0, 2, 0, 0], [0, 0, 0, 3]] + [[0.0] * 4] * 6)))
    >>> row_profile(con.store.open_many(["S"])["S"]).tolist()
    [0, 2, 3, 3, 3, 3, 3, 3, 3]
    """
    meta = reader.meta
    rows_b, cols_b = meta.grid
    counts = np.zeros(meta.shape[0], np.int64)
    for (r, c), e in reader.entries.items():
        lo, hi = rows_b[r], rows_b[r + 1]
        if e.format == "csr":
            counts[lo:hi] += np.diff(reader.stored_tile((r, c)).indptr)
        elif hi > lo:
            spread = np.diff(np.linspace(0, int(e.nnz), hi - lo + 1).round().astype(np.int64))
            counts[lo:hi] += spread
    out = np.zeros(meta.shape[0] + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def row_reach(reader, counts: np.ndarray, chunk: int = 1 << 20) -> np.ndarray | None:
    """For each row of a stored matrix, the sum of ``counts`` (one per column) over the columns
    where the row has a stored entry: with ``counts`` another matrix's entries per row, the
    products each row of this matrix times that one forms. Its CSR tiles' column indices are
    read ``chunk`` entries at a time (planning holds no copy of a tile's entries), a dense
    tile's nonzero elements counted; None where a tile is stored otherwise.

    >>> import numpy as np, scipy.sparse as sp, tensordb
    >>> con = tensordb.connect()
    >>> con.load("S", sp.csr_array(np.array([[1.0, 2, 0, 0], [0, 0, 0, 3]] + [[0.0] * 4] * 6)))
    >>> row_reach(con.store.open_many(["S"])["S"], np.array([1, 2, 3, 4]))[:3].tolist()
    [3.0, 4.0, 0.0]
    """
    meta = reader.meta
    rows_b, cols_b = meta.grid
    counts = np.asarray(counts, np.float64)
    out = np.zeros(meta.shape[0], np.float64)
    for (r, c), e in reader.entries.items():
        part = counts[cols_b[c]:cols_b[c + 1]]
        lo = rows_b[r]
        if e.format == "dense":
            out[lo:rows_b[r + 1]] += (reader.stored_tile((r, c)) != 0) @ part
            continue
        if e.format != "csr":
            return None
        tile = reader.stored_tile((r, c))
        ptr, ind = tile.indptr, tile.indices
        cuts = np.unique(np.r_[0, np.searchsorted(ptr, np.arange(chunk, int(ptr[-1]), chunk)),
                              len(ptr) - 1])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            rows = np.repeat(np.arange(b - a), np.diff(ptr[a:b + 1]))
            out[lo + a:lo + b] += np.bincount(rows, weights=part[ind[ptr[a]:ptr[b]]],
                                              minlength=b - a)
    return out


def meta_key(m) -> tuple:
    """What the binder reads of a tensor's catalog entry (not its version). The dtype by its
    code (``'<f4'``): ``str`` of a NumPy dtype is Python code, and a repeated statement
    compares these for every tensor it names."""
    return (m.name, tuple(m.shape), m.dtype.str, tuple(m.dims), m.grid)


class Snapshot:
    """One statement group's view of ``store`` (see the module's docstring). ``epoch``: the
    store's epoch when it was taken; ``keepable``: every question asked of it is written down
    (a listing, asked for an error's hint, is not, and nothing is then kept)."""

    def __init__(self, store) -> None:
        self.store = store
        self.epoch = store.epoch
        self.keepable = True
        self._readers: dict = {}
        self._facts: dict = {}
        self._answers: dict[tuple[str, object], object] = {}
        self._seen: dict[str, object] = {}  # a plain name -> its catalog entry (or None) then

    # -- what the binder asks (bind.GroupBinder's catalog) --------------------------------------
    def has(self, name: str) -> bool:
        if type(name) is str:
            m = self.store.find(name)
            self._seen.setdefault(name, m)
            out = m is not None
        else:
            out = self.store.has(name)
        self._note("has", name, out)
        return out

    def meta(self, name: str):
        m = self.store.meta(name)
        if type(name) is str:
            self._seen.setdefault(name, m)
        self._note("meta", name, meta_key(m))
        return m

    def open(self, name: str) -> TensorReader:
        reader = self.readers([name])[name]
        if type(name) is str:
            self._seen.setdefault(name, reader.meta)
        self._note("open", name, self.facts(name))
        return reader

    def list(self):
        self.keepable = False  # an error's hint: nothing to check a kept answer by
        return self.store.list()

    # -- what planning reads ----------------------------------------------------------------------
    def readers(self, names: Iterable) -> dict:
        """name -> reader of its version at this snapshot, the tile entries of all not opened
        yet read in one query (``Store.open_many``)."""
        names = list(names)
        missing = [n for n in dict.fromkeys(names) if n not in self._readers]
        if missing:
            self._readers.update(self.store.open_many(missing))
        return {n: self._readers[n] for n in names}

    def facts(self, name) -> tuple[bool, bool]:
        """(finite, nonzero) of an input (``TensorReader.facts``), computed once."""
        if name not in self._facts:
            self._facts[name] = self.readers([name])[name].facts()
        return self._facts[name]

    def layouts(self, names) -> dict:
        """name -> ``TensorReader.layout()`` (the plan's key), each computed once and written
        down as an answer: a prepared plan holds while its inputs keep their layouts."""
        out, answers, readers = {}, self._answers, None
        for name in names:
            key = ("layout", name)
            found = answers.get(key)
            if found is None:
                if readers is None:
                    readers = self.readers(names)
                found = answers[key] = readers[name].layout()
            out[name] = found
        return out

    def stored_stats(self, names) -> dict:
        """Per stored input, its tiles' formats, nonzeros and payload bytes (the catalog's):
        the optimizer prices sparse inputs by them, and EXPLAIN shows them. A slice's or a
        gather's reader (storage/boxes.py) is read densified: it has none."""
        out = {}
        for name, r in self.readers(names).items():
            own = getattr(r, "sparse_stats", None)
            if own is not None and r.has_sparse:  # computed sparse: a one-hot's rows
                out[name] = StoredStats(*own())
                continue
            if not isinstance(r, TensorReader):
                continue
            entries = r.entries.values()
            profile = reach = None
            nnz = sum(int(e.nnz) for e in entries)
            # (not for a hypersparse matrix: a count per row would be ~8 bytes a row, 80 GB
            # for 10^10 rows of 5 entries, made at planning with no reservation)
            if r.meta.ndim == 2 and r.has_sparse and r.meta.shape[0] <= 4 * nnz + (1 << 20):
                profile = functools.partial(self._row_profile, name, r)
                reach = functools.partial(row_reach, r)
            out[name] = StoredStats(tuple(sorted({e.format for e in entries})) or ("dense",),
                                    sum(int(e.nnz) for e in entries),
                                    sum(int(e.nbytes) for e in entries), r.meta.fill, profile,
                                    reach)
        return out

    def _row_profile(self, name, reader):
        """A stored matrix's nonzeros before each row (``StoredStats.row_profile``), made once:
        its CSR tiles' row pointers (views of their payloads), a dense tile's nonzeros spread
        evenly over its rows."""
        key = ("rows", name)
        if key not in self._facts:
            self._facts[key] = row_profile(reader)
        return self._facts[key]

    # -- checking what was read -------------------------------------------------------------------
    @property
    def answers(self) -> tuple:
        """Every answer written down, as (question, name, answer)."""
        return tuple((q, name, a) for (q, name), a in self._answers.items())

    @property
    def seen(self) -> tuple:
        """(name, catalog entry or None) of each plain name asked about, as it was then: every
        answer about a name whose entry is the very same object again holds again (an entry is
        one version's row: its shape, dtype, grid, facts and layout are that version's)."""
        return tuple(self._seen.items())

    def holds(self, answers, seen=()) -> bool:
        """Whether this snapshot gives every one of ``answers`` (another snapshot's) again;
        ``seen`` (that snapshot's): the names whose entries are unchanged are not asked again
        (a training step's data; the weights it replaces each call are)."""
        try:
            same = {name for name, m in seen if self.store.find(name) is m}
            return all(name in same or self._ask(q, name) == a for q, name, a in answers)
        except Error:  # a tensor gone meanwhile: the caller binds again, and the binder says so
            return False

    def _ask(self, question: str, name):
        if question == "has":
            return self.has(name)
        if question == "meta":
            return meta_key(self.meta(name))
        if question == "open":
            return self.facts(name)
        return self.layouts([name])[name]

    def _note(self, question: str, name, answer) -> None:
        key = (question, name)
        if key not in self._answers:
            self._answers[key] = answer
        elif self._answers[key] != answer:  # the catalog changed while binding: keep nothing
            self.keepable = False
