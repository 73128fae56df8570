"""Reads verify checksums (storage/verify.py), a database has an identity that its payloads carry
and its workers check (storage/identity.py), and where the storage is is declared.

Real database directories, real Dask clusters on 127.0.0.1, real child processes (a reader
unpickled in one; an export killed with SIGKILL in another) and, where the machine allows it, a
Dask worker in another mount namespace that sees another database at the same path. Oracles:
numpy's arithmetic on the arrays loaded, zlib's crc32, and the catalog read with DuckDB itself.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.storage import verify
from tensordb.formats.export import remove_leftovers
from tensordb.storage.identity import ID_FILE
from tests.harness import kill9, start_script

A = np.arange(1, 65, dtype="float64").reshape(8, 8)  # tiles (4, 4): four tiles of 128 bytes
B = np.arange(64, dtype="float64").reshape(8, 8) % 5 - 2
OTHER_A = -A  # the other database's A: same name, shape, tiling and file layout


def make_db(root, a=A):
    with tensordb.connect(root) as con:
        con.load("A", a, tile=(4, 4), dims=["i", "j"])
        con.load("B", B, dims=["j", "k"])
    return str(root)


def catalog(root, sql, params=()):
    with duckdb.connect(os.path.join(root, "catalog.duckdb"), read_only=True) as d:
        return d.execute(sql, list(params)).fetchall()


def payload(root, name="A") -> str:
    [(f,)] = catalog(root, "SELECT DISTINCT t.file FROM tensordb.tiles t JOIN tensordb.tensors m "
                           "ON m.name = t.tensor AND m.version = t.version WHERE t.tensor = ?",
                     [name])
    return os.path.join(root, "tiles", f)


def flip(path, at=300, fresh=True):
    """Invert four bytes of tile (1, 0) of A (bytes 256-383), the file's size unchanged; then
    (``fresh``) read on as a process that has not read the file yet (this one wrote it, and a
    change within one tick of the file system's clock keeps its modification time)."""
    with open(path, "r+b") as f:
        f.seek(at)
        data = f.read(4)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))
    if fresh:
        verify.forget_verified()


def tiles_files(root):
    return {n: open(os.path.join(root, "tiles", n), "rb").read()
            for n in os.listdir(os.path.join(root, "tiles"))}


# -- reads verify checksums, once per process -----------------------------------------------------

def test_each_tile_is_verified_on_its_first_read_in_the_process(tmp_path, monkeypatch):
    calls = []
    real = verify.crc32

    def counting(data, value=0):
        calls.append(len(memoryview(data).cast("B")))
        return real(data, value)
    monkeypatch.setattr(verify, "crc32", counting)
    root = make_db(tmp_path / "w.tdb")
    verify.forget_verified()  # as a process that did not write them
    with tensordb.connect(root, workers=2) as con:
        np.testing.assert_array_equal(con.tensor("A"), A)
        assert sorted(calls) == [128] * 4  # every tile of A, once
        calls.clear()
        np.testing.assert_array_equal(con.tensor("A"), A)
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), A @ B)
        assert [n for n in calls if n == 128] == []  # A's tiles were not checksummed again
        assert con.sql("SELECT sum(value) FROM A").fetchall()[0][0] == A.sum()
        # A new version written here: its checksums were taken from the bytes written
        con.load("A", A * 3, tile=(4, 4), dims=["i", "j"], replace=True)
        calls.clear()
        np.testing.assert_array_equal(con.tensor("A"), 3 * A)
        assert calls == []
        verify.forget_verified()  # another process reads it: every tile is checked
        np.testing.assert_array_equal(con.tensor("A"), 3 * A)
        assert sorted(calls) == [128] * 4


def test_damage_after_a_verified_read_is_still_found(tmp_path):
    """The process remembers verified tiles by the file's identity (inode, mtime, size): bytes
    changed in place after a verified read are checked again and refused."""
    root = make_db(tmp_path / "w.tdb")
    with tensordb.connect(root) as con:
        np.testing.assert_array_equal(con.tensor("A"), A)
    path = payload(root)
    time.sleep(0.05)  # a later modification time even on coarse clocks
    flip(path, fresh=False)
    with tensordb.connect(root, workers=2) as con:
        for read in (lambda: con.tensor("A"), lambda: con.execute("C[i,j] = A[i,j] + 1"),
                     lambda: con.sql("SELECT max(value) FROM A").fetchall()):
            with pytest.raises(tensordb.DataError) as info:
                read()
            text = str(info.value)
            assert "tensor 'A'" in text and "tile (1, 0)" in text and path in text, text
            assert "CRC-32" in text
        assert not con.store.has("C")
        check = con.check()
        assert [(r["tensor"], r["tile"]) for r in check if r["tile"] is not None] == [("A", (1, 0))]


def test_a_damaged_tile_never_becomes_part_of_a_new_tensor(tmp_path):
    """Every statement that would copy the damaged tile fails and stores nothing; the tensors
    that do not read it still compute."""
    root = make_db(tmp_path / "w.tdb")
    flip(payload(root))
    before = tiles_files(root)
    with tensordb.connect(root, workers=2) as con:
        for sql in ("C[i,j] = A[i,j]", "C[i,k] = SUM(A[i,j] * B[j,k])", "A[i,j] = A[i,j] * 2",
                    "CREATE TENSOR C FROM (SELECT i, j, value FROM A) INDEX (i, j) VALUE value"):
            with pytest.raises(tensordb.DataError, match=r"tile \(1, 0\)"):
                con.execute(sql)
            assert not con.store.has("C")
        con.execute("D[j,k] = B[j,k] * 2")
        np.testing.assert_array_equal(con.tensor("D"), 2 * B)
        con.execute("DROP TENSOR D")
    assert tiles_files(root) == before  # A's file as it was, no new payload left behind


@pytest.mark.gpu
def test_a_damaged_tile_on_the_gpu_executor(tmp_path):
    """The GPU executor's loads read through the same reader: the tile is checked before it is
    copied to the device."""
    root = make_db(tmp_path / "w.tdb")
    path = payload(root)
    flip(path)
    with tensordb.connect(root, executor="gpu") as con:
        with pytest.raises(tensordb.DataError) as info:
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        assert "tile (1, 0)" in str(info.value) and path in str(info.value)
        assert not con.store.has("C")
        con.execute("D[j,k] = B[j,k] * 2")
        np.testing.assert_array_equal(con.tensor("D"), 2 * B)


# -- checksums and identity on Dask workers --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    with local_cluster(2, local_directory=str(tmp_path_factory.mktemp("dask-trust"))) as c:
        yield c


@pytest.mark.distributed
@pytest.mark.parametrize("storage", ["local", "shared"])
def test_workers_that_see_the_database_read_the_files_and_verify_them(cluster, tmp_path, storage):
    root = make_db(tmp_path / "w.tdb")
    spec = f"dask://{cluster.scheduler_address}"
    with tensordb.connect(root, executor=spec, storage=storage) as con:
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), A @ B)
        run = con._get_executor().last_run
        assert run["scattered_bytes"] == 0  # both workers answered that they see it
    path = payload(root)
    time.sleep(0.05)  # the workers verified A's file: a change must come a clock tick later
    flip(path)
    for extra in ("", "?scatter=always"):  # read by the workers, or by the client
        with tensordb.connect(root, executor=spec + extra, storage=storage) as con:
            with pytest.raises(tensordb.DataError) as info:
                con.execute("E[i,k] = SUM(A[i,j] * B[j,k])")
            text = str(info.value)
            assert "tensor 'A'" in text and "tile (1, 0)" in text and path in text, text
            assert not con.store.has("E")


CHILD = r"""
import json, pickle, sys
import tensordb
reader = pickle.load(open(sys.argv[1], "rb"))
try:
    out = {"value": reader.to_numpy().tolist(), "box": reader.read_box((0, 0), (8, 8)).tolist()}
except tensordb.Error as exc:
    out = {"error": type(exc).__name__, "message": str(exc)}
print(json.dumps(out))
"""


def _read_in_child(pickled):
    done = subprocess.run([sys.executable, "-c", CHILD, pickled], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_reader_in_another_process_checks_the_database_at_its_path(tmp_path, monkeypatch):
    """Two databases whose payload files have the same names: a reader shipped to a process
    that finds the other one at the path refuses to read, naming itself and the path; where
    there is no database, likewise; where it is the right one, it reads the right values."""
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    root = make_db(tmp_path / "w.tdb")
    with tensordb.connect(root, read_only=True) as con:
        reader = con.store.open("A")
        ours = con.store.database
    pickled = str(tmp_path / "reader.pickle")
    with open(pickled, "wb") as f:
        pickle.dump(reader, f)
    right = _read_in_child(pickled)
    np.testing.assert_array_equal(right["value"], A)
    np.testing.assert_array_equal(right["box"], A)

    other = make_db(tmp_path / "other.tdb", a=OTHER_A)
    name = os.path.basename(reader.path)
    with duckdb.connect(os.path.join(other, "catalog.duckdb")) as d:  # give its A our A's name
        [(theirs,)] = d.execute("SELECT DISTINCT file FROM tensordb.tiles WHERE tensor = 'A'").fetchall()
        d.execute("UPDATE tensordb.tiles SET file = ? WHERE tensor = 'A'", [name])
    os.rename(os.path.join(other, "tiles", theirs), os.path.join(other, "tiles", name))
    os.rename(root, str(tmp_path / "away.tdb"))
    os.rename(other, root)  # the other database, at our path, with a payload of the same name
    wrong = _read_in_child(pickled)
    assert wrong["error"] == "OperationalError", wrong
    text = wrong["message"]
    assert "process" in text and root in text and reader.path in text and ours in text, text
    assert "another database" in text, text

    shutil.rmtree(root)  # no database at all
    gone = _read_in_child(pickled)
    assert gone["error"] == "OperationalError" and root in gone["message"], gone
    assert "no directory" in gone["message"], gone


def _unshare_prefix(tmp_path):
    """The command prefix that runs a process in a mount namespace of its own where it may
    bind-mount one directory over another, or None."""
    if shutil.which("unshare") is None:
        return None
    a, b = tmp_path / "ns-a", tmp_path / "ns-b"
    a.mkdir()
    b.mkdir()
    for prefix in (["unshare", "-m"], ["unshare", "-Urm"]):
        try:
            ok = subprocess.run(prefix + ["sh", "-c", f"mount --bind {a} {b}"],
                                capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return prefix
    return None


@pytest.fixture
def namespaced_worker(tmp_path):
    """start(root, other) -> (scheduler address, worker address): a scheduler on 127.0.0.1 and
    one Dask worker in its own mount namespace, where ``other`` is bind-mounted over ``root``:
    the worker sees another database at the client's path, as one on another machine would."""
    pytest.importorskip("distributed")
    prefix = _unshare_prefix(tmp_path)
    if prefix is None:
        pytest.skip("no mount namespaces here (unshare -m): the child-process test covers this")
    from distributed import Client, LocalCluster
    started = []

    def start(root, other):
        cluster = LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None,
                               scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
        script = (f"mount --bind {other} {root} && exec {sys.executable} -m "
                  f"distributed.cli.dask_worker {cluster.scheduler_address} --host 127.0.0.1 "
                  f"--nthreads 1 --nworkers 1 --no-dashboard "
                  f"--local-directory {tmp_path / 'dask-ns'}")
        proc = subprocess.Popen(prefix + ["sh", "-c", script], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        started.append((cluster, proc))
        with Client(cluster.scheduler_address, timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
            [address] = client.ncores()
        return cluster.scheduler_address, address

    yield start
    for cluster, proc in started:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.close()


@pytest.mark.distributed
def test_a_worker_that_sees_another_database_at_the_same_path(tmp_path, namespaced_worker):
    root = make_db(tmp_path / "w.tdb")
    other = make_db(tmp_path / "other.tdb", a=OTHER_A)
    scheduler, worker = namespaced_worker(root, other)
    before, paths = tiles_files(root), (payload(root, "A"), payload(root, "B"))
    spec = f"dask://{scheduler}"
    # Declared shared: the worker is asked before anything runs, and says it sees another one.
    with tensordb.connect(root, executor=spec, storage="shared") as con:
        with pytest.raises(tensordb.OperationalError) as info:
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        text = str(info.value)
        assert f"Dask worker {worker}" in text and root in text and "another database" in text, text
        assert not con.store.has("C")
    # Local storage, the worker made to read the files: it checks the id before it maps one.
    with tensordb.connect(root, executor=spec + "?scatter=never") as con:
        with pytest.raises(tensordb.OperationalError) as info:
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        text = str(info.value)
        assert f"Dask worker {worker}" in text and any(p in text for p in paths), text
        assert "another database" in text and not con.store.has("C")
    # Local storage as declared: the worker is sent the tiles, and the answer is right.
    with tensordb.connect(root, executor=spec) as con:
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), A @ B)
        assert con._get_executor().last_run["scattered_bytes"] > 0
        con.execute("DROP TENSOR C")
    assert tiles_files(root) == before


@pytest.mark.distributed
def test_a_worker_that_sees_a_stale_copy_of_the_database(tmp_path, namespaced_worker):
    """A copy of the database (same id, same payload names) whose bytes differ: the id check
    passes, the checksums do not."""
    root = make_db(tmp_path / "w.tdb")
    copy = str(tmp_path / "copy.tdb")
    shutil.copytree(root, copy)
    flip(payload(copy))
    scheduler, _ = namespaced_worker(root, copy)
    path = payload(root)
    with tensordb.connect(root, executor=f"dask://{scheduler}", storage="shared") as con:
        with pytest.raises(tensordb.DataError) as info:
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        text = str(info.value)
        assert "tensor 'A'" in text and "tile (1, 0)" in text and path in text, text
        assert not con.store.has("C")


# -- the identity ---------------------------------------------------------------------------------

def test_a_database_has_an_id_in_its_catalog_its_id_file_and_its_payload_names(tmp_path):
    root = make_db(tmp_path / "w.tdb")
    [(ident,)] = catalog(root, "SELECT id FROM tensordb.identity")
    assert len(ident) == 32 and int(ident, 16) >= 0
    assert open(os.path.join(root, ID_FILE)).read().strip() == ident
    files = {f for (f,) in catalog(root, "SELECT DISTINCT file FROM tensordb.tiles")}
    assert len(files) == 2 and all(f.endswith(f"-{ident[:16]}.bin") for f in files)
    with tensordb.connect(root) as con:
        assert con.store.database == ident  # kept across opens
    other = make_db(tmp_path / "other.tdb")
    assert catalog(other, "SELECT id FROM tensordb.identity") != [(ident,)]
    with tensordb.connect() as mem:
        assert mem.store.database and mem.store.database != ident


def test_an_older_database_gets_an_id_and_its_payloads_stay_readable(tmp_path):
    """A database written before ids (no identity table, no id file, payloads named
    <version>.bin): read-only it opens without an id; the first open for writing gives it one,
    and its old payloads keep their names and read as before."""
    root = make_db(tmp_path / "w.tdb")
    with duckdb.connect(os.path.join(root, "catalog.duckdb")) as d:
        d.execute("DROP TABLE tensordb.identity")
        for (f,) in d.execute("SELECT DISTINCT file FROM tensordb.tiles").fetchall():
            old = f.split("-")[0] + ".bin"
            os.rename(os.path.join(root, "tiles", f), os.path.join(root, "tiles", old))
            d.execute("UPDATE tensordb.tiles SET file = ? WHERE file = ?", [old, f])
    os.unlink(os.path.join(root, ID_FILE))
    with tensordb.connect(root, read_only=True) as con:
        assert con.store.database is None
        np.testing.assert_array_equal(con.tensor("A"), A)
    assert not os.path.exists(os.path.join(root, ID_FILE))
    with tensordb.connect(root) as con:
        ident = con.store.database
        assert ident and open(os.path.join(root, ID_FILE)).read().strip() == ident
        np.testing.assert_array_equal(con.tensor("A"), A)
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), A @ B)
        assert con.check()[-1]["problem"] == "ok"
    files = dict(catalog(root, "SELECT tensor, any_value(file) FROM tensordb.tiles GROUP BY 1"))
    assert files["A"] == payload(root).rsplit("/", 1)[1] and "-" not in files["A"]
    assert files["C"].endswith(f"-{ident[:16]}.bin")
    assert catalog(root, "SELECT id FROM tensordb.identity") == [(ident,)]


def test_check_database_reports_a_wrong_or_missing_id_file(tmp_path):
    root = make_db(tmp_path / "w.tdb")
    [(ident,)] = catalog(root, "SELECT id FROM tensordb.identity")
    id_file = os.path.join(root, ID_FILE)
    for damage, words in (("other", "holds 0123"), ("missing", "is missing")):
        if damage == "other":
            with open(id_file, "w") as f:
                f.write("0123" * 8)
        else:
            os.unlink(id_file)
        with tensordb.connect(root, read_only=True) as con:
            rows = con.check()
        problems = [r["problem"] for r in rows if r["file"] == ID_FILE]
        assert len(problems) == 1 and words in problems[0] and ident in problems[0], rows
        assert rows[-1]["problem"] != "ok"
    with tensordb.connect(root) as con:  # an open for writing rewrites it
        assert con.check()[-1]["problem"] == "ok"
    assert open(id_file).read().strip() == ident


def test_storage_is_declared(tmp_path):
    with tensordb.connect(tmp_path / "a.tdb") as con:
        assert con.store.storage == "local"  # the default: the client's directory
    with tensordb.connect(tmp_path / "b.tdb", storage="shared") as con:
        assert con.store.storage == "shared"
    with pytest.raises(tensordb.NotSupportedError, match="scheme 'gs' is not supported"):
        tensordb.connect(tmp_path / "c.tdb", storage="gs://bucket/w.tdb")  # s3:// only
    with pytest.raises(tensordb.ProgrammingError, match="unknown storage 'nfs'"):
        tensordb.connect(tmp_path / "d.tdb", storage="nfs")
    assert not os.path.exists(tmp_path / "c.tdb") and not os.path.exists(tmp_path / "d.tdb")


# -- a killed export's leftovers ------------------------------------------------------------------

EXPORT_CHILD = r"""
import sys, tensordb
with tensordb.connect(sys.argv[1], read_only=True) as con:
    con.export("Big", sys.argv[2])
"""


def test_the_next_export_removes_what_a_killed_export_left(tmp_path):
    root = str(tmp_path / "w.tdb")
    big = np.random.default_rng(0).standard_normal((2000, 500))
    with tensordb.connect(root) as con:
        con.load("Big", big)
    target = str(tmp_path / "big.csv")
    child = start_script(EXPORT_CHILD, root, target)
    tmp = str(tmp_path / f".big.csv.{child.pid}.tmp")
    deadline = time.monotonic() + 60
    while not os.path.exists(tmp) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    if not os.path.exists(tmp):
        child.kill()
        child.wait()
        pytest.fail("the child export finished or failed before its temporary file was seen")
    kill9(child)
    assert os.path.exists(tmp) and not os.path.exists(target)  # what the kill left
    with tensordb.connect(root) as con:
        con.export("Big", target)
    assert glob.glob(str(tmp_path / ".big.csv.*")) == []
    rows = duckdb.sql(f"SELECT i, j, value FROM read_csv('{target}')").fetchnumpy()
    back = np.zeros_like(big)
    back[rows["i"], rows["j"]] = rows["value"]
    np.testing.assert_allclose(back, big, rtol=1e-15)


def test_a_live_exports_temporary_file_is_left_alone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        target = str(tmp_path / "a.npy")
        names = [f".a.npy.{dead.pid}.tmp", f".a.npy.{dead.pid}.tmp.tensordb.json",
                 f".a.npy.{live.pid}.tmp", ".b.npy.1.tmp", "a.npy.12.tmp"]
        for n in names:
            (tmp_path / n).write_bytes(b"x")
        with tensordb.connect() as con:
            con.load("A", A)
            con.export("A", target)
        np.testing.assert_array_equal(np.load(target), A)
        assert sorted(os.listdir(tmp_path)) == sorted(["a.npy"] + names[2:])
        assert remove_leftovers(target) == []
    finally:
        live.kill()
        live.wait()
