"""An output that Dask workers write to the object store one object per part
(storage/objparts.py ``PartObjects``, ``write_object_slot``), driven here in one process
through the same writer calls the Dask sink makes (``reserve(remote=True)``, ``slot``,
``record_slot``), against a real S3 server on 127.0.0.1 (moto, tests/s3server.py): the
catalog rows name each tile's part object, a read over tiles of two parts matches numpy,
CHECK passes; a replace deletes every part; an abort deletes the parts put, reported or not;
a run forgotten puts nothing; the next open deletes the parts of a version never committed."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.storage.objects import ObjectStore, part_name, part_start, payload_versions
from tensordb.storage.objparts import PartObjects, forget_spools, write_object_slot
from tests.s3server import s3, s3_storage, connect, objects_of, referenced  # noqa: F401 - fixtures

pytest.importorskip("boto3")

SHAPE, TILE = (2048, 1024), (512, 1024)  # 4 row tiles of 4 MiB (float64): 16 MiB
GRID = ((0, 512, 1024, 1536, 2048), (0, 1024))
TILES = [(i, 0) for i in range(4)]
GROUPS = {(i, 0): i // 2 for i in range(4)}  # tiles 0, 1 on one worker, 2, 3 on the other


def _want(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE)


def _writer(con, name="T", replace=False):
    w = con.store.writer(name, SHAPE, np.dtype(np.float64), GRID, dims=("i", "j"),
                         replace=replace)
    assert w.reserve(TILES, remote=True, groups=GROUPS) == {}  # the workers write them
    assert isinstance(w._uploads, PartObjects) and len(w._uploads.parts) == 2
    return w


def _put(w, run, want, coords, record=True):
    """What a Dask worker does for each tile (write_object_slot), and what the client does
    with the facts that come back (record_slot)."""
    for c in coords:
        i = c[0]
        facts = write_object_slot(run, w.slot(c), want[512 * i:512 * (i + 1)])
        if record:
            w.record_slot(c, facts)


def test_each_part_is_an_object_its_rows_name(tmp_path, s3_storage):
    want = _want()
    with connect(tmp_path / "db", s3_storage) as con:
        w = _writer(con)
        _put(w, "run1", want, [(1, 0), (0, 0), (3, 0), (2, 0)])  # facts in any order
        w.commit()
        parts = {n for n in objects_of(s3_storage) if n.endswith("-run1.bin")}
        file = f"{con.store.meta('T').version}-{con.store.database[:16]}.bin"
        assert parts == {part_name(file, 0, "run1"), part_name(file, 8 << 20, "run1")}
        assert referenced(con) >= parts
        assert set(payload_versions(parts, con.store.database).values()) == \
            {con.store.meta("T").version}
        r = con.store.open("T")
        assert {c: part_start(e.file) for c, e in r.entries.items()} == \
            {(0, 0): 0, (1, 0): 0, (2, 0): 8 << 20, (3, 0): 8 << 20}
        np.testing.assert_array_equal(con.tensor("T"), want)
        # rows 256..1280: tiles 0, 1, 2 back to back, a run over both parts (a GET each)
        from tensordb.storage.objreader import _RANGES
        _RANGES.clear()
        np.testing.assert_array_equal(r.read_box((256, 0), (1280, 1024)), want[256:1280])
        np.testing.assert_array_equal(r.read_box((0, 0), SHAPE), want)
        assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"
        # a new version: both part objects go after its COMMIT, nothing else is left
        con.load("T", np.ones((4, 4)), replace=True)
        assert not parts & set(objects_of(s3_storage))
        assert set(payload_versions(objects_of(s3_storage), con.store.database)) == \
            referenced(con)
    with connect(tmp_path / "db", s3_storage) as con:  # and after an open, the same
        np.testing.assert_array_equal(con.tensor("T"), np.ones((4, 4)))


def test_a_damaged_part_is_a_data_error_and_check_names_the_part(tmp_path, s3_storage):
    want = _want(2)
    with connect(tmp_path / "db", s3_storage) as con:
        w = _writer(con)
        _put(w, "run2", want, TILES)
        w.commit()
        second = con.store.open("T").entries[(3, 0)].file
        store = ObjectStore(*s3_storage)
        data = bytearray(store.s3.get_object(Bucket=store.bucket,
                                             Key=store.object_key(second))["Body"].read())
        data[(4 << 20) + 8] ^= 0xFF  # a byte of tile (3, 0), the second tile of its part
        store.put_bytes(bytes(data), second, con.store.database)
        from tensordb.storage.objreader import _RANGES
        _RANGES.clear()
        bad = [r for r in con.execute("CHECK DATABASE").fetchall() if r[-1] != "ok"]
        assert [(tuple(r[1]), r[2]) for r in bad] == [((3, 0), second)], bad
        with pytest.raises(tensordb.DataError, match=second.replace(".", r"\.")):
            con.tensor("T")


def test_an_abort_deletes_the_parts_put_reported_or_not(tmp_path, s3_storage):
    want = _want(3)
    with connect(tmp_path / "db", s3_storage) as con:
        before = set(objects_of(s3_storage))
        w = _writer(con)
        _put(w, "run3", want, [(0, 0), (1, 0)])             # part 1, its facts back
        _put(w, "run3", want, [(2, 0), (3, 0)], record=False)  # part 2 put, facts lost
        assert len(set(objects_of(s3_storage)) - before) == 2
        w.abort()
        assert set(objects_of(s3_storage)) == before
        assert not con.store.has("T")


def test_a_forgotten_run_puts_nothing(tmp_path, s3_storage):
    want = _want(4)
    with connect(tmp_path / "db", s3_storage) as con:
        before = set(objects_of(s3_storage))
        w = _writer(con)
        _put(w, "run4", want, [(0, 0)])
        forget_spools("run4")  # the client gave the run up: the part's tile 0 is dropped
        _put(w, "run4", want, [(1, 0)], record=False)  # a task still running: spooled only
        assert set(objects_of(s3_storage)) == before
        with pytest.raises(tensordb.OperationalError, match="given up"):
            _put(w, "run4", want, [(0, 0)], record=False)  # the part's last tile: no put
        assert set(objects_of(s3_storage)) == before
        w.abort()


def test_the_next_open_deletes_the_parts_of_a_version_never_committed(tmp_path, s3_storage):
    want = _want(5)
    with connect(tmp_path / "db", s3_storage) as con:
        w = _writer(con)
        _put(w, "run5", want, TILES)
        w.commit()
        kept = referenced(con)
        w = _writer(con, "U")
        _put(w, "run6", want, TILES)  # put, then the client "dies": never committed or aborted
        left = set(objects_of(s3_storage)) - kept
        assert sum(n.endswith("-run6.bin") for n in left) == 2
        w._uploads.closed = True  # what a killed client does about them: nothing
        w.abort()
    with connect(tmp_path / "db", s3_storage) as con:
        assert set(payload_versions(objects_of(s3_storage), con.store.database)) == kept
        np.testing.assert_array_equal(con.tensor("T"), want)
        assert not con.store.has("U")


def test_the_next_open_deletes_a_given_up_attempts_part_of_a_committed_version(
        tmp_path, s3_storage):
    """A worker killed after its put, the run retried and committed: the dead attempt's part
    object carries the committed version's number but no tile row names it. The next open
    deletes it (and only it); CHECK names it until then."""
    want = _want(6)
    with connect(tmp_path / "db", s3_storage) as con:
        w = _writer(con)
        _put(w, "run7", want, TILES)
        w.commit()
        kept = referenced(con)
        part = sorted(n for n in kept if n.endswith("-run7.bin"))[0]
        stray = part.replace("-run7.bin", "-dead7.bin")  # the given-up attempt's name
        con.store.objects.put_bytes(b"\0" * 64, stray, con.store.database)
        assert stray in objects_of(s3_storage)
        assert any(stray in str(row) for row in con.execute("CHECK DATABASE").fetchall())
    with connect(tmp_path / "db", s3_storage) as con:
        left = set(payload_versions(objects_of(s3_storage), con.store.database))
        assert left == kept  # the stray part gone, every referenced part kept
        np.testing.assert_array_equal(con.tensor("T"), want)
        assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"
