"""A call's fixed cost outside the run (issue 29, call29b): what changed, and that it changed
nothing a user can see.

- an in-memory database named a tmpfs (``MEMORY_PAYLOADS``, off by default) keeps its payload
  files there, beside a copy of its id file, deletes them at close, and the SQL guard covers them there;
- in memory, a small output is staged and its committed version is read back from those bytes
  (``TensorReader.preload``): a training step's next call neither opens nor maps the new
  file, the file holds the same bytes, and a rollback forgets what was kept;
- a large output in memory is still computed in a recycled file's mapping;
- ``TENSORDB_DEBUG`` is read at each call (its stage timings come and go with the variable).
Every value is checked against numpy.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb.storage import store as store_module
from tensordb.storage.reader import TensorReader
from tests.driver.test_call_fixed_cost import STEP, _numpy_step
from tests.driver.test_call_fixed_cost import _data as _fixed_cost_data

SHM = "/dev/shm"
HAS_SHM = os.path.isdir(SHM) and os.access(SHM, os.W_OK | os.X_OK)


def _data():
    return _fixed_cost_data(seed=5)


def _file_values(reader) -> np.ndarray:
    """The tensor as its payload file holds it (read with plain reads, not the reader)."""
    meta = reader.meta
    with open(reader.path, "rb") as f:
        data = f.read()
    out = np.zeros(meta.shape, meta.dtype)
    for e in reader.entries.values():
        tile = np.frombuffer(data, meta.dtype, int(np.prod(e.shape)), e.offset).reshape(e.shape)
        out[tuple(slice(a, a + n) for a, n in zip(e.starts, e.shape))] = tile
    return out


@pytest.mark.skipif(not HAS_SHM, reason="no writable tmpfs at /dev/shm")
def test_in_memory_payloads_live_on_a_tmpfs_beside_the_id_file_and_go_at_close(monkeypatch):
    monkeypatch.setattr(store_module, "MEMORY_PAYLOADS", (SHM,))  # opt-in: off by default
    con = tensordb.connect()
    a = np.arange(12.0).reshape(3, 4)
    con.load("A", a)
    store = con.store
    tiles = store.tiles_dir
    assert tiles.startswith(SHM + os.sep) and os.path.basename(tiles) == "tiles"
    assert not tiles.startswith(str(store.root))
    with open(os.path.join(os.path.dirname(tiles), "database.id")) as f:
        assert f.read().strip() == store.database
    assert len(os.listdir(tiles)) == 1
    con.execute("B[i,j] = A[i,j] * 2;")
    np.testing.assert_array_equal(con.tensor("B"), a * 2)
    con.close()
    assert not os.path.exists(os.path.dirname(tiles)) and not os.path.exists(store.root)


def test_without_a_tmpfs_the_payloads_stay_in_the_temporary_directory(monkeypatch):
    monkeypatch.setattr(store_module, "MEMORY_PAYLOADS", ())
    con = tensordb.connect()
    con.load("A", np.ones((2, 3)))
    assert con.store.tiles_dir == os.path.join(str(con.store.root), "tiles")
    con.execute("A[i,j] = A[i,j] + 1;")
    np.testing.assert_array_equal(con.tensor("A"), np.full((2, 3), 2.0))
    con.close()


@pytest.mark.skipif(not HAS_SHM, reason="no writable tmpfs at /dev/shm")
def test_the_guard_refuses_writing_into_the_tmpfs_payload_directory(monkeypatch):
    monkeypatch.setattr(store_module, "MEMORY_PAYLOADS", (SHM,))
    con = tensordb.connect()
    con.load("A", np.ones(3))
    target = os.path.join(con.store.tiles_dir, "x.csv")
    with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
        con.sql(f"COPY (SELECT 1 AS x) TO '{target}'")
    assert not os.path.exists(target)
    np.testing.assert_array_equal(con.tensor("A"), np.ones(3))
    con.close()


def test_a_small_output_is_read_back_from_the_bytes_its_writer_staged(monkeypatch):
    x, y, w = _data()
    con = tensordb.connect(None, workers=2)
    con.load("X", x)
    con.load("Y", y)
    con.load("W", w)
    con.execute(STEP, {"lr": 0.5})
    loss, w = _numpy_step(x, y, w, 0.5)
    opened = []
    real_open = TensorReader._open

    def counting_open(self):
        opened.append(self.meta.name)
        return real_open(self)
    monkeypatch.setattr(TensorReader, "_open", counting_open)
    for lr in (0.25, 0.5, 0.125):
        con.execute(STEP, {"lr": lr})
        loss, w = _numpy_step(x, y, w, lr)
        assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
    assert "W" not in opened  # each new version read from the bytes its writer staged
    reader = con.store.open_many(["W"])["W"]
    assert isinstance(reader.mapping(), np.ndarray) and not reader.mapping().flags.writeable
    # no file: the payload kept in memory (storage/memfiles.py) is the very bytes it reads
    from tensordb.storage import memfiles
    assert not os.path.exists(reader.path)
    assert memfiles.get(reader.path)[0] is reader.mapping()
    np.testing.assert_allclose(reader.to_numpy(), w, rtol=1e-12, atol=1e-15)
    con.close()
    assert memfiles.get(reader.path) is None  # closing let them go


def test_a_rolled_back_unit_forgets_the_reader_of_its_staged_output():
    con = tensordb.connect(None, workers=1)
    a = np.arange(6.0).reshape(2, 3)
    con.load("A", a)
    con.execute("A[i,j] = A[i,j] + 1;")
    with pytest.raises(tensordb.Error):
        con.execute("BEGIN; A[i,j] = A[i,j] * 10; C[i] = SUM(A[i,j] * Nope[i,j]); COMMIT;")
    np.testing.assert_array_equal(con.tensor("A"), a + 1)
    reader = con.store.open_many(["A"])["A"]
    np.testing.assert_array_equal(reader.to_numpy(), a + 1)
    np.testing.assert_array_equal(reader.read_box((0, 0), (2, 3)), a + 1)
    con.execute("A[i,j] = A[i,j] * 3;")
    np.testing.assert_array_equal(con.tensor("A"), (a + 1) * 3)
    con.close()


def test_a_large_output_in_memory_is_computed_in_a_recycled_mapping(monkeypatch):
    from tensordb.storage import memfiles
    monkeypatch.setattr(memfiles, "FILE_MAX", 1 << 20)  # (8 MiB: a smaller test)
    con = tensordb.connect(None, workers=2)
    a = np.random.default_rng(2).standard_normal((512, 384))  # 1.5 MiB: over FILE_MAX
    con.load("A", a)
    for _ in range(4):
        con.execute("A[i,j] = A[i,j] * 0.5 + 1;")
        a = a * 0.5 + 1
        np.testing.assert_allclose(con.tensor("A"), a, rtol=1e-15)
    reader = con.store.open_many(["A"])["A"]
    assert not isinstance(reader.mapping(), np.ndarray)  # a mapping of its file, as before
    np.testing.assert_allclose(_file_values(reader), a, rtol=1e-15)
    con.close()


def test_the_debug_variable_is_read_at_each_call(monkeypatch, capsys):
    con = tensordb.connect(None, workers=1)
    con.load("A", np.ones(3))
    monkeypatch.setenv("TENSORDB_DEBUG", "1")
    con.execute("A[i] = A[i] + 1;")
    assert "[tensordb] run" in capsys.readouterr().err
    monkeypatch.setenv("TENSORDB_DEBUG", "not a number")
    con.execute("A[i] = A[i] + 1;")
    assert "[tensordb]" not in capsys.readouterr().err
    monkeypatch.delenv("TENSORDB_DEBUG")
    con.execute("A[i] = A[i] + 1;")
    assert "[tensordb]" not in capsys.readouterr().err
    np.testing.assert_array_equal(con.tensor("A"), np.full(3, 4.0))
    con.close()


def test_blas_limits_reach_a_library_loaded_after_the_first_run(monkeypatch):
    """The BLAS libraries are looked for again once the process has imported modules since
    the last look (scipy's OpenBLAS loaded beside numpy's after a first run): each is limited
    during the run and put back after it."""
    from threadpoolctl import threadpool_info
    from tensordb.exec import pool
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((300, 300)), rng.standard_normal((300, 300))
    con = tensordb.connect(None, workers=2)
    con.load("A", a)
    con.load("B", b)
    before = sorted((p["filepath"], p["num_threads"]) for p in threadpool_info()
                    if p["user_api"] == "blas")
    monkeypatch.setattr(pool, "_controller", (0, []))  # as if found before any was loaded
    seen = []
    con.engine.progress_callback = lambda done, total: seen.append(
        {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
    con.execute("C[i,k] = SUM(A[i,j] * B[j,k]);")
    set_to = con.engine.executor().last_blas_threads
    assert set_to is not None and seen and all(s == {set_to} for s in seen), (set_to, seen)
    assert sorted((p["filepath"], p["num_threads"]) for p in threadpool_info()
                  if p["user_api"] == "blas") == before  # put back
    np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-12)
    con.close()


def test_by_default_an_in_memory_database_keeps_its_payloads_in_the_temporary_directory():
    """The tmpfs is opt-in: a large output written there took 1.4-1.6x the time of one in the
    temporary directory's page cache (a 512 MB SpMM result), and its pages cannot be written
    back under memory pressure."""
    con = tensordb.connect()
    con.load("A", np.ones((2, 3)))
    assert con.store.tiles_dir == os.path.join(str(con.store.root), "tiles")
    con.close()
