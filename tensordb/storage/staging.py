"""The payload file's low-level parts: the staging buffers reserved outputs are computed in
(``StagingBuffers``, kept between commits), a new file's disk blocks allocated up front
(``allocate``), and its sync started on helper threads while the catalog rows are written
(``sync_in_background``: the file's ``fdatasync`` and one ``fsync`` of its directory shared by
every output of the commit; docs/storage.md "The durable steps of a commit")."""
from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading

import numpy as np

from . import background

__all__ = ["ALIGN", "STAGE_MAX", "STREAM_TILE_MAX", "StagingBuffers", "allocate", "no_wait",
           "one_directory_sync", "open_payload", "sync_early", "sync_in_background", "write_all"]

ALIGN = 64  # cache-line and SIMD friendly; NumPy and BLAS like aligned buffers

# Reserved tiles of a payload file up to this size are computed in anonymous memory and written
# into the file by pwrite (each as it is finished, write_early, or at commit): a fresh shared
# file mapping takes a page fault per 4 KiB page written (a 16 MiB SGD update spent twice its
# arithmetic in them), anonymous memory comes in huge pages and the write copies at memory
# speed. A larger file is streamed or mapped (its pages can be written back and dropped under
# memory pressure; anonymous ones cannot).
STAGE_MAX = 64 << 20
# A file larger than STAGE_MAX whose tiles are all up to this size is streamed where the commit
# fsyncs (reserve): each tile written as it is finished, its memory then reused by the allocator.
STREAM_TILE_MAX = 16 << 20
_SMALL_FILE = 1 << 20  # up to this size a payload file's blocks are reserved by writing zeros


class StagingBuffers:
    """A store's anonymous buffers for staged outputs (``TensorWriter.reserve``), kept after a
    commit for the next writer. A fresh allocation of tens of MiB takes new pages from the
    kernel each time (glibc maps one above 32 MiB afresh and unmaps it when freed; on a virtual
    machine that hands freed memory back to its host, each page then faults in the host too):
    a block-sparse product's 32 MiB output, staged anew for each query, took its kernels 2.5x
    their time. A kept buffer is reused only once nothing refers to it: an array made from a
    tile staged in it (a run's result) keeps it, and it is skipped until then. At most
    ``max_bytes`` of staged files are kept (the oldest go first; a buffer is ``ALIGN`` bytes
    more than the file it stages, for alignment); buffers under ``min_bytes`` are not kept
    (the heap reuses small allocations by itself)."""

    def __init__(self, max_bytes: int = STAGE_MAX, min_bytes: int = 1 << 20) -> None:
        self.max_bytes, self.min_bytes = max_bytes, min_bytes
        self._kept: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 buffer of at least ``nbytes``: a kept one no more than twice as
        large that nothing refers to, else a new one."""
        if nbytes >= self.min_bytes:
            with self._lock:
                for k in range(len(self._kept)):
                    raw = self._kept[k]
                    # references: the list's, ``raw``'s and getrefcount's argument: no view
                    if nbytes <= raw.nbytes <= 2 * nbytes and sys.getrefcount(raw) <= 3:
                        del self._kept[k]
                        return raw[:nbytes]
        return np.empty(nbytes, np.uint8)

    def keep(self, raw: np.ndarray) -> None:
        raw = raw.base if raw.base is not None else raw  # the allocation, not a slice of it
        if raw.nbytes < self.min_bytes or raw.nbytes > self.max_bytes + ALIGN:
            return
        with self._lock:
            if any(k is raw for k in self._kept):
                return
            self._kept.append(raw)
            self._trim()

    def _trim(self) -> None:
        while self._kept and sum(k.nbytes - ALIGN for k in self._kept) > self.max_bytes:
            self._kept.pop(0)

    def cap(self, limit: int | None) -> None:
        """Keep at most ``limit`` bytes (None: ``STAGE_MAX``), dropping the oldest beyond it."""
        with self._lock:
            self.max_bytes = STAGE_MAX if limit is None else min(STAGE_MAX, max(0, limit))
            self._trim()

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes for k in self._kept)


def allocate(fd: int, size: int) -> None:
    """Give the file ``size`` bytes of real disk blocks before it is memory-mapped: a mapping
    over blocks the disk does not have ends in SIGBUS when it fills up, not in an error. Blocks
    allocated up front also make the page faults of computing in place cheaper. A small file
    gets its blocks by a write of zeros (delayed allocation reserves them, and a full disk is an
    error here too): fallocate's unwritten extents are journalled metadata that can make the
    file's later unlink wait milliseconds for the file system's journal."""
    if size <= _SMALL_FILE:
        write_all(fd, bytes(size))
        return
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise  # ENOSPC, EDQUOT, EFBIG: the caller reports it
    chunk = bytes(1 << 20)  # a file system without fallocate: write the zeros ourselves
    at = 0
    while at < size:
        at += os.pwrite(fd, chunk[:min(len(chunk), size - at)], at)


def no_wait() -> None:
    pass


def sync_early(fd: int):
    """Start ``fdatasync(fd)`` on a helper thread (then close ``fd``, a duplicate the job
    owns): the job, or None where no helper can start (``fd`` is closed then)."""
    job = background.submit(_fsync_close, fd)
    if job is None:
        os.close(fd)
    return job


def sync_in_background(fd: int, directory: str, early=(), covered: bool = False):
    """Make ``fd``'s bytes and ``directory``'s entries durable on helper threads (then close
    ``fd``): the file's ``fdatasync`` and the directory's ``fsync`` at once, so the file
    system's journal commits both together where one after the other waits for two commits;
    the caller writes its catalog rows meanwhile. The directory's fsync is shared by every
    file of the commit (``_sync_dir``). ``early``: the jobs (``sync_early``) that synced the
    file during the run, each waited for too (a write-back error is reported to one fdatasync
    of a file description only, so none is left unread); ``covered``: the last of them
    started after the file's last byte was written, so no other fdatasync of the same bytes
    is made. Returns the wait (it raises their OSError)."""
    if covered and early:
        os.close(fd)
        file_job = None
    else:
        file_job = background.submit(_fsync_close, fd)
        if file_job is None:  # the interpreter is shutting down: no new threads, sync here
            _fsync_close(fd)
    dir_job = _sync_dir(directory)
    if dir_job is None:
        _fsync_dir(directory)
    # (the early jobs first: their positions are not the file's and the directory's jobs')
    jobs = [j for j in (*early, file_job, dir_job) if j is not None]

    def wait() -> None:
        errors = []
        for job in jobs:
            try:
                job.result()
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
    return wait


# The directory fsync of the commit under way on this thread (``one_directory_sync``): a commit
# of several outputs (a training step's weights) waits for one fsync of ``tiles/``, not one per
# output; each was one more request to the disk on the four helper threads (four 256 KiB
# outputs: 1.24 -> 1.14 ms for their syncs, docs/benchmarks.md "The durable commit").
_batch = threading.local()


@contextlib.contextmanager
def one_directory_sync():
    """Within: the files synced by ``sync_in_background`` on this thread share one fsync of
    each directory, the first one started. Enter it only once every file the block syncs has
    been created (or renamed) in its directory: that fsync starts after the block began, so
    it covers them all."""
    outer = getattr(_batch, "jobs", None)
    _batch.jobs = {}  # a nested block shares nothing with the outer one: files may be newer
    try:
        yield
    finally:
        _batch.jobs = outer


def _sync_dir(directory: str):
    """The job that fsyncs ``directory`` for this caller (None: no helper thread can start)."""
    jobs = getattr(_batch, "jobs", None)
    if jobs is None:
        return background.submit(_fsync_dir, directory)
    job = jobs.get(directory)
    if job is None:
        job = jobs[directory] = background.submit(_fsync_dir, directory)
    return job


# fdatasync writes the file's bytes and what reading them back needs (its size, its blocks),
# not its times: a recycled payload file (same size, blocks allocated) then needs no journal
# commit of its own. Where the platform has none (macOS), fsync.
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_close(fd: int) -> None:
    try:
        _datasync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data) -> None:
    view = memoryview(data)
    while len(view):
        n = os.write(fd, view)
        view = view[n:]


def open_payload(store, path: str, size: int) -> tuple[int, bool]:
    """The new payload file, ``size`` bytes with their disk blocks, and whether it is
    recycled: a retired payload file of about that size, renamed, where the store has one
    (writing into its blocks and pages costs a third of allocating new ones, and so does
    their fsync), else a new file."""
    spare = store.take_spare(size, path)
    if spare is not None:
        fd = os.open(path, os.O_RDWR)
        try:
            if spare > size:
                os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd, True
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        allocate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd, False
