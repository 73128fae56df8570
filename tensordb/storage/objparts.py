"""A payload object written in parts by the processes that computed its tiles (S3 multipart
upload): the writer lays its output out grouped by plan worker (each worker's tiles back to
back), cuts the layout into parts of at least ``MIN_PART`` bytes, each inside one worker's run,
and opens one multipart upload; whoever finishes the last tile of a part uploads it (a Dask
worker from its own memory, ``write_object_slot``; a thread of the local pool from the staging
buffer, ``PartUploads``), while the rest of the query computes. The commit completes the upload
just before the catalog's COMMIT (the object appears then, whole); an abort aborts it, and an
upload left by a killed client is aborted by the next open for writing (objectdb.py).

    parts = cut_parts(layout)       # [(start, stop, [coords...])], or None: put whole instead
    up = PartUploads(objects, file, database, parts)   # the upload opened
    up.tile_done(coords, buffer)    # a part's last tile: its upload submitted
    up.complete(buffer)             # the rest uploaded, the object completed

S3 takes parts of 5 MiB to 5 GiB (all but the last), at most 10,000; an output whose layout
cannot be cut so (two workers with under 5 MiB each, say) is written whole, as before.
The S3 calls are boto3's (pyarrow's S3 client has no part API); without boto3 every payload is
uploaded whole by pyarrow (objects.py).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from ..errors import OperationalError
from .identity import process_label
from .slots import TileFacts, flat_tile

__all__ = ["MIN_PART", "PART_TARGET", "order_tiles", "cut_parts", "PartUploads", "ObjectSlot",
           "write_object_slot", "forget_spools"]

MIN_PART = 5 << 20  # S3's smallest part, but the last
PART_TARGET = 8 << 20  # a part is cut once it holds this much: uploads start early, fewer calls
MAX_PARTS = 10_000


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


# -- a worker's side ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectSlot:
    """Where a worker in another process puts one output tile: at ``offset`` of part ``part``
    (1-based, bytes ``[start, stop)`` of the object, made of the tiles at ``offsets``) of the
    multipart upload ``upload_id`` of payload ``file``; ``shape``, ``dtype`` (a NumPy dtype
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
    """A tile's facts, and the part it completed (number, ETag), if it was that part's last."""

    part: tuple | None = None


# (run, upload id, part) -> [bytearray of the part, offsets still missing]: the parts this
# process is filling, each uploaded and forgotten by the task that fills it last
_SPOOLS: dict[tuple, list] = {}
_SPOOL_LOCK = threading.Lock()


def write_object_slot(run: str, slot: ObjectSlot, tile) -> PartFacts:
    """Put ``tile`` into its part (in this process's memory); the task that puts a part's last
    tile uploads the part and returns its ETag with the tile's facts."""
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
    key = (run, slot.upload_id, slot.part)
    at = slot.offset - slot.start
    with _SPOOL_LOCK:
        spool = _SPOOLS.get(key)
        if spool is None:
            spool = _SPOOLS[key] = [bytearray(slot.stop - slot.start), set(slot.offsets)]
    if keep:  # an all-zero tile leaves its place as it is: zeros
        spool[0][at:at + flat.nbytes] = memoryview(flat).cast("B")
    with _SPOOL_LOCK:
        spool[1].discard(slot.offset)
        last = not spool[1] and _SPOOLS.pop(key, None) is not None
    part = None
    if last:
        etag = slot.objects.upload_part(slot.file, slot.upload_id, slot.part, spool[0])
        part = (slot.part, etag)
    return PartFacts(int(flat.nbytes), int(nnz), bool(nonfinite), int(crc), keep, part)


def forget_spools(run: str) -> None:
    """Drop the parts a run left unfinished in this process (a query given up)."""
    with _SPOOL_LOCK:
        for key in [k for k in _SPOOLS if k[0] == run]:
            del _SPOOLS[key]
