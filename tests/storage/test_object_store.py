"""Payloads in an S3-compatible object store (storage/objects.py), against a real S3 server on
127.0.0.1 (moto's server mode, tests/s3server.py): round trips against numpy, reads by byte
range, orphans swept by listing and nothing else, the database's id, damaged objects, the
declared location checked, and kill -9 of the client mid-commit."""
from __future__ import annotations

import os
import pickle
import textwrap

import numpy as np
import pytest

import tensordb
from tensordb.storage.objects import ObjectStore
from tests.harness import assert_killed, kill9, start_script
from tests.s3server import s3, s3_storage, connect, objects_of, referenced  # noqa: F401 - fixtures

RNG = np.random.default_rng(27)


def test_load_query_replace_drop_round_trip(tmp_path, s3_storage):
    a = RNG.standard_normal((70, 50)).astype("float32")
    a[:35, 25:] = 0  # an absent tile
    b = RNG.integers(-5, 6, (50, 30)).astype("int64")
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("A", a, tile=(35, 25))
        con.load("B", b, tile=(20, 30))
        np.testing.assert_array_equal(con.tensor("A"), a)
        np.testing.assert_array_equal(con.tensor("B"), b)
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), a @ b.astype("float32"), rtol=1e-5, atol=1e-4)
        got = con.sql("SELECT sum(value) FROM B").fetchall()[0][0]
        assert got == b.sum()
        np.testing.assert_array_equal(con.store.open("A").read_box((30, 20), (40, 30)),
                                      a[30:40, 20:30])
        con.export("A", str(tmp_path / "a.npy"))
        np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a)
        assert set(objects_of(s3_storage)) == referenced(con)
        assert os.listdir(con.store.tiles_dir) == []  # staging files go after the upload
        old_c = con.store.open("C").file
        con.load("C", np.ones((70, 30), "float32"), replace=True)
        np.testing.assert_array_equal(con.tensor("C"), np.ones((70, 30), "float32"))
        assert old_c not in objects_of(s3_storage)  # the replaced version's object went
        con.drop("B")
        assert set(objects_of(s3_storage)) == referenced(con)
        assert con.execute("CHECK DATABASE").fetchall() == [(None, None, None, None, "ok")]
    # reopened: the catalog is local, the payloads still in the store
    with connect(tmp_path / "db", s3_storage, read_only=True) as con:
        np.testing.assert_array_equal(con.tensor("A"), a)
        assert not con.store.has("B")


def test_sparse_tiles_round_trip(tmp_path, s3_storage):
    a = np.zeros((64, 64))
    idx = RNG.integers(0, 64, (40, 2))
    a[idx[:, 0], idx[:, 1]] = RNG.standard_normal(40)
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("S", a, tile=(32, 32))
        assert any(e.sparse for e in con.store.open("S").entries.values())
        np.testing.assert_array_equal(con.tensor("S"), a)
        con.execute("T[i,k] = SUM(S[i,j] * S[j,k])")
        np.testing.assert_allclose(con.tensor("T"), a @ a, atol=1e-12)
        assert con.execute("CHECK TENSOR S").fetchall() == [(None, None, None, None, "ok")]


def test_a_tile_read_fetches_its_byte_range(tmp_path, s3_storage, monkeypatch):
    a = np.arange(64 * 48, dtype="float64").reshape(64, 48)
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("A", a, tile=(16, 48))
        reader = con.store.open("A")
        asked = []
        real = ObjectStore.read

        def counting(self, handle, file, tensor, offset, nbytes):
            asked.append((offset, nbytes))
            return real(self, handle, file, tensor, offset, nbytes)
        monkeypatch.setattr(ObjectStore, "read", counting)
        e = reader.entries[(2, 0)]
        np.testing.assert_array_equal(reader.tile((2, 0)), a[32:48])
        assert asked == [(e.offset, e.nbytes)]
        assert e.nbytes == a.nbytes // 4 < objects_of(s3_storage)[reader.file]
        # fetched once per process: the next read of it, by any reader, is the cached range
        np.testing.assert_array_equal(con.store.open("A").tile((2, 0)), a[32:48])
        assert asked == [(e.offset, e.nbytes)]
        f = reader.entries[(3, 0)]
        np.testing.assert_array_equal(con.store.open("A").read_box((48, 0), (64, 48)), a[48:])
        assert asked == [(e.offset, e.nbytes), (f.offset, f.nbytes)]


def test_orphans_removed_by_listing_and_nothing_else(tmp_path, s3_storage, s3):
    a = RNG.standard_normal((8, 8))
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("A", a)
        database = con.store.database
        live = con.store.open("A").file
    store = ObjectStore(*s3_storage)
    fs = store.fs
    ours = f"999-{database[:16]}.bin"          # a killed commit's upload: ours, unreferenced
    theirs = f"999-{'f' * 16}.bin"             # another database's name: never ours to delete
    for name in (ours, theirs, "notes.txt"):
        with fs.open_output_stream(store.key(name)) as out:
            out.write(b"x" * 100)
    with connect(tmp_path / "db", s3_storage) as con:
        listed = set(objects_of(s3_storage))
        assert ours not in listed
        assert {live, theirs, "notes.txt"} <= listed
        np.testing.assert_array_equal(con.tensor("A"), a)
        con.load("B", a)  # a version after every payload name seen: no collision with 999
        assert con.store.meta("B").version > 999


def test_damaged_object_is_a_data_error_naming_tensor_tile_and_object(tmp_path, s3_storage):
    a = RNG.standard_normal((32, 32)).astype("float32")
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("A", a, tile=(16, 32))
        reader = con.store.open("A")
        file, e = reader.file, reader.entries[(1, 0)]
        store = ObjectStore(*s3_storage)
        with store.fs.open_input_stream(store.key(file)) as f:
            data = bytearray(f.read())
        data[e.offset + 8:e.offset + 12] = b"\xff\xff\xff\xff"
        with store.fs.open_output_stream(store.key(file)) as out:
            out.write(bytes(data))
        with pytest.raises(tensordb.DataError) as err:
            con.tensor("A")
        text = str(err.value)
        assert "'A'" in text and "(1, 0)" in text and store.url_of(file) in text
        assert "object" in text
        with pytest.raises(tensordb.DataError):  # no new tensor from damaged bytes
            con.execute("B[i,j] = A[i,j] * 2")
        assert not con.store.has("B")
        rows = con.execute("CHECK DATABASE").fetchall()
        assert [(r[0], r[1], r[2]) for r in rows] == [("A", (1, 0), file)]
        assert "checksum mismatch" in rows[0][4]


def test_identity_and_declared_location(tmp_path, s3_storage):
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("A", np.ones((4, 4)))
        database = con.store.database
        reader = con.store.open("A")
    assert ObjectStore(*s3_storage).read_id() == database
    # another catalog cannot take over this prefix
    with pytest.raises(tensordb.OperationalError, match="another database"):
        connect(tmp_path / "other", s3_storage)
    # the catalog records where its payloads are
    with pytest.raises(tensordb.OperationalError, match="keeps its payloads in s3://"):
        tensordb.connect(tmp_path / "db")
    # a reader shipped to another process checks the prefix's id before its first read
    shipped = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(shipped.to_numpy(), np.ones((4, 4)))
    store = ObjectStore(*s3_storage)
    with store.fs.open_output_stream(f"{store.bucket}/{store.prefix}/database.id") as out:
        out.write(b"0" * 32)
    from tensordb.storage import objects
    objects._SEEN_IDS.clear()  # as a fresh worker process would
    with pytest.raises(tensordb.OperationalError, match="another database"):
        pickle.loads(pickle.dumps(reader)).to_numpy()


def test_bad_declarations(tmp_path, s3_storage, s3):
    url, options = s3_storage
    with pytest.raises(tensordb.ProgrammingError, match="needs a database path"):
        tensordb.connect(storage=url, storage_options=options)
    with pytest.raises(tensordb.ProgrammingError, match="unknown storage option"):
        tensordb.connect(tmp_path / "a", storage=url, storage_options={"endpint": "x"})
    with pytest.raises(tensordb.NotSupportedError, match="gs"):
        tensordb.connect(tmp_path / "b", storage="gs://bucket/p")
    with pytest.raises(tensordb.ProgrammingError, match="object store only"):
        tensordb.connect(tmp_path / "c", storage_options=options)
    with pytest.raises(tensordb.OperationalError, match="bucket 'no-such-bucket'"):
        tensordb.connect(tmp_path / "d", storage="s3://no-such-bucket/p", storage_options=options)
    # a local database with tensors cannot be opened with an object store URL
    with tensordb.connect(tmp_path / "local") as con:
        con.load("A", np.ones(3))
    with pytest.raises(tensordb.OperationalError, match="files in"):
        connect(tmp_path / "local", s3_storage)


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensordb
    from tensordb.storage import objects, store as st
    from tests.harness import die, die_after, die_before

    path, url, endpoint, point = sys.argv[1:5]
    if point == "after_upload":            # the object is up, the catalog's COMMIT not run
        die_after(objects.ObjectStore, "put")
    elif point == "after_commit":          # COMMIT done, the replaced object not yet deleted
        die_before(objects.ObjectStore, "delete")
    opts = {"endpoint": endpoint, "access_key": "testing", "secret_key": "testing"}
    con = tensordb.connect(path, storage=url, storage_options=opts)
    print("loading", flush=True)
    con.load("T", np.full((256, 256), 3.0), replace=True, tile=(64, 256))
    con.close()
""")


def _state_after_crash(path, storage):
    with connect(path, storage) as con:
        assert set(objects_of(storage)) == referenced(con)  # orphans gone, nothing else
        assert os.listdir(con.store.tiles_dir) == []
        got = con.tensor("T")
    if got.shape == (4, 4):
        np.testing.assert_array_equal(got, np.full((4, 4), 7.0))
        return "old"
    np.testing.assert_array_equal(got, np.full((256, 256), 3.0))
    return "new"


@pytest.mark.parametrize("point, outcome", [("after_upload", "old"), ("after_commit", "new")])
def test_kill9_mid_commit_leaves_old_or_new(tmp_path, s3_storage, s3, point, outcome):
    path = tmp_path / "db"
    with connect(path, s3_storage) as con:
        con.load("T", np.full((4, 4), 7.0))
    p = start_script(CHILD, path, s3_storage[0], s3.endpoint, point)
    _, err = p.communicate(timeout=120)
    assert_killed(p.returncode, err)
    assert len(objects_of(s3_storage)) == 2  # the old object and the new one, either way
    assert _state_after_crash(path, s3_storage) == outcome


def test_kill9_from_outside_mid_load(tmp_path, s3_storage, s3):
    path = tmp_path / "db"
    with connect(path, s3_storage) as con:
        con.load("T", np.full((4, 4), 7.0))
    p = start_script(CHILD, path, s3_storage[0], s3.endpoint, "none")
    p.stdout.readline()
    kill9(p)
    assert _state_after_crash(path, s3_storage) in ("old", "new")


def test_a_commit_that_fails_after_its_upload_deletes_the_object(tmp_path, s3_storage,
                                                                 monkeypatch):
    from tensordb.storage.store import Store
    with connect(tmp_path / "db", s3_storage) as con:
        con.load("A", np.ones((4, 4)))
        before = set(objects_of(s3_storage))
        uploaded = []
        real_put = ObjectStore.put

        def put(self, local_path, file, database):
            uploaded.append(file)
            return real_put(self, local_path, file, database)

        def fail(self, name):
            raise tensordb.OperationalError("injected: the commit fails after the upload")
        monkeypatch.setattr(ObjectStore, "put", put)
        monkeypatch.setattr(Store, "_forget", fail)
        with pytest.raises(tensordb.OperationalError, match="injected"):
            con.load("B", np.full((4, 4), 2.0))
        monkeypatch.undo()
        assert uploaded  # it was up before the COMMIT, which never ran
        assert set(objects_of(s3_storage)) == before  # rolled back: its object deleted
        assert not con.store.has("B") and os.listdir(con.store.tiles_dir) == []
        np.testing.assert_array_equal(con.tensor("A"), np.ones((4, 4)))
