"""What a failed statement, script or unit reports and leaves behind: scripts that are not UTF-8,
failures after a COMMIT, settings restored after a failure, guard refusals pointing into the
script, refused statements (USE, too many dimensions, bad SET values). Each test runs a real
database on disk, the command line as a subprocess where the command line is the point, and
checks the exit status, the message and that nothing changed that should not have."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb import cli as tensordb_cli
from tensordb.errors import Span, render_caret
from tensordb.result import Result

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TENSORDB_DEBUG": "", "PYTHONUNBUFFERED": "1",
       "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli(*args, stdin=None, cwd=None):
    """``tensordb ARGS``: (exit status, stdout, stderr). With piped ``stdin`` or a ``cwd``,
    ``python -m tensordb`` in a child (stdin's decoding and the working directory are the
    child's own); otherwise the same entry point, ``cli.main``, in this process (a fresh
    interpreter per call cost ~1 s of the suite's time)."""
    if stdin is None and cwd is None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = tensordb_cli.main([str(a) for a in args])
        return rc, out.getvalue(), err.getvalue()
    p = subprocess.run([sys.executable, "-m", "tensordb", *map(str, args)], input=stdin,
                       capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)
    return p.returncode, p.stdout, p.stderr


def names(db) -> list[str]:
    with tensordb.connect(db) as con:
        return sorted(m.name for m in con.store.list())


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    """As in ENV: no tracebacks under errors, whatever the shell running the tests set."""
    monkeypatch.delenv("TENSORDB_DEBUG", raising=False)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "db.tdb"
    with tensordb.connect(path) as con:
        con.load("A", np.arange(24, dtype=np.float64).reshape(6, 4))
    return path


# -- 1. scripts that are not UTF-8, and a byte order mark ------------------------------------------

def test_a_script_that_is_not_utf8_is_one_line_naming_file_and_offset(db, tmp_path):
    script = tmp_path / "latin.sql"
    script.write_bytes(b"B[i] = SUM(A[i,j]);\nSELECT \xff\xfe;\n")
    rc, out, err = cli(db, "-f", script)
    assert rc == 1
    assert err == f"{script}: cannot read: byte 0xff at offset 27 (line 2) is not UTF-8; save " \
                  "the script as UTF-8\n"
    assert names(db) == ["A"]


def test_read_of_a_script_that_is_not_utf8_leaves_the_shell_running(db, tmp_path):
    (tmp_path / "latin.sql").write_bytes(b"SELECT '\xe9';\n")
    rc, out, err = cli(db, stdin=".read latin.sql\nSELECT 42 AS answer;\n", cwd=tmp_path)
    assert "latin.sql: cannot read: byte 0xe9 at offset 8 (line 1) is not UTF-8" in err
    assert "Traceback" not in err
    assert "answer" in out and "42" in out  # the shell went on
    assert rc == 1  # piped: the failed .read counts


def test_a_leading_byte_order_mark_is_not_part_of_the_first_statement(db, tmp_path):
    script = tmp_path / "bom.sql"
    script.write_bytes(b"\xef\xbb\xbfB[i] = SUM(A[i,j]);\n")
    rc, out, err = cli(db, "-f", script)
    assert (rc, err) == (0, "")
    assert "B: float64 (6,)" in out
    assert names(db) == ["A", "B"]


def test_offsets_of_bad_bytes_count_the_byte_order_mark(db, tmp_path):
    script = tmp_path / "bom.sql"
    script.write_bytes(b"\xef\xbb\xbfSELECT \xff;\n")
    rc, _, err = cli(db, "-f", script)
    assert rc == 1 and "byte 0xff at offset 10 (line 1)" in err


# -- 2. printing a result never undoes it -------------------------------------------------------

def test_a_result_larger_than_the_memory_limit_is_printed_by_its_corners_and_kept(db, tmp_path):
    np.save(tmp_path / "big.npy", np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000))
    rc, out, err = cli(db, "-c", "SET memory_limit = '1MB'; LOAD TENSOR Big FROM 'big.npy'; "
                       "CREATE TENSOR Big2 FROM (SELECT i, j, 1.0 AS v FROM range(400) a(i), "
                       "range(400) b(j)) INDEX (i, j) VALUE v", cwd=tmp_path)
    assert (rc, err) == (0, "")
    assert "Big: float64 (1000, 1000)\n[[     0.      1.      2. ...    997.    998.    999.]" in out
    assert "Big2: float64 (400, 400)\n[[1. 1. 1. ... 1. 1. 1.]" in out
    assert names(db) == ["A", "Big", "Big2"]


def test_preview_reads_only_the_corners_when_the_dense_array_does_not_fit(db):
    with tensordb.connect(db) as con:
        con.execute("SET memory_limit = '100KB'")
        con.load("M", np.ones((200, 100)))  # 160 KB dense
        r = Result.for_tensor(con, "M")
        with pytest.raises(tensordb.OutOfMemoryError):
            r.tensor()
        assert r.preview().startswith("[[1. 1. 1. ... 1. 1. 1.]")
        assert str(r).startswith("M: float64 (200, 100)\n[[1. 1. 1. ...")


# -- 3. LOAD of a .npz file with several arrays ---------------------------------------------------

def test_load_of_a_whole_npz_stores_and_reports_every_array(db, tmp_path):
    np.savez(tmp_path / "multi.npz", a=np.ones(3), b=np.zeros((2, 2)))
    with tensordb.connect(db) as con:
        r = con.execute(f"LOAD TENSOR X FROM '{tmp_path / 'multi.npz'}'")
        assert r.message == "LOAD TENSOR X: loaded 2 tensors: X_a float64 (3,); X_b float64 (2, 2)"
        assert sorted(m.name for m in con.store.list()) == ["A", "X_a", "X_b"]
        np.testing.assert_array_equal(con.tensor("X_a"), np.ones(3))


# -- 4. what a failure after COMMIT says was stored ----------------------------------------------

def test_a_failure_after_a_commit_does_not_claim_the_block_was_rolled_back(db):
    rc, out, err = cli(db, "-c", "BEGIN; X[i] = SUM(A[i,j]); COMMIT; Y[i] = Nope[i]")
    assert rc == 1 and "CatalogError: unknown tensor 'Nope'" in err
    assert "rolled back" not in err and "nothing of" not in err
    assert names(db) == ["A", "X"]


def test_a_failure_after_a_commit_says_what_was_kept(db):
    rc, out, err = cli(db, "-c", "BEGIN; X[i] = SUM(A[i,j]); COMMIT; SELECT 1 AS one; "
                       "Y[i] = Nope[i]")
    assert rc == 1 and "one" in out
    assert err.endswith("-c: the statements after its last COMMIT were rolled back; those before "
                        "it were stored\n")
    assert names(db) == ["A", "X"]


def test_a_failure_in_a_block_keeps_what_ran_before_its_begin(db):
    rc, out, err = cli(db, "-c", "W[i] = SUM(A[i,j]); BEGIN; X[i] = SUM(A[i,j]); Y[i] = Nope[i]; "
                       "COMMIT")
    assert rc == 1
    assert err.endswith("-c: the statements after its last BEGIN were rolled back; those before "
                        "it were stored\n")
    assert names(db) == ["A", "W"]


def test_without_a_block_nothing_of_the_unit_is_stored(db):
    rc, out, err = cli(db, "-c", "X[i] = SUM(A[i,j]); SELECT 1; Y[i] = Nope[i]")
    assert rc == 1
    assert err.endswith("nothing of -c was stored: the statements before the error were rolled "
                        "back too\n")
    assert names(db) == ["A"]


# -- 5. a failed call leaves the settings as they were ------------------------------------------

def test_a_failed_execute_restores_the_settings_it_changed(db):
    with tensordb.connect(db) as con:
        before = con.execute("SHOW ALL").fetchall()
        threads = con.sql("SELECT current_setting('threads')").fetchall()
        duck_memory = con.sql("SELECT current_setting('memory_limit')").fetchall()
        with pytest.raises(tensordb.CatalogError, match="Nowhere"):
            con.execute("SET workers = 1; SET memory_limit = '1MB'; SET tiling = 'even'; "
                        "SET threads = 1; SET memory_limit = '1MB'; "
                        "C[i,k] = A[i,j] * Nowhere[j,k]")
        assert con.execute("SHOW ALL").fetchall() == before
        assert con.sql("SELECT current_setting('threads')").fetchall() == threads
        assert con.sql("SELECT current_setting('memory_limit')").fetchall() == duck_memory
        assert [m.name for m in con.store.list()] == ["A"]
        con.execute("SET workers = 1")  # a call that succeeds keeps its SET
        assert con.settings.workers == 1


def test_a_failed_execute_restores_duckdb_settings_that_were_not_defaults(db):
    """A setting a succeeding call changed comes back to that value, not to DuckDB's default:
    RESET, then SET to the text it had (a parameter, not spliced into the statement)."""
    with tensordb.connect(db) as con:
        con.execute("SET threads = 1")
        con.execute("SET search_path = 'main'")
        with pytest.raises(tensordb.CatalogError, match="Nope"):
            con.execute("SET threads = 2; SET search_path = 'main,temp'; X[i] = Nope[i]")
        assert con.sql("SELECT current_setting('threads'), current_setting('search_path')"
                       ).fetchall() == [(1, "main")]


def test_a_failed_shell_unit_restores_the_settings_for_the_next_one(db):
    rc, out, err = cli(db, stdin="SET tiling = 'even'; SET progress = off; X[i] = Nope[i];\n"
                                 "SHOW ALL;\n")
    assert rc == 1 and "<stdin>:1: CatalogError: unknown tensor 'Nope'" in err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.startswith(("tiling", "progress"))}
    assert rows == {"tiling": [], "progress": ["on"]}


# -- 6. plain SQL refused inside a script: the script's line and column ---------------------------

def test_guard_refusal_in_a_script_points_into_the_script(db, tmp_path):
    script = tmp_path / "g.sql"
    script.write_text("SELECT 1;\nSELECT 2;\n  COPY (SELECT 1) TO 'db.tdb/x.csv';\n")
    rc, out, err = cli(db, "-f", script, cwd=db.parent)
    assert rc == 1
    assert f"{script}:3: ProgrammingError: COPY statement refused" in err
    echo = "LINE 3:   COPY (SELECT 1) TO 'db.tdb/x.csv';"
    caret = " " * echo.index("db.tdb") + "^" + "~" * (len("db.tdb/x.csv") - 1)
    assert f"\n{echo}\n{caret}\n" in err
    assert not (db / "x.csv").exists()


def test_guard_refusal_inside_explain_analyze_points_into_the_script(db, monkeypatch):
    monkeypatch.chdir(db.parent)
    with tensordb.connect(db) as con:
        with pytest.raises(tensordb.ProgrammingError) as info:
            con.execute("SELECT 1;\nEXPLAIN ANALYZE COPY (SELECT 1) TO 'db.tdb/x.csv'")
    text = str(info.value)
    assert "LINE 2: EXPLAIN ANALYZE COPY (SELECT 1) TO 'db.tdb/x.csv'" in text
    assert "\n" + " " * len("LINE 2: EXPLAIN ANALYZE COPY (SELECT 1) TO '") + "^~" in text


def test_use_is_refused_as_use(db):
    rc, _, err = cli(db, "-c", "ATTACH ':memory:' AS m; USE m")
    assert rc == 1
    assert "ProgrammingError: USE statement refused: it would make 'm' the current database" in err
    assert "SET statement" not in err


# -- 7. more dimensions than numpy supports --------------------------------------------------------

def test_create_with_more_dimensions_than_numpy_supports_is_refused(db):
    dims = ",".join(["1"] * 66)
    rc, _, err = cli(db, "-c", f"CREATE TENSOR Z ({dims})")
    assert rc == 1
    assert "BinderError: tensor 'Z' would have 66 dimensions; numpy supports at most 64" in err
    assert "^" in err and "InternalError" not in err
    assert names(db) == ["A"]


def test_load_with_more_dimensions_than_numpy_supports_is_refused(db):
    cols = [f"c{k}" for k in range(65)]
    with tensordb.connect(db) as con:
        with pytest.raises(tensordb.ProgrammingError, match="would have 65 dimensions; numpy "
                                                            "supports at most 64"):
            con.execute(f"CREATE TENSOR Q FROM (SELECT {', '.join('0 AS ' + c for c in cols)}, "
                        f"1.0 AS v) INDEX ({', '.join(cols)}) VALUE v")
        assert [m.name for m in con.store.list()] == ["A"]


# -- 8. a piped shell's exit status ---------------------------------------------------------------

def test_a_piped_shell_exits_1_after_an_error(db):
    rc, out, err = cli(db, stdin="X[i] = A[i,j] * Nope[j];\nSELECT 42 AS answer;\n")
    assert rc == 1
    assert "<stdin>:1: CatalogError: unknown tensor 'Nope'" in err and "answer" in out
    rc, out, err = cli(db, stdin="SELECT 42 AS answer;\n")
    assert (rc, err) == (0, "")


# -- 9. values that mean nothing are refused --------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("SET progress = maybe", "progress must be on or off, got 'maybe'"),
    ("SET memory_limit = ''", "memory size is empty"),
])
def test_bad_set_values_are_refused_and_change_nothing(db, text, message):
    with tensordb.connect(db) as con:
        before = con.execute("SHOW ALL").fetchall()
        with pytest.raises(tensordb.ProgrammingError, match=message) as info:
            con.execute(text)
        assert "LINE 1: SET" in str(info.value)
        assert con.execute("SHOW ALL").fetchall() == before


def test_set_progress_still_takes_on_and_off(db):
    with tensordb.connect(db) as con:
        con.execute("SET progress = off")
        assert con.settings.progress is False
        con.execute("SET progress = ON")
        assert con.settings.progress is True


def test_create_or_replace_if_not_exists_is_refused(db):
    rc, _, err = cli(db, "-c", "CREATE OR REPLACE TENSOR IF NOT EXISTS A (3)")
    assert rc == 1
    assert "ParserError: CREATE OR REPLACE cannot go with IF NOT EXISTS\n" \
           "LINE 1: CREATE OR REPLACE TENSOR IF NOT EXISTS A (3)\n" \
           "                                 ^~~~~~~~~~~~~\n" in err
    with tensordb.connect(db) as con:
        assert con.store.meta("A").shape == (6, 4)


# -- 10. carets under tabs; an export suffix that names no format ------------------------------------

def test_the_caret_under_a_line_with_tabs_is_where_the_terminal_shows_the_text():
    text = "X = 1;\n\tY[i] =\tA[i,j] *\tNope[j];"
    at = text.index("Nope")
    echo, caret = render_caret(text, Span(at, at + 4)).split("\n")
    assert "\t" not in echo
    assert echo == "LINE 2: " + text.split("\n")[1].expandtabs(8)
    assert caret.index("^") == echo.index("Nope") and caret.endswith("^~~~")


def test_copy_to_an_unknown_suffix_names_it_and_the_known_formats(db, tmp_path):
    with tensordb.connect(db) as con:
        with pytest.raises(tensordb.ProgrammingError) as info:
            con.execute(f"COPY A TO '{tmp_path}/out.xyz'")
    assert f"cannot export to '{tmp_path}/out.xyz': unknown format (the suffix '.xyz' names " \
           "none)" in str(info.value)
    assert "HINT: formats: npy (.npy), parquet (.parquet, .pq), csv (.csv)" in str(info.value)
    assert not (tmp_path / "out.xyz").exists()


def test_piped_bytes_that_are_not_utf8_skip_their_statement_in_one_line(db):
    """Bytes that are not UTF-8 piped into the shell: one line says so, the statement is
    skipped, the others run, and the exit status is 1 (it was an internal error, a TypeError
    from DuckDB's parser)."""
    p = subprocess.run([sys.executable, "-m", "tensordb", str(db)],
                       input=b"SELECT 1 AS a;\nSELECT \xff;\nSELECT 2 AS b;\n",
                       capture_output=True, env=ENV, timeout=300)
    err = p.stderr.decode()
    assert p.returncode == 1
    assert "<stdin>:2: cannot read: a line holds bytes that are not UTF-8" in err
    assert "internal error" not in err and "Traceback" not in err
    assert p.stdout.decode().count("(1 row)") == 2  # the statements before and after it ran


def test_an_empty_database_path_is_refused_in_one_line(tmp_path):
    rc, out, err = cli("", "-c", "SELECT 1", cwd=tmp_path)
    assert rc == 1 and err.strip() == "tensordb: the database path is empty (leave it out " \
        "for an in-memory database)"
    assert list(tmp_path.iterdir()) == []


def test_a_failure_inside_a_transaction_begun_with_sql_is_reported_as_itself(db):
    """A unit that fails inside the user's transaction (which DuckDB then aborts): putting
    DuckDB's settings back would read them in the aborted transaction, and that error
    replaced the unit's own (an OperationalError instead of the IntegrityError)."""
    with tensordb.connect(db) as con:
        con.sql("CREATE TABLE t (a INT PRIMARY KEY)")
        con.sql("INSERT INTO t VALUES (1)")
        con.sql("BEGIN")
        with pytest.raises(tensordb.IntegrityError, match="Duplicate key"):
            con.execute("SET tiling = 'even'; SET threads = 1; INSERT INTO t VALUES (1)")
        assert con.settings.tiling != "even"  # tensordb's own settings are put back
        con.sql("ROLLBACK")
        assert con.sql("SELECT count(*) FROM t").fetchall() == [(1,)]
