"""Retired payload files are recycled for new versions (storage/spares.py), never under a reader.

A replace keeps the old version's payload file as a spare once the catalog no longer references
it; the next output of about that size is written into it, renamed to its own version's name.
A file still mapped in this process (a reader, an array made from its tiles) is not reused, so a
snapshot never changes under its reader. Spares are not orphans to CHECK DATABASE, and closing
deletes them.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb.storage.identity import payload_name
from tensordb.storage import memfiles, payloads, spares
from tensordb.storage.staging import ALIGN

STEP = "W[i,j] = W[i,j] - 0.5 * G[i,j]"


@pytest.fixture(autouse=True)
def _files_from_1_mib(monkeypatch):
    """These tests recycle payload files: an in-memory database's outputs of 1 MiB or more are
    files here, as before memfiles.FILE_MAX (8 MiB) kept them in the process."""
    monkeypatch.setattr(memfiles, "FILE_MAX", (1 << 20) - ALIGN - 1)


def _values(shape=(256, 128)):
    rng = np.random.default_rng(7)
    return (rng.standard_normal(shape, dtype=np.float32),
            rng.standard_normal(shape, dtype=np.float32))


def _files(con) -> set[str]:
    return set(os.listdir(con.store.tiles_dir))


def _referenced(con) -> set[str]:
    return {r[0] for r in con.store.duck.execute(
        "SELECT DISTINCT file FROM tensordb.tiles").fetchall()}


@pytest.mark.parametrize("where", ["disk", "memory"])
def test_a_repeated_replace_writes_into_retired_files(tmp_path, where):
    # in memory an output under 1 MiB has no file (memfiles.py): this one is 1 MiB
    w, g = _values((256, 128) if where == "disk" else (512, 512))
    con = tensordb.connect(tmp_path / "db" if where == "disk" else None, workers=2)
    con.load("W", w)
    con.load("G", g)
    taken = []
    take = con.store.spares.take

    def counting(size, path):
        got = take(size, path)
        taken.append(got)
        return got
    con.store.spares.take = counting
    expected = w
    inodes = set()
    for _ in range(6):
        con.execute(STEP)
        expected = expected - np.float32(0.5) * g
        meta = con.store.meta("W")
        inodes.add(os.stat(os.path.join(con.store.tiles_dir, payload_name(meta.version, con.store.database))).st_ino)
    np.testing.assert_array_equal(con.tensor("W"), expected)
    # the first step has no spare; later ones reuse the two files that take turns (one may find
    # its spare still mapped, if a reference cycle kept the last run's reader alive)
    assert taken[0] is None and sum(t == w.nbytes for t in taken[2:]) >= 3, taken
    assert all(t in (None, w.nbytes) for t in taken), taken
    assert len(inodes) <= 3
    # what is on disk: the live payloads and the spares, nothing else; CHECK DATABASE is clean
    assert _files(con) - _referenced(con) == {os.path.basename(p) for p in con.store.spares._files}
    assert [r["problem"] for r in con.check()] == ["ok"]
    con.close()
    if where == "disk":
        with tensordb.connect(tmp_path / "db") as again:  # closing deleted the spares
            assert _files(again) == _referenced(again)
            np.testing.assert_array_equal(again.tensor("W"), expected)


@pytest.mark.parametrize("where", ["disk", "memory"])
def test_a_mapped_old_version_is_never_overwritten(tmp_path, where):
    """(In memory a spare is renamed without the flock, link and unlink: the in-process
    check is the same.)"""
    w, g = _values()
    with tensordb.connect(tmp_path / "db" if where == "disk" else None, workers=2) as con:
        assert con.store.spares.private == (where == "memory")
        con.load("W", w)
        con.load("G", g)
        snapshot = con.store.open("W")  # maps version 1 on its first tile
        view = snapshot.tile((0, 0))
        old_path = snapshot.path
        held = view.copy()
        for _ in range(4):  # version 1 retires at the first step; later steps look for spares
            con.execute(STEP)
        assert payloads.payload_in_use(old_path)
        assert os.path.exists(old_path)  # still a spare, not renamed to a newer version
        np.testing.assert_array_equal(view, held)
        del view, snapshot  # the mapping goes with the last array made from it
        assert not payloads.payload_in_use(old_path)
        con.execute(STEP)  # now it may be recycled
        expected = w
        for _ in range(5):
            expected = expected - np.float32(0.5) * g
        np.testing.assert_array_equal(con.tensor("W"), expected)


@pytest.mark.parametrize("rename", [payloads.rename_unused, payloads.rename_private])
def test_a_read_under_way_blocks_the_rename(tmp_path, rename):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 64)
    payloads._READING[str(path)] += 1
    try:
        assert not rename(str(path), str(tmp_path / "g.bin"))
        assert path.exists() and not (tmp_path / "g.bin").exists()
    finally:
        payloads._done_reading(str(path))
    assert rename(str(path), str(tmp_path / "g.bin"))
    assert not path.exists() and (tmp_path / "g.bin").read_bytes() == b"x" * 64


_READER = """
import sys, numpy as np, tensordb
con = tensordb.connect(sys.argv[1], read_only=True)
view = con.store.open("W").tile((0, 0))   # maps the version of now
np.save(sys.argv[2], view)
con.close()                               # lets the writer in; the view stays mapped
print("mapped", flush=True)
sys.stdin.readline()                      # the writer has replaced W several times
np.save(sys.argv[3], view)
"""


def test_a_version_mapped_by_another_process_is_never_overwritten(tmp_path):
    """A reader in another process keeps a shared flock on the payload it maps (for as long as
    the mapping lives, after its connection closed): the writer's store does not recycle that
    file, so the reader's snapshot does not change. (It once did: this process's registry of
    mappings knew nothing of the other process's.)"""
    import subprocess
    import sys
    w, g = _values()
    root = tmp_path / "db"
    with tensordb.connect(root, workers=2) as con:
        con.load("W", w)
        con.load("G", g)
    before, after = tmp_path / "before.npy", tmp_path / "after.npy"
    proc = subprocess.Popen([sys.executable, "-c", _READER, str(root), str(before), str(after)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mapped"
        with tensordb.connect(root, workers=2) as con:
            for _ in range(4):  # the first retires the mapped version, the others look for spares
                con.execute(STEP)
            expected = w
            for _ in range(4):
                expected = expected - np.float32(0.5) * g
            np.testing.assert_array_equal(con.tensor("W"), expected)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    first = np.load(before)  # tile (0, 0) of the version it mapped: the loaded w
    np.testing.assert_array_equal(first, w[:first.shape[0], :first.shape[1]])
    np.testing.assert_array_equal(np.load(after), first)


def test_a_file_recycled_between_open_and_lock_is_refused(tmp_path):
    """A reader that opened a payload just before another process renamed it for a newer
    version finds, once it holds its lock, that the name no longer leads to that file."""
    path = tmp_path / "7.bin"
    path.write_bytes(b"x" * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert payloads.rename_unused(str(path), str(tmp_path / "9.bin"))
        with pytest.raises(tensordb.OperationalError, match="reused for a newer version"):
            payloads._hold_shared(fd, str(path), "W")
    finally:
        os.close(fd)


def test_a_shared_lock_blocks_the_rename(tmp_path):
    """What a mapping in another process holds: an open file description with a shared flock
    (here this process's own, which counts the same)."""
    import fcntl
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert not payloads.rename_unused(str(path), str(tmp_path / "g.bin"))
        assert path.exists() and not (tmp_path / "g.bin").exists()
    finally:
        os.close(fd)
    assert payloads.rename_unused(str(path), str(tmp_path / "g.bin"))


@pytest.mark.parametrize("rename", [payloads.rename_unused, payloads.rename_private])
def test_rename_never_replaces_an_existing_file(tmp_path, rename):
    (tmp_path / "a.bin").write_bytes(b"a")
    (tmp_path / "b.bin").write_bytes(b"b")
    with pytest.raises(FileExistsError):
        rename(str(tmp_path / "a.bin"), str(tmp_path / "b.bin"))
    assert (tmp_path / "a.bin").read_bytes() == b"a" and (tmp_path / "b.bin").read_bytes() == b"b"


def test_the_pool_is_bounded_and_sizes_must_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(spares, "MAX_FILES", 2)
    pool = spares.SparePayloads()
    paths = []
    for i, size in enumerate([1000, 5 << 20, 3000]):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(b"\0" * size)
        paths.append(p)
        pool.retire(str(p))
    assert not paths[0].exists()  # the oldest went when a third came
    assert pool.take(3 << 20, str(tmp_path / "new.bin")) is None  # 5 MiB: too big for 3 MiB
    assert pool.take(2500, str(tmp_path / "new.bin")) == 3000  # within the slack
    assert (tmp_path / "new.bin").stat().st_size == 3000 and not paths[2].exists()
    pool.disable()
    assert not paths[1].exists() and pool.take(5 << 20, str(tmp_path / "x.bin")) is None


def test_the_registry_forgets_paths_nobody_maps(tmp_path, monkeypatch):
    """A long run maps a new version every step: paths whose mappings are gone do not pile up."""
    import mmap
    monkeypatch.setattr(payloads, "_SWEEP_AT", 8)
    monkeypatch.setattr(payloads, "_MAPPINGS", {})
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 4096)
    kept = None
    for i in range(40):
        with open(f, "rb") as fh:
            m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        payloads.track_mapping(f"/v/{i}.bin", m)
        if i == 3:
            kept = m  # still mapped: it stays tracked
    assert len(payloads._MAPPINGS) <= 9 and payloads.payload_in_use("/v/3.bin")
    assert not payloads.payload_in_use("/v/38.bin") and kept is not None


@pytest.mark.parametrize("where,shape", [("disk", (256, 128)), ("memory", (256, 128)),
                                         ("disk", (1024, 512)), ("memory", (1024, 512))])
def test_a_recycled_file_is_mapped_only_where_commits_do_not_fsync(tmp_path, where, shape,
                                                                   monkeypatch):
    """In memory a recycled file of 1 MiB or more is computed in place through its mapping
    (its pages are cached); a smaller one has no file (its staged bytes are kept as its
    payload, storage/memfiles.py), and
    on disk every one is staged and written at commit like a new one (an fsync of pages
    dirtied through a mapping costs a TLB shootdown per page). All give numpy's values."""
    from tensordb.storage import writer
    w, g = _values(shape)
    large = w.nbytes >= 1 << 20
    con = tensordb.connect(tmp_path / "db" if where == "disk" else None, workers=2)
    con.load("W", w)
    con.load("G", g)
    seen = []
    reserve = writer.TensorWriter.reserve

    def recording(self, *args, **kwargs):
        before = len(self.store.spares._files)
        out = reserve(self, *args, **kwargs)
        seen.append((len(self.store.spares._files) < before, self._map is not None))
        return out
    monkeypatch.setattr(writer.TensorWriter, "reserve", recording)
    expected = w
    for _ in range(5):
        con.execute(STEP)
        expected = expected - np.float32(0.5) * g
    np.testing.assert_array_equal(con.tensor("W"), expected)
    recycled = [mapped for took, mapped in seen if took]
    if where == "memory" and not large:  # no file at all: its bytes are kept (memfiles.py)
        assert seen == [(False, False)] * 5, seen
        path = os.path.join(con.store.tiles_dir,
                            payload_name(con.store.meta("W").version, con.store.database))
        assert not os.path.exists(path) and memfiles.get(path) is not None
        assert [r["problem"] for r in con.check()] == ["ok"]
        con.close()
        return
    assert len(recycled) >= 2, seen
    assert all(recycled) if where == "memory" and large else not any(recycled), seen
    assert not any(mapped for took, mapped in seen if not took), seen  # new files: staged
    assert [r["problem"] for r in con.check()] == ["ok"]
    con.close()


def test_staging_buffers_are_reused_only_when_nothing_refers_to_them():
    """The store's cache of staging allocations (storage/writer.py StagingBuffers): a kept
    buffer is handed out again while no view of it is alive, never while one is, and the
    cache keeps at most its byte bound (oldest out first)."""
    from tensordb.storage.writer import StagingBuffers
    cache = StagingBuffers(max_bytes=8 << 20, min_bytes=1 << 20)
    first = cache.take(2 << 20)
    tile = first[64:1024].view(np.float32)  # an array made from a staged tile
    address = first.__array_interface__["data"][0]
    cache.keep(first)
    del first
    second = cache.take(2 << 20)  # the tile is alive: a new buffer
    assert second.__array_interface__["data"][0] != address
    del tile
    third = cache.take(2 << 20)
    assert third.__array_interface__["data"][0] == address  # reused, no view left
    assert cache.take(4 << 20).nbytes == 4 << 20 and cache.nbytes == 0
    small = cache.take(1 << 10)  # below min_bytes: never kept
    cache.keep(small)
    assert cache.nbytes == 0
    for _ in range(5):
        cache.keep(np.empty(3 << 20, np.uint8))
    assert cache.nbytes <= 8 << 20
    cache.clear()
    assert cache.nbytes == 0


def test_a_repeated_staged_output_reuses_its_staging_buffer(tmp_path):
    """On disk (outputs staged, then written by pwrite at commit), a step repeated reuses the
    anonymous buffer its output was staged in: the same allocation each time after the
    first, and numpy's values every time."""
    from tensordb.storage import writer
    w, g = _values((1024, 1024))  # 4 MiB: staged, and kept between steps
    con = tensordb.connect(tmp_path / "db", workers=2)
    con.load("W", w)
    con.load("G", g)
    addresses = []
    reserve = writer.TensorWriter.reserve

    def recording(self, *args, **kwargs):
        out = reserve(self, *args, **kwargs)
        addresses.append(self._raw.__array_interface__["data"][0])
        return out
    writer.TensorWriter.reserve = recording
    try:
        expected = w
        for _ in range(4):
            con.execute(STEP)
            expected = expected - np.float32(0.5) * g
            np.testing.assert_array_equal(con.tensor("W"), expected)
    finally:
        writer.TensorWriter.reserve = reserve
    assert len(set(addresses[1:])) == 1, addresses
    assert con.store.staging.nbytes >= w.nbytes
    con.close()


def test_the_staging_cache_keeps_no_more_than_a_statement_may_stage(tmp_path):
    """Under a memory_limit a statement stages at most a sixteenth of it: the buffers kept
    between statements are capped the same way."""
    w, g = _values((1024, 1024))  # 4 MiB
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("W", w)
        con.load("G", g)
        con.execute(STEP)
        assert con.store.staging.nbytes >= w.nbytes  # no limit: kept
        con.execute("SET memory_limit = '32MB'")
        con.execute(STEP)
        assert con.store.staging.nbytes <= (32 << 20) // 16
        np.testing.assert_array_equal(con.tensor("W"),
                                      (w - np.float32(0.5) * g) - np.float32(0.5) * g)


def test_a_maximal_staged_file_keeps_its_buffer():
    """A staged file of STAGE_MAX bytes needs a buffer ALIGN bytes larger (for alignment): it
    is kept all the same, and handed back for the next file of that size."""
    from tensordb.storage.writer import ALIGN, STAGE_MAX, StagingBuffers
    sb = StagingBuffers()
    raw = sb.take(STAGE_MAX + ALIGN)
    sb.keep(raw)
    assert sb.nbytes == STAGE_MAX + ALIGN
    address = raw.ctypes.data
    del raw  # nothing refers to it now
    again = sb.take(STAGE_MAX + ALIGN)
    assert again.ctypes.data == address and sb.nbytes == 0


def test_a_finished_run_leaves_its_staged_buffer_free(tmp_path, monkeypatch):
    """The pool's workers drop each item once it is handled: a worker waiting for work with
    the run's last item kept the whole run alive (its results and output buffers), so a
    staged output's buffer was never free for the next query where only one buffer is kept
    (a 64 MiB output): every query then staged into new pages."""
    from tensordb.storage import reserved
    monkeypatch.setattr(reserved, "STAGE_MAX", 2 << 20)  # one 1.5 MiB buffer kept, not two
    rng = np.random.default_rng(2)
    w = rng.standard_normal((768, 512), dtype=np.float32)
    g = rng.standard_normal((768, 512), dtype=np.float32)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("W", w)
        con.load("G", g)
        taken = []
        take = con.store.staging.take

        def recording(nbytes):
            got = take(nbytes)
            taken.append(got.ctypes.data)
            return got
        con.store.staging.take = recording
        for _ in range(4):
            con.execute("H[i,j] = W[i,j] * 2 + G[i,j] WITH (PIECES i 8, j 2)")
            assert con.last_run.kernel_calls == 16  # the workers ran it, not the caller
        np.testing.assert_array_equal(con.tensor("H"), w * np.float32(2) + g)
        assert len(set(taken[1:])) == 1, taken  # the first query's buffer, reused ever since
