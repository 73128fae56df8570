"""A payload written in parts by the processes that computed its tiles: the writer lays its
output out grouped by plan worker (each worker's tiles back to back), cuts the layout into parts
of at least ``MIN_PART`` bytes, each inside one worker's run; whoever finishes the last tile of a
part uploads it while the rest of the query computes.

- Dask workers (``PartObjects``, ``write_object_slot``): each part is an object of its own,
  ``<version>-<id16>.<start>-<run>.bin`` (objects.part_name), put with one PutObject from
  the worker's memory; the catalog row of each tile names its part object
  (``TileEntry.file``) with the tile's offset in the version's layout, and a reader fetches a
  tile from its part at ``offset - start``. Nothing is completed at commit: the parts are
  there, and the COMMIT of the catalog rows naming them is the commit. An abort lists the
  version's part objects (one listing by key prefix) and deletes them, after the workers have
  forgotten the run (a put that lands later is deleted by its worker, ``forget_spools``; the
  run in the name keeps that from touching a later attempt's part); a part a dead worker put
  is an orphan the next open for writing deletes by listing, as any object of a version the
  catalog does not hold.
- The local pool (``PartUploads``, an output of ``reserved.POOL_PARTS_MIN`` or more): one S3
  multipart upload, whose parts pool threads upload from the staging buffer; the commit
  completes it just before the catalog's COMMIT (the object appears then, whole); an abort
  aborts it, and an upload left by a killed client is aborted by the next open for writing
  (objectdb.py).

    parts = cut_parts(layout)       # [(start, stop, [coords...])], or None: put whole instead
    up = PartUploads(objects, file, database, parts)   # the upload opened
    up.tile_done(coords, buffer)    # a part's last tile: its upload submitted
    up.complete(buffer)             # the rest uploaded, the object completed

Why objects of their own for the workers: moto (the tests' S3 server) joins a multipart upload's
parts in Python at completion, and for 128 MiB in 16 parts that took as long as a PutObject of
the whole (docs/benchmarks.md); S3 completes without copying, but a part object costs S3 no
more than a part either. S3 takes parts of 5 MiB to 5 GiB (all but the last), at most 10,000;
an output whose layout cannot be cut so (two workers with under 5 MiB each, say) is written
whole, as before. The S3 calls are boto3's (pyarrow's S3 client has no part API); without boto3
every payload is uploaded whole by pyarrow (objects.py).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from ..errors import OperationalError
from .identity import process_label
from .objects import part_name, parts_prefix
from .slots import TileFacts, flat_tile

__all__ = ["MIN_PART", "PART_TARGET", "order_tiles", "cut_parts", "PartUploads", "PartObjects",
           "ObjectSlot", "write_object_slot", "forget_spools"]

MIN_PART = 5 << 20  # S3's smallest part, but the last
PART_TARGET = 8 << 20  # a part is cut once it holds this much: uploads start early, fewer calls
MAX_PARTS = 10_000
# Dask workers put each part as an object of its own (PartObjects); False: as parts of one
# multipart upload the client opens and completes (PartUploads), the way before, kept so that
# bench_object_store.py --ab can time the two side by side
WORKER_PART_OBJECTS = True


def order_tiles(tiles, groups, nbytes) -> list:
    """``tiles`` in the order an object written in parts lays them out: grouped by ``groups``
    (tile -> its plan worker), the groups of at least ``MIN_PART`` bytes first, then the
    smaller (at most one of them can be a part: the last), each group's tiles in order."""
    total: dict = {}
    for c in tiles:
        total[groups[c]] = total.get(groups[c], 0) + nbytes(c)
    rank = {g: (total[g] < MIN_PART, g) for g in total}
    return sorted(tiles, key=lambda c: (rank[groups[c]], c))


def cut_parts(layout, groups) -> list[tuple[int, int, list]] | None:
    """The parts of a layout (``[(coords, offset, nbytes)]`` in file order, every tile's group in
    ``groups``, each group's tiles back to back): ``[(start, stop, [coords])]`` covering the
    file, no part spanning two groups, every part but the last at least ``MIN_PART``; None
    where there is no such cut, or where the file is under ``PART_TARGET``."""
    if not layout:
        return None
    total = layout[-1][1] + layout[-1][2]
    if total < PART_TARGET:  # one PutObject of it costs less than the three requests of parts
        return None
    runs: list[list] = []  # per group, its parts: [start, [coords]]
    last_group = object()
    for coords, offset, nbytes in layout:
        g = groups[coords]
        if g != last_group:
            runs.append([[offset, []]])
            last_group = g
        run = runs[-1]
        if run[-1][1] and offset - run[-1][0] >= PART_TARGET:
            run.append([offset, []])
        run[-1][1].append(coords)
    parts = []
    for i, run in enumerate(runs):
        end = runs[i + 1][0][0] if i + 1 < len(runs) else total
        stops = [p[0] for p in run[1:]] + [end]
        cut = [[p[0], stop, p[1]] for p, stop in zip(run, stops)]
        if len(cut) > 1 and cut[-1][1] - cut[-1][0] < MIN_PART:  # a short tail joins the part
            tail = cut.pop()                                        # before it
            cut[-1][1], cut[-1][2] = tail[1], cut[-1][2] + tail[2]
        parts.extend(cut)
    if len(parts) > MAX_PARTS or any(b - a < MIN_PART for a, b, _ in parts[:-1]):
        return None
    return [(a, b, c) for a, b, c in parts]


# -- the client's side ----------------------------------------------------------------------------
class PartUploads:
    """One payload object's multipart upload, opened here: which tiles each part still waits
    for, the parts uploaded (their ETags) and those under way (on helper threads)."""

    def __init__(self, objects, file: str, database: str | None, parts) -> None:
        self.objects, self.file = objects, file
        self.parts = parts  # [(start, stop, [coords])], part n + 1 is parts[n]
        self._part_of = {c: n for n, (_, _, cs) in enumerate(parts) for c in cs}
        self._waiting = [set(cs) for _, _, cs in parts]
        self.etags: dict[int, str] = {}
        self._jobs: dict[int, object] = {}
        self._lock = threading.Lock()
        self.upload_id = objects.create_upload(file, database)
        self.closed = False

    def part_of(self, coords) -> int:
        return self._part_of[tuple(coords)]

    def tile_done(self, coords, buffer) -> None:
        """Tile ``coords`` is final in ``buffer`` (the file's bytes): a part whose last tile it
        is goes up now, on a helper thread."""
        n = self._part_of.get(tuple(coords))
        if n is None:
            return
        with self._lock:
            waiting = self._waiting[n]
            waiting.discard(tuple(coords))
            if waiting or n in self._jobs or n in self.etags:
                return
            self._jobs[n] = None  # claimed: submitted below
        self._submit(n, buffer)

    def changed(self, coords) -> None:
        """Tile ``coords`` was rewritten after its part went up: the part goes again."""
        n = self._part_of.get(tuple(coords))
        if n is not None:
            self._wait(n)
            with self._lock:
                self.etags.pop(n, None)
                self._jobs.pop(n, None)

    def took(self, n: int, etag: str) -> None:
        """A worker in another process uploaded part ``n`` (its ``ObjectSlot``)."""
        with self._lock:
            self.etags[n] = etag
            self._waiting[n].clear()

    def _submit(self, n: int, buffer) -> None:
        from . import background
        a, b, _ = self.parts[n]
        data = bytes(memoryview(buffer).cast("B")[a:b])
        job = background.submit(self._put, n, data)
        with self._lock:
            self._jobs[n] = job
        if job is None:  # no helper thread: here
            self._put(n, data)

    def _put(self, n: int, data: bytes) -> None:
        etag = self.objects.upload_part(self.file, self.upload_id, n + 1, data)
        with self._lock:
            self.etags[n] = etag

    def _wait(self, n: int) -> None:
        with self._lock:
            job = self._jobs.get(n)
        if job is not None:
            job.result()

    def complete(self, buffer=None) -> None:
        """Every part not uploaded yet goes up from ``buffer`` (in parallel), then the object
        is completed: it exists, whole, from now on."""
        for n in range(len(self.parts)):
            with self._lock:
                todo = n not in self.etags and self._jobs.get(n) is None
            if todo:
                if buffer is None:
                    raise OperationalError(f"cannot store {self.objects.url_of(self.file)}: "
                                           f"part {n + 1} of {len(self.parts)} was never "
                                           "uploaded (a worker was lost)")
                with self._lock:
                    self._jobs[n] = None
                self._submit(n, buffer)
        for n in range(len(self.parts)):
            self._wait(n)
        self.objects.complete_upload(self.file, self.upload_id,
                                     [(n + 1, self.etags[n]) for n in range(len(self.parts))])
        self.closed = True

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        for n in list(self._jobs):
            try:
                self._wait(n)
            except Exception:  # noqa: BLE001 - it is being thrown away
                pass
        self.objects.abort_upload(self.file, self.upload_id)


class PartObjects:
    """The parts of one payload that Dask workers put as objects of their own (see above):
    which part each tile is in, and the object each part's worker reported (None: all its
    tiles zero, nothing put)."""

    upload_id = None  # no multipart upload: an ObjectSlot with no upload id puts an object

    def __init__(self, objects, file: str, database: str | None, parts) -> None:
        self.objects, self.file, self.parts = objects, file, parts
        self._part_of = {c: n for n, (_, _, cs) in enumerate(parts) for c in cs}
        self.names: dict[int, str | None] = {}
        self._lock = threading.Lock()
        self.closed = False

    def part_of(self, coords) -> int:
        return self._part_of[tuple(coords)]

    def name_of(self, coords) -> str | None:
        """The object tile ``coords`` lies in (None: its part has not come back)."""
        return self.names.get(self._part_of[tuple(coords)])

    def took(self, n: int, name: str | None) -> None:
        """A worker put part ``n`` as object ``name`` (None: all its tiles zero, no object)."""
        with self._lock:
            self.names[n] = name

    def put(self) -> list[str]:
        """The part objects reported put."""
        return [n for n in self.names.values() if n is not None]

    def complete(self, buffer=None) -> None:
        """Every part came back: the tiles' rows can name them (there is nothing to complete)."""
        missing = [n for n in range(len(self.parts)) if n not in self.names]
        if missing:
            raise OperationalError(f"cannot store {self.objects.url_of(self.file)}: part "
                                   f"{missing[0] + 1} of {len(self.parts)} was never uploaded "
                                   "(a worker was lost)")
        self.closed = True

    def abort(self) -> None:
        """Delete the version's part objects, those reported and any other (a part whose facts
        never came back): one listing by their names' prefix."""
        if self.closed:
            return
        self.closed = True
        found = set(self.put())
        found.update(self.objects.names_starting(parts_prefix(self.file)))
        for name in sorted(found):
            self.objects.delete(name)


# -- a worker's side ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectSlot:
    """Where a worker in another process puts one output tile: at ``offset`` of part ``part``
    (1-based, bytes ``[start, stop)`` of payload ``file``'s layout, made of the tiles at
    ``offsets``): an object of its own (``upload_id`` None, ``PartObjects``)
    or that part of the multipart upload ``upload_id``; ``shape``, ``dtype`` (a NumPy dtype
    string), the database's id, the tensor's name (for messages)."""

    objects: object
    file: str
    upload_id: str
    part: int
    start: int
    stop: int
    offsets: tuple
    offset: int
    shape: tuple
    dtype: str
    database: str | None
    tensor: str


@dataclass(frozen=True)
class PartFacts(TileFacts):
    """A tile's facts, and the part it completed, if it was that part's last: (number, ETag)
    of a multipart upload's part, (number, object name) of a part object, (number, None) of a
    part object all of whose tiles are zero (not put: no row names it)."""

    part: tuple | None = None


# (run, upload id or file, part) -> [bytearray of the part, offsets still missing, any tile kept]:
# the parts this process is filling, each uploaded and forgotten by the task that fills it last
_SPOOLS: dict[tuple, list] = {}
_SPOOL_LOCK = threading.Lock()
_FORGOTTEN: dict[str, None] = {}  # runs given up here (the latest): a late part put is deleted
_FORGOTTEN_MAX = 256
_PUTTING: dict[str, int] = {}  # run -> its part objects going up in this process now
_PUT_DONE = threading.Condition(_SPOOL_LOCK)


def write_object_slot(run: str, slot: ObjectSlot, tile) -> PartFacts:
    """Put ``tile`` into its part (in this process's memory); the task that puts a part's last
    tile uploads the part and returns what it put with the tile's facts."""
    flat, nnz, nonfinite, crc, keep = flat_tile(slot, tile, slot.objects.url_of(slot.file))
    if not slot.objects.multipart:
        raise OperationalError(f"{process_label()} cannot write tensor '{slot.tensor}' to "
                               f"{slot.objects.url_of(slot.file)}: boto3 is not installed "
                               "here", hint="pip install 'tensordb[s3]' on every Dask worker")
    if slot.database is not None:
        problem = slot.objects.problem(slot.database)
        if problem is not None:
            raise OperationalError(f"{process_label()} cannot write tensor '{slot.tensor}' to "
                                   f"{slot.objects.url_of(slot.file)}: {problem}")
    key = (run, slot.upload_id or slot.file, slot.part)
    at = slot.offset - slot.start
    with _SPOOL_LOCK:
        spool = _SPOOLS.get(key)
        if spool is None:
            spool = _SPOOLS[key] = [bytearray(slot.stop - slot.start), set(slot.offsets), False]
    if keep:  # an all-zero tile leaves its place as it is: zeros
        spool[0][at:at + flat.nbytes] = memoryview(flat).cast("B")
    with _SPOOL_LOCK:
        spool[1].discard(slot.offset)
        spool[2] = spool[2] or keep
        last = not spool[1] and _SPOOLS.pop(key, None) is not None
    part = None
    if last and slot.upload_id is not None:
        etag = slot.objects.upload_part(slot.file, slot.upload_id, slot.part, spool[0])
        part = (slot.part, etag)
    elif last:
        part = (slot.part, _put_part(run, slot, spool[0]) if spool[2] else None)
    return PartFacts(int(flat.nbytes), int(nnz), bool(nonfinite), int(crc), keep, part)


def _put_part(run: str, slot: ObjectSlot, data: bytearray) -> str:
    """Put a part as an object of its own (one PutObject); its name. A run given up
    (``forget_spools``) puts nothing more: its client lists and deletes what was put once
    every worker has forgotten it."""
    name = part_name(slot.file, slot.start, run)
    with _SPOOL_LOCK:
        if run in _FORGOTTEN:
            raise OperationalError(f"the query writing tensor '{slot.tensor}' was given up")
        _PUTTING[run] = _PUTTING.get(run, 0) + 1
    try:
        slot.objects.put_bytes(data, name, slot.database)
    finally:
        with _SPOOL_LOCK:
            _PUTTING[run] -= 1
            if not _PUTTING[run]:
                del _PUTTING[run]
            _PUT_DONE.notify_all()
    if run in _FORGOTTEN:  # given up while it went, and forget_spools waited no longer
        slot.objects.delete(name)
        raise OperationalError(f"the query writing tensor '{slot.tensor}' was given up")
    return name


def forget_spools(run: str, wait: float = 60.0) -> None:
    """Drop the parts a run left unfinished in this process (a query given up); no part of it
    is put from now on, and those going up now are waited for (up to ``wait`` seconds; one
    landing later is deleted by its task): the client lists the parts after this."""
    with _SPOOL_LOCK:
        _FORGOTTEN[run] = None
        while len(_FORGOTTEN) > _FORGOTTEN_MAX:
            del _FORGOTTEN[next(iter(_FORGOTTEN))]
        for key in [k for k in _SPOOLS if k[0] == run]:
            del _SPOOLS[key]
        _PUT_DONE.wait_for(lambda: run not in _PUTTING, timeout=wait)
