"""Outputs written to the object store in parts (storage/objparts.py, S3 multipart uploads)
by the local pool's workers while the query runs, against a real S3 server on 127.0.0.1 (moto,
tests/s3server.py, which enforces S3's 5 MiB smallest part): the parts' cut, results against
numpy and the local directory's tiles, a failed commit and a killed client leave no object and
no open upload after the next open."""
from __future__ import annotations

import os
import textwrap
import threading

import numpy as np
import pytest

import tensordb
from tensordb.storage.objects import ObjectStore
from tensordb.storage.objparts import MIN_PART, PART_TARGET, cut_parts, order_tiles
from tests.harness import assert_killed, start_script
from tests.s3server import s3, s3_storage, connect, objects_of, referenced  # noqa: F401 - fixtures

pytest.importorskip("boto3")
MiB = 1 << 20




def rows(con, name):
    """tile coords -> (nbytes, nnz, crc32, nonfinite, format, the tile's bytes), offsets left
    out (an object in parts lays each worker's tiles out together)."""
    r = con.store.open(name)
    return {c: (e.nbytes, e.nnz, e.crc32, e.nonfinite, e.format,
                np.ascontiguousarray(r.tile(c)).tobytes()) for c, e in r.entries.items()}


# -- the cut -----------------------------------------------------------------------------------
def _layout(sizes):
    """[(coords, offset, nbytes)] back to back, as a writer lays them out (64-byte aligned)."""
    out, pos = [], 0
    for i, n in enumerate(sizes):
        pos += -pos % 64
        out.append(((i,), pos, n))
        pos += n
    return out


def test_cut_parts_cuts_within_groups_and_keeps_s3s_smallest_part():
    # two workers of 3 tiles of 4 MiB: each run cut at PART_TARGET, a short tail joined
    layout = _layout([4 * MiB] * 6)
    groups = {(i,): i // 3 for i in range(6)}
    parts = cut_parts(layout, groups)
    assert [c for _, _, c in parts] == [[(0,), (1,), (2,)], [(3,), (4,), (5,)]]
    assert parts[0][0] == 0 and parts[-1][1] == layout[-1][1] + layout[-1][2]
    assert all(b == parts[k + 1][0] for k, (_, b, _) in enumerate(parts[:-1]))  # contiguous
    # one worker's 40 MiB in 8 MiB tiles: 5 parts of one tile each
    parts = cut_parts(_layout([8 * MiB] * 5), {(i,): 0 for i in range(5)})
    assert len(parts) == 5 and all(b - a >= PART_TARGET for a, b, _ in parts[:-1])
    # a small group is possible last only; two small groups are not
    assert cut_parts(_layout([6 * MiB, 3 * MiB]), {(0,): 0, (1,): 1}) is not None
    assert cut_parts(_layout([1 * MiB, 6 * MiB]), {(0,): 0, (1,): 1}) is None
    assert cut_parts(_layout([4 * MiB, 4 * MiB]), {(0,): 0, (1,): 1}) is None
    assert cut_parts(_layout([7 * MiB]), {(0,): 0}) is None  # under PART_TARGET: put whole
    # order_tiles puts the small group last, each group's tiles together
    tiles = [(0,), (1,), (2,)]
    sizes = {(0,): MIN_PART // 2, (1,): MIN_PART, (2,): MIN_PART}
    got = order_tiles(tiles, {(0,): 0, (1,): 1, (2,): 0}, sizes.__getitem__)
    assert got == [(0,), (2,), (1,)]
    got = order_tiles(tiles, {(0,): 0, (1,): 1, (2,): 1}, sizes.__getitem__)
    assert got == [(1,), (2,), (0,)]  # worker 0's 2.5 MiB last


# -- the local pool ------------------------------------------------------------------------------
class Spy:
    """Counts the S3 calls of the object-store writer (the calls themselves go through)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str]] = []
        for name in ("upload_part", "complete_upload", "put", "put_bytes", "abort_upload"):
            real = getattr(ObjectStore, name)
            monkeypatch.setattr(ObjectStore, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            self.calls.append((name, threading.current_thread().name))
            return real(*args, **kwargs)
        return call

    def count(self, name) -> int:
        return sum(1 for n, _ in self.calls if n == name)


def _inputs(seed=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((1024, 48)), rng.standard_normal((48, 2048))


@pytest.fixture
def pool_parts(monkeypatch):
    """The local pool writes outputs from 0 bytes in parts (its threshold is 256 MiB)."""
    from tensordb.storage import reserved
    monkeypatch.setattr(reserved, "POOL_PARTS_MIN", 0)


def test_the_pool_uploads_its_output_in_parts(tmp_path, s3_storage, monkeypatch, pool_parts):
    a, b = _inputs()
    with connect(tmp_path / "db", s3_storage, workers=2) as con, \
            connect(tmp_path / "local", workers=2) as local:
        for c in (con, local):
            c.load("A", a, tile=(256, 48))
            c.load("B", b, tile=(48, 1024))
        spy = Spy(monkeypatch)
        sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
        con.execute(sql)
        local.execute(sql)
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
        # 16 MiB from 2 workers: parts went up from the pool's threads, the object completed
        assert spy.count("upload_part") >= 2 and spy.count("complete_upload") == 1
        assert spy.count("put") + spy.count("put_bytes") == 0
        assert spy.count("abort_upload") == 0
        assert all(t != threading.main_thread().name for n, t in spy.calls if n == "upload_part")
        assert rows(con, "C") == rows(local, "C")  # the local directory's tiles, byte for byte
        assert set(objects_of(s3_storage)) == referenced(con)
        assert ObjectStore(*s3_storage).uploads() == []
        assert os.listdir(con.store.tiles_dir) == []  # no local file was made for it
        assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"


def test_a_small_output_is_put_whole(tmp_path, s3_storage, monkeypatch, pool_parts):
    a, b = np.arange(12.0).reshape(3, 4), np.ones((4, 5))
    with connect(tmp_path / "db", s3_storage, workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        spy = Spy(monkeypatch)
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), a @ b)
        assert spy.count("put_bytes") == 1 and spy.count("upload_part") == 0


def test_under_the_pools_threshold_an_output_goes_up_whole_from_memory(tmp_path, s3_storage,
                                                                       monkeypatch):
    a, b = _inputs(7)
    with connect(tmp_path / "db", s3_storage, workers=2) as con, \
            connect(tmp_path / "local", workers=2) as local:
        for c in (con, local):
            c.load("A", a, tile=(256, 48))
            c.load("B", b, tile=(48, 1024))
        spy = Spy(monkeypatch)
        made = []
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda p, *a, **k: (made.append(str(p)),
                                                             real_open(p, *a, **k))[1])
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        monkeypatch.undo()
        local.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        # 16 MiB: one PutObject of the staging buffer at commit, no parts, no local file
        assert spy.count("put_bytes") == 1 and spy.count("upload_part") == 0
        assert not [p for p in made if p.startswith(str(con.store.tiles_dir))]
        assert rows(con, "C") == rows(local, "C")
        assert set(objects_of(s3_storage)) == referenced(con)


def test_a_failed_commit_leaves_no_object_and_no_upload(tmp_path, s3_storage, monkeypatch,
                                                        pool_parts):
    a, b = _inputs(5)
    with connect(tmp_path / "db", s3_storage, workers=2) as con:
        con.load("A", a, tile=(256, 48))
        con.load("B", b, tile=(48, 1024))
        con.load("C", np.full((1024, 2048), 7.0), tile=(1024, 1024))
        before = objects_of(s3_storage)

        def fail(self, file, upload_id, parts):
            raise tensordb.OperationalError("injected: the store refuses the completion")
        monkeypatch.setattr(ObjectStore, "complete_upload", fail)
        with pytest.raises(tensordb.OperationalError, match="injected"):
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        monkeypatch.undo()
        assert objects_of(s3_storage) == before
        assert ObjectStore(*s3_storage).uploads() == []  # aborted: its parts are gone
        np.testing.assert_array_equal(con.tensor("C"), np.full((1024, 2048), 7.0))


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensordb
    from tensordb.storage import objects, reserved
    from tests.harness import die_after, die_before

    reserved.POOL_PARTS_MIN = 0  # the pool writes its 16 MiB output in parts
    path, url, endpoint, point = sys.argv[1:5]
    if point == "before_completion":  # every part up, the object not made
        die_before(objects.ObjectStore, "complete_upload")
    else:                             # the object made, the catalog's COMMIT not run
        die_after(objects.ObjectStore, "complete_upload")
    opts = {"endpoint": endpoint, "access_key": "testing", "secret_key": "testing"}
    con = tensordb.connect(path, storage=url, storage_options=opts, workers=2)
    con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
""")


@pytest.mark.parametrize("point", ["before_completion", "after_completion"])
def test_a_client_killed_around_the_completion_leaves_the_old_state(tmp_path, s3_storage, s3,
                                                                    point):
    a, b = _inputs(6)
    path = tmp_path / "db"
    with connect(path, s3_storage) as con:
        con.load("A", a, tile=(256, 48))
        con.load("B", b, tile=(48, 1024))
        before = objects_of(s3_storage)
    p = start_script(CHILD, path, s3_storage[0], s3.endpoint, point)
    _, err = p.communicate(timeout=180)
    assert_killed(p.returncode, err)
    if point == "before_completion":
        assert ObjectStore(*s3_storage).uploads()  # the dead client's upload, left open
        assert objects_of(s3_storage) == before  # but no object
    else:
        assert ObjectStore(*s3_storage).uploads() == []
        assert len(objects_of(s3_storage)) == len(before) + 1  # an orphan: no row names it
    with connect(path, s3_storage) as con:  # the open for writing aborts it, or deletes it
        assert ObjectStore(*s3_storage).uploads() == []
        assert set(objects_of(s3_storage)) == referenced(con)
        assert not con.store.has("C")
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")  # and the next query's name is free
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)


def test_without_boto3_everything_goes_through_pyarrow(tmp_path, s3_storage, monkeypatch):
    """An installation without boto3 (the s3 extra): no parts, every payload put whole by
    pyarrow's client; a process that would need boto3 says which package to install."""
    from tensordb.storage import objects
    monkeypatch.setattr(objects, "_BOTO3", [None])
    monkeypatch.setattr(objects, "_CLIENTS", {})
    a, b = _inputs(9)
    with connect(tmp_path / "db", s3_storage, workers=2) as con:
        con.load("A", a, tile=(256, 48))
        con.load("B", b, tile=(48, 1024))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
        assert set(objects_of(s3_storage)) == referenced(con)
        assert ObjectStore(*s3_storage).uploads() == []
        with pytest.raises(tensordb.OperationalError, match=r"boto3 is not installed") as err:
            ObjectStore(*s3_storage).s3
        assert "tensordb[s3]" in str(err.value.hint if hasattr(err.value, "hint") else err.value)
