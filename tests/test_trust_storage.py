"""Issue 9, items 1-3: no user path writes into the database directory, no missing or foreign
catalog leads to deleted payloads, and no user text reaches DuckDB as more than one SELECT.

Every refusal is checked for its error class and message, and for changing nothing: the catalog
rows and payload files are compared before and after, and the tensors are read back after a
reopen and compared with the numpy arrays they were loaded from.
"""
from __future__ import annotations

import os
import re

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.storage.identity import payload_name

A = np.arange(1.0, 13.0).reshape(3, 4)
B = np.arange(1, 7, dtype=np.int64).reshape(2, 3)


def files_of(root) -> dict[str, bytes]:
    """Every file under the database directory and its bytes (the WAL may legitimately change,
    so it and DuckDB's own temporary files are left out)."""
    out = {}
    for folder, _, names in os.walk(root):
        for n in names:
            if n.endswith(".wal") or ".tmp" in n:
                continue
            p = os.path.join(folder, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


@pytest.fixture
def db(tmp_path, monkeypatch):
    """An on-disk database w.tdb in the working directory, holding A (float64) and B (int64) and
    a user table."""
    monkeypatch.chdir(tmp_path)
    con = tensordb.connect("w.tdb")
    con.load("A", A, dims=["i", "j"], tile=(2, 2))
    con.load("B", B)
    con.sql("CREATE TABLE users AS SELECT 1 AS id UNION ALL SELECT 2")
    yield con
    con.close()


def assert_intact(con, snapshot, before):
    """Nothing changed: catalog rows, payload files, and the tensors after a reopen."""
    assert snapshot(con) == before
    root = con.store.root
    con.close()
    with tensordb.connect(root) as again:
        np.testing.assert_array_equal(again.tensor("A"), A)
        np.testing.assert_array_equal(again.tensor("B"), B)
        assert sorted(r[0] for r in again.sql("SELECT id FROM users").fetchall()) == [1, 2]


def payload(con, name="A") -> str:
    return os.path.join("w.tdb", "tiles", payload_name(con.store.meta(name).version, con.store.database))


# -- item 1: writes into the database directory --------------------------------------------------

@pytest.mark.parametrize("target", ["w.tdb/catalog.duckdb", "w.tdb/catalog.duckdb.wal",
                                    "PAYLOAD", "w.tdb/new.npy", "w.tdb/tiles/new.npy",
                                    "./w.tdb/../w.tdb/catalog.duckdb", "ABSOLUTE"])
def test_copy_tensor_into_database_refused(db, snapshot, target):
    target = payload(db, "A") if target == "PAYLOAD" else \
        os.path.abspath("w.tdb/catalog.duckdb") if target == "ABSOLUTE" else target
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError) as e:
        db.execute(f"COPY A TO '{target}' (FORMAT npy)")
    assert target in str(e.value) and "inside the database directory" in str(e.value)
    assert e.value.statement is not None  # names the statement
    with pytest.raises(tensordb.ProgrammingError):
        db.export("B", target, format="npy")
    assert not os.path.exists("w.tdb/new.npy") and not os.path.exists("w.tdb/tiles/new.npy")
    assert_intact(db, snapshot, before)


def test_export_through_symlinks_refused(db, snapshot, tmp_path):
    os.symlink(os.path.abspath("w.tdb"), "dirlink")             # a directory link
    os.symlink(os.path.abspath("w.tdb/catalog.duckdb"), "filelink.npy")  # a file link
    os.mkdir("elsewhere")
    os.link(payload(db, "B"), "elsewhere/hard.npy")             # a hard link to a payload
    before = snapshot(db)
    for target in ("dirlink/catalog.duckdb", "dirlink/tiles/x.npy", "filelink.npy",
                   "elsewhere/hard.npy"):
        with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
            db.export("A", target, format="npy")
        # (DuckDB itself refuses a COPY onto the open catalog file; the guard the rest)
        with pytest.raises(tensordb.ProgrammingError,
                           match="inside the database directory|belongs to an attached database"):
            db.sql(f"COPY (SELECT 1 AS x) TO '{target}'")
    assert_intact(db, snapshot, before)


PLAIN_SQL = [
    "COPY (SELECT * FROM A) TO 'w.tdb/catalog.duckdb' (FORMAT csv)",
    "COPY users TO 'PAYLOAD'",
    "COPY (SELECT 42 AS x) TO ('w.tdb' || '/tiles/' || 'new.bin')",  # an expression target
    "COPY users TO 'w.tdb' (FORMAT parquet, PARTITION_BY (id), WRITE_PARTITION_COLUMNS true)",
    "EXPORT DATABASE 'w.tdb/exported'",
    "EXPORT DATABASE 'w.tdb/tiles/exported'",
    "ATTACH 'w.tdb/tiles/other.db' AS other",
    "ATTACH 'w.tdb/catalog.duckdb' AS again",
    "SET temp_directory = 'w.tdb/tiles'",
    "SET profiling_output = 'w.tdb/catalog.duckdb'",
    "PRAGMA profile_output = 'w.tdb/tiles/p.json'",
    "SET log_query_path = 'w.tdb/catalog.duckdb'",
    "SET home_directory = 'w.tdb'",
    "CALL enable_logging(storage := 'file', storage_path := 'w.tdb/tiles')",
    "SELECT * FROM enable_logging(storage := 'file', storage_path := 'w.tdb/tiles')",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO 'w.tdb/tiles/new.bin'",
    "/* c */ EXPLAIN /* c */ (ANALYZE, FORMAT json) COPY (SELECT 1 AS x) TO 'w.tdb/tiles/new.bin'",
    "SELECT 1; COPY (SELECT 1 AS x) TO 'w.tdb/tiles/x.bin'",
    "SET VARIABLE target = 'w.tdb/tiles/new.bin'; COPY users TO (getvariable('target'))",
    "PREPARE p AS COPY users TO 'elsewhere.csv'",
]


@pytest.mark.parametrize("query", PLAIN_SQL)
@pytest.mark.parametrize("via", ["sql", "execute"])
def test_plain_sql_writing_into_database_refused(db, snapshot, query, via):
    query = query.replace("PAYLOAD", payload(db, "A"))
    before = snapshot(db)
    entries = sorted(os.listdir("w.tdb")), sorted(os.listdir("w.tdb/tiles"))
    run = db.sql if via == "sql" else db.execute
    with pytest.raises(tensordb.ProgrammingError) as e:
        run(query)
    message = str(e.value)
    if via == "execute" and ("PARTITION_BY" in query or "getvariable" in query):
        assert isinstance(e.value, tensordb.ParserError)  # the dialect's COPY takes no such forms
    elif "catalog.duckdb'" in query and "profiling" not in query and "log_query" not in query:
        # DuckDB itself refuses to COPY onto or ATTACH the open catalog file; the message names it
        assert "w.tdb/catalog.duckdb" in message
    elif "PREPARE" in query:
        assert "cannot PREPARE" in message
    else:
        assert "refused" in message and "inside the database directory" in message, message
    assert (sorted(os.listdir("w.tdb")), sorted(os.listdir("w.tdb/tiles"))) == entries
    assert not os.path.exists("elsewhere.csv")
    assert db.sql("SELECT current_setting('temp_directory')").fetchall()[0][0] != \
        os.path.abspath("w.tdb/tiles")
    assert_intact(db, snapshot, before)


def test_writes_outside_the_database_still_work(db, tmp_path):
    """The check refuses only what it must: COPY of a tensor's relation, EXPORT, ATTACH, SET and
    EXPLAIN ANALYZE outside the directory run, and their files hold the right data."""
    db.sql("COPY (SELECT i, j, value FROM A) TO 'a.csv' (HEADER true)")
    got = duckdb.sql("SELECT i, j, value FROM read_csv('a.csv') ORDER BY i, j").fetchall()
    expect = [(i, j, A[i, j]) for i in range(3) for j in range(4) if A[i, j] != 0]
    assert got == expect
    db.execute("COPY A TO 'a.npy'")
    np.testing.assert_array_equal(np.load("a.npy"), A)
    db.sql("SET VARIABLE target = 'b.csv'; COPY (SELECT * FROM B) TO (getvariable('target'))")
    assert duckdb.sql("SELECT count(*) FROM read_csv('b.csv')").fetchall() == [(B.size,)]
    db.sql("EXPORT DATABASE 'exported'")
    assert duckdb.sql("SELECT sum(id) FROM read_csv('exported/users.csv')").fetchall() == [(3,)]
    db.sql("ATTACH 'side.db' AS side; CREATE TABLE side.t AS SELECT 7 AS x; DETACH side")
    assert duckdb.connect("side.db").sql("SELECT x FROM t").fetchall() == [(7,)]
    db.sql("SET temp_directory = 'spill_here'")
    assert "Total Time" in str(db.sql("EXPLAIN ANALYZE SELECT sum(value) FROM A").fetchall())
    db.sql("PREPARE q AS SELECT sum(value) AS s FROM B")
    assert db.sql("EXECUTE q").fetchall() == [(B.sum(),)]


def test_relations_survive_a_refused_statement(db):
    """Checking a statement swaps the tensors it names for typed stand-ins while DuckDB binds it;
    a relation made before still reads the tensor afterwards."""
    rel = db.sql("SELECT sum(value) AS s FROM A")
    with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
        db.sql("COPY (SELECT * FROM A) TO 'w.tdb/tiles/x.csv'")
    assert rel.fetchall() == [(A.sum(),)]
    assert db.sql("SELECT count(*) FROM A").fetchall() == [(np.count_nonzero(A),)]


def test_parameters_with_a_write_target_refused(db, snapshot):
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError, match="parameters"):
        db.execute("COPY (SELECT 1 AS x) TO (?)", ["w.tdb/catalog.duckdb"])
    assert_intact(db, snapshot, before)


def test_in_memory_database_directory_protected():
    with tensordb.connect() as con:
        con.load("A", A)
        target = os.path.join(str(con.store.root), "tiles",
                              payload_name(con.store.meta('A').version, con.store.database))
        with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
            con.sql(f"COPY (SELECT 1 AS x) TO '{target}'")
        with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
            con.export("A", target, format="npy")
        np.testing.assert_array_equal(con.tensor("A"), A)


def test_load_from_inside_the_database_refused(db, snapshot):
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
        db.load("C", payload(db, "A"), format="npy")
    assert_intact(db, snapshot, before)


@pytest.mark.parametrize("via", ["python", "dialect"])
def test_a_table_path_that_duckdb_would_read_as_a_pattern(db, snapshot, via):
    """DuckDB reads a CSV or Parquet path as a glob pattern: d[b]/x.csv names a file in the
    directory 'd[b]', and matches w.tdb's neighbour 'db/x.csv' too. A path whose pattern matches
    anything but the file itself is refused (it once loaded the other file: a way round the
    check that LOAD reads nothing inside the database directory); one that matches only
    itself loads."""
    os.makedirs("db")
    with open(os.path.join("db", "x.csv"), "w") as f:
        f.write("i,j,value\n0,0,999\n")
    os.makedirs("d[b]")
    db.export("A", os.path.join("d[b]", "x.csv"))
    before = snapshot(db)
    load = (lambda name, path: db.load(name, path)) if via == "python" else \
        (lambda name, path: db.execute(f"LOAD TENSOR {name} FROM '{path}'"))
    with pytest.raises(tensordb.ProgrammingError, match=r"as a pattern .* matches db/x.csv"):
        load("C", os.path.join("d[b]", "x.csv"))
    assert snapshot(db) == before
    os.makedirs("e[1]")
    db.export("A", os.path.join("e[1]", "x.csv"))  # e1/ does not exist: only itself matches
    load("C", os.path.join("e[1]", "x.csv"))
    np.testing.assert_array_equal(db.tensor("C"), A)


def test_path_settings_cover_duckdb():
    """Every DuckDB setting whose description speaks of a file or directory is either checked
    or known not to name a place DuckDB writes (a new DuckDB setting fails this test)."""
    reads_or_not_a_path = {
        "allowed_directories", "allowed_paths", "binary_as_string", "cache_local_files",
        "default_block_size", "disabled_filesystems", "enable_external_file_cache",
        "enable_geoparquet_conversion", "external_file_cache_local_max_block_size",
        "external_file_cache_remote_max_block_size", "external_file_cache_remote_min_block_size",
        "external_file_cache_request_sizing", "external_file_cache_spill", "file_search_path",
        "fsync_mode", "logging_sink", "max_temp_directory_size", "parquet_can_have_nan",
        "parquet_metadata_cache", "parquet_use_page_index", "partitioned_write_max_open_files",
        "prefetch_all_parquet_files", "profiling_coverage", "profiling_renderer_settings",
        "schema", "search_path", "storage_compatibility_version", "temp_file_encryption",
        "validate_external_file_cache"}
    rows = duckdb.connect().sql(
        "SELECT name FROM duckdb_settings() WHERE description ILIKE '%file%' OR description "
        "ILIKE '%director%' OR description ILIKE '%path%'").fetchall()
    from tensordb.storage import guard
    unknown = {r[0] for r in rows} - guard.PATH_SETTINGS - reads_or_not_a_path
    assert not unknown, f"decide whether these settings name a place DuckDB writes: {unknown}"


# -- item 2: a missing or foreign catalog deletes nothing ------------------------------------------

def _database_with_payloads(path):
    with tensordb.connect(path) as con:
        con.load("A", A, tile=(1, 4))
        con.load("B", B)
    return files_of(path)


def test_missing_catalog_refused_and_nothing_deleted(tmp_path):
    path = tmp_path / "w.tdb"
    _database_with_payloads(path)
    os.unlink(path / "catalog.duckdb")
    if (path / "catalog.duckdb.wal").exists():
        os.unlink(path / "catalog.duckdb.wal")
    before = files_of(path)
    assert any(name.startswith("tiles") for name in before)
    for read_only in (False, True):
        with pytest.raises(tensordb.OperationalError) as e:
            tensordb.connect(path, read_only=read_only)
        assert "catalog.duckdb" in str(e.value) and "missing" in str(e.value)
        assert files_of(path) == before
        # no new catalog was created either (the database's id file stays, as it was, and
        # the snapshots directory of the writer that had it open)
        assert sorted(os.listdir(path)) == ["database.id", "snapshots", "tiles"]


@pytest.mark.parametrize("damage", ["empty duckdb file", "zero bytes", "tables dropped",
                                    "tiles table dropped", "tiles rows deleted"])
def test_foreign_or_damaged_catalog_deletes_no_payload(tmp_path, damage):
    path = tmp_path / "w.tdb"
    _database_with_payloads(path)
    payloads = sorted(os.listdir(path / "tiles"))
    catalog = str(path / "catalog.duckdb")
    if damage == "empty duckdb file":
        os.unlink(catalog)
        duckdb.connect(catalog).close()
    elif damage == "zero bytes":
        open(catalog, "wb").close()
    else:
        with duckdb.connect(catalog) as d:
            d.execute({"tables dropped": "DROP SCHEMA tensordb CASCADE",
                       "tiles table dropped": "DROP TABLE tensordb.tiles",
                       "tiles rows deleted": "DELETE FROM tensordb.tiles"}[damage])
    tiles_before = {n: (path / "tiles" / n).read_bytes() for n in payloads}
    if damage == "tiles rows deleted":
        # The tensors table still names both versions: their payloads are not orphans.
        tensordb.connect(path).close()
    else:
        with pytest.raises(tensordb.OperationalError) as e:
            tensordb.connect(path)
        assert "catalog" in str(e.value)
    assert {n: (path / "tiles" / n).read_bytes() for n in sorted(os.listdir(path / "tiles"))} \
        == tiles_before


def test_orphan_cleanup_keeps_directories_and_still_removes_orphans(tmp_path):
    path = tmp_path / "w.tdb"
    _database_with_payloads(path)
    os.makedirs(path / "tiles" / "user_dir")
    (path / "tiles" / "user_dir" / "keep.txt").write_text("mine")
    (path / "tiles" / "999.bin").write_bytes(b"x" * 64)  # a crash leftover: no row names it
    with tensordb.connect(path) as con:
        assert (path / "tiles" / "user_dir" / "keep.txt").read_text() == "mine"
        assert not (path / "tiles" / "999.bin").exists()
        np.testing.assert_array_equal(con.tensor("A"), A)


def test_empty_directory_and_empty_tiles_still_open(tmp_path):
    (tmp_path / "fresh").mkdir()
    with tensordb.connect(tmp_path / "fresh") as con:
        con.load("A", A)
    (tmp_path / "t" / "tiles").mkdir(parents=True)  # a database that crashed while being made
    with tensordb.connect(tmp_path / "t") as con:
        assert con.tensors() == []


# -- item 3: user text spliced into SQL ----------------------------------------------------------

INJECTIONS = [
    "SELECT 1.0 AS v); DROP TABLE users; --",
    "SELECT 1.0 AS v; DROP TABLE users",
    "DROP TABLE users",
    "SELECT 1.0 AS v) UNION ALL (SELECT 2.0",
    "COPY users TO 'x.csv'",
    "",
    "SELECT * FROM enable_logging(storage := 'file', storage_path := 'w.tdb/tiles')",
]


@pytest.mark.parametrize("query", INJECTIONS)
def test_load_query_must_be_one_select(db, snapshot, query):
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError):
        db.load("X", None, query=query)
    with pytest.raises(tensordb.ProgrammingError):
        db.load("X", query, format="sql")
    assert not os.path.exists("x.csv")
    assert_intact(db, snapshot, before)


def test_load_query_forms_that_are_one_select_work(db):
    db.load("X", None, query="SELECT 1.5 AS v -- a trailing comment")
    db.load("Y", None, query="WITH q AS (SELECT id, id * 2.0 AS v FROM users) SELECT v FROM q;")
    db.load("Z", None, query="FROM users SELECT id, id + 0.5 AS v ORDER BY id",
            index=["id"], value="v")
    np.testing.assert_array_equal(db.tensor("X"), [[1.5]])
    expect = duckdb.sql("SELECT id * 2.0 FROM (VALUES (1), (2)) t(id)").fetchnumpy()
    np.testing.assert_array_equal(db.tensor("Y").ravel(), sorted(expect[next(iter(expect))]))
    np.testing.assert_array_equal(db.tensor("Z"), [0, 1.5, 2.5])


def test_dialect_load_from_query_and_table_names(db, snapshot):
    db.sql("CREATE TABLE weights AS SELECT 2.5 AS v")
    db.execute("LOAD TENSOR W FROM weights")  # the table name reaches DuckDB quoted
    np.testing.assert_array_equal(db.tensor("W"), [[2.5]])
    db.execute("DROP TENSOR W")
    db.sql("DROP TABLE weights")
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError):
        db.execute("DESCRIBE users') OR true OR ('")
    with pytest.raises(tensordb.CatalogError, match="no tensor or table"):
        db.execute("COPY nosuch TO 'x.csv'")
    assert_intact(db, snapshot, before)


def test_explain_of_plain_sql_is_one_statement(db, snapshot):
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError):
        db.explain("SELECT 1 /* ; */; DROP TABLE users")
    text = db.explain("SELECT sum(value) FROM A")
    assert "PYTHON_ARROW_SCAN" in text or "ARROW" in text.upper()
    assert_intact(db, snapshot, before)


def test_guard_single_select_uses_duckdb_parser():
    from tensordb.storage import guard
    assert guard.single_select("SELECT ';' AS x;", "q") == "SELECT ';' AS x"
    assert guard.single_select("VALUES (1), (2)", "q") == "VALUES (1), (2)"
    for bad in ("SELECT 1; SELECT 2", "INSERT INTO t VALUES (1)", "SELECT (", "  ;  "):
        with pytest.raises(tensordb.ProgrammingError):
            guard.single_select(bad, "q")


# -- plain SQL may read the catalog schema but not change it ----------------------------------------

CATALOG_WRITES = [
    "DELETE FROM tensordb.tiles",
    "TRUNCATE \"TensorDB\".tiles",
    "DROP TABLE tensordb.tensors",
    "DROP SCHEMA tensordb CASCADE",
    "UPDATE tensordb.tensors SET nbytes = 0",
    "ALTER TABLE tensordb.tiles DROP COLUMN crc32",
    "INSERT INTO tensordb.tiles SELECT * FROM tensordb.tiles",
    "CREATE OR REPLACE TABLE tensordb.tiles AS SELECT 1 AS x",
    "CREATE VIEW tensordb.v AS SELECT 1 AS x",
    "COPY tensordb.tiles FROM 'rows.csv'",
    "USE tensordb; DELETE FROM tiles",
    "SELECT 1; DELETE FROM catalog.tensordb.tensors WHERE name = 'A'",
]


@pytest.mark.parametrize("query", CATALOG_WRITES)
def test_plain_sql_changing_the_catalog_refused(db, snapshot, query):
    with open("rows.csv", "w") as f:
        f.write("1\n")
    before = snapshot(db)
    with pytest.raises(tensordb.ProgrammingError) as e:
        db.sql(query)
    assert "refused" in str(e.value) and "tensordb's catalog" in str(e.value), str(e.value)
    assert re.search(r"change (catalog\.)?tensordb\b", str(e.value))  # names what it would change
    db.sql("USE main")
    assert_intact(db, snapshot, before)


def test_plain_sql_reading_the_catalog_and_copying_from_files_works(db):
    with open("rows.csv", "w") as f:
        f.write("7\n8\n")
    db.sql("CREATE TABLE t (a INTEGER)")
    db.sql("COPY t FROM 'rows.csv'")  # COPY ... FROM writes no file: not refused
    db.execute("INSERT INTO t VALUES (?)", [9])
    db.sql("INSERT INTO t SELECT count(*) FROM tensordb.tiles WHERE tensor = 'A'")
    # A is 3x4 in 2x2 tiles: a 2x2 grid of tiles
    assert sorted(r[0] for r in db.sql("SELECT a FROM t").fetchall()) == [4, 7, 8, 9]
    db.sql("DELETE FROM t WHERE a = 9")
    assert db.sql("SELECT count(*) FROM t").fetchall() == [(3,)]


def test_import_database_and_moving_the_current_database_refused(db, snapshot, tmp_path):
    """IMPORT DATABASE runs statements from files (here: one that would empty the catalog), and
    USE of another database would make tensordb write its catalog there: both refused."""
    os.mkdir("imp")
    with open("imp/schema.sql", "w") as f:
        f.write("DELETE FROM tensordb.tiles; DELETE FROM tensordb.tensors;\n")
    open("imp/load.sql", "w").close()
    db.sql("ATTACH 'side.db' AS side")
    before = snapshot(db)
    for query in ("IMPORT DATABASE 'imp'", "PRAGMA import_database('imp')"):
        with pytest.raises(tensordb.ProgrammingError, match="IMPORT DATABASE refused"):
            db.sql(query)
    for query in ("USE side", "USE side.main", "SET search_path = 'side.main'"):
        with pytest.raises(tensordb.ProgrammingError, match="current database"):
            db.sql(query)
    assert db.sql("SELECT current_database()").fetchall()[0][0] != "side"
    db.sql("USE main")  # a schema of the catalog's own database is fine
    db.sql("CREATE TABLE side.t AS SELECT 5 AS x")  # an attached database named in full is fine
    assert db.sql("SELECT x FROM side.t").fetchall() == [(5,)]
    db.sql("DETACH side")
    assert_intact(db, snapshot, before)
