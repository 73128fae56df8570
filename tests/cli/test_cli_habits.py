"""The habits users bring from psql, sqlite3 and duckdb, tried as they would try them: the shell
on a pseudo-terminal (help, exit, quit, \\?, \\q, `.timer on;`, history, quiet), piped scripts
through a pipe (no banner nor prompts; errors at their line), and the messages of SET and DROP
TENSOR IF EXISTS from the command line."""
from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb import cli
from tests.cli.test_cli import fed
from tests.cli.test_cli_conventions import ENV, Terminal

ROOT = Path(__file__).resolve().parents[2]


def piped_subprocess(db, text: str, *args) -> subprocess.CompletedProcess:
    """``python -m tensordb DB ARGS`` with ``text`` on a real pipe."""
    return subprocess.run([sys.executable, "-m", "tensordb", str(db), *args], input=text,
                          capture_output=True, text=True, env=ENV, timeout=300)


def piped(db, text: str, *args) -> subprocess.CompletedProcess:
    """The same through ``cli.main`` in this process, ``text`` as a stdin that is not a
    terminal (a fresh interpreter per call cost ~1 s of the suite's time; the real pipe is
    tried by test_piped_input_prints_no_banner_nor_prompts_and_errors_name_their_line)."""
    argv = [str(db), *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    stdin, sys.stdin = sys.stdin, io.StringIO(text)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    finally:
        sys.stdin = stdin
    return subprocess.CompletedProcess(argv, rc, out.getvalue(), err.getvalue())


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    """As in ENV: no tracebacks under errors, whatever the shell running the tests set."""
    monkeypatch.delenv("TENSORDB_DEBUG", raising=False)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "db.tdb"
    with tensordb.connect(path) as con:
        con.load("P", np.arange(6, dtype=np.float64).reshape(3, 2))
    return path


# -- piped input is a script ---------------------------------------------------------------------

def test_piped_input_prints_no_banner_nor_prompts_and_errors_name_their_line(db):
    script = ("SELECT 1 AS a;\n"          # 1
              "\n"                        # 2
              "SELECT\n"                  # 3
              "  nope\n"                  # 4: the error
              "FROM P;\n"                 # 5
              "-- a comment\n"            # 6
              "SELECT 2 AS\n"             # 7
              "  b +;\n")                 # 8: a syntax error at the end
    done = piped_subprocess(db, script)
    assert done.returncode == 1
    assert "tensordb>" not in done.stdout and "...>" not in done.stdout
    assert "tensordb " + tensordb.__version__ not in done.stdout  # no banner
    assert done.stdout.startswith("a\n")
    assert "<stdin>:4: BinderError: Referenced column \"nope\" not found" in done.stderr
    assert "LINE 4:   nope\n          ^" in done.stderr
    assert "<stdin>:8: ParserError" in done.stderr and "LINE 8:" in done.stderr
    assert "<stdin>:1" not in done.stderr


def test_piped_commands_end_with_a_semicolon_or_not(db):
    done = piped(db, ".timer on;\nSELECT 7 AS seven;\nquit;\nSELECT 'not reached' AS x;\n")
    assert done.returncode == 0, done.stderr
    assert "timer on" in done.stdout and "Run Time:" in done.stdout and "seven" in done.stdout
    assert "not reached" not in done.stdout and done.stderr == ""


def shell_fed(lines: list[str]) -> tuple[str, str]:
    """The shell reading ``lines`` as piped input does (in this process: quicker than a child
    per case; the pipe itself is tested above): (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with tensordb.connect() as con:
        cli.Shell(con, out=out, err=err).repl(read=fed(lines), interactive=False)
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("leave", ["quit", "quit;", "exit", "exit;", " QUIT ", ".quit;", ".exit",
                                   "\\q", "\\q;", "\\quit"])
def test_every_way_out_leaves(leave):
    out, err = shell_fed(["SELECT 1 AS one;", leave, "SELECT 'not reached' AS x;"])
    assert err == "" and "one" in out and "not reached" not in out


@pytest.mark.parametrize("ask", ["help", "help;", "\\?", ".help;", "HELP", "\\h"])
def test_every_way_to_ask_for_help(ask):
    out, err = shell_fed([ask])
    assert err == "" and "Statements end with ';'" in out and ".quit" in out


def test_help_inside_a_statement_is_part_of_it():
    out, err = shell_fed(["SELECT 1 AS", "help;"])  # psql too: only a line of its own is a command
    assert "Statements end with ';'" not in out
    assert re.search(r"^help\s*$", out, re.M) and re.search(r"^1\s*$", out, re.M), out


def test_a_tensor_named_help_is_still_reachable(db):
    with tensordb.connect(db) as con:
        con.load("help", np.arange(3.0))
    done = piped(db, 'SELECT sum(value) AS s FROM "help";\n')
    assert done.returncode == 0 and re.search(r"^3(\.0)?\s*$", done.stdout, re.M)


# -- on a terminal -------------------------------------------------------------------------------

def test_terminal_words_commands_and_timer(db):
    term = Terminal(db)
    try:
        banner = term.until(Terminal.PROMPT)
        assert f"tensordb {tensordb.__version__}" in banner and "help for help" in banner
        term.send("help")
        assert "Statements end with ';'" in term.until(Terminal.PROMPT)
        term.send("\\?")
        assert ".timer on|off" in term.until(Terminal.PROMPT)
        term.send(".timer on;")
        assert "timer on" in term.until(Terminal.PROMPT)
        term.send("SELECT 41 + 1 AS answer;")
        shown = term.until(Terminal.PROMPT)
        assert "42" in shown and "Run Time:" in shown
        term.send("quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.release()


def test_a_statement_over_several_lines_is_one_history_entry(db):
    home = Path(db).parent / "home"
    term = Terminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send("SELECT 6 * 7")
        term.until("...> ")
        term.send("  AS answer;")
        assert "42" in term.until(Terminal.PROMPT)
        os.write(term.master, b"\x1b[A")  # the up arrow recalls the whole statement
        term.send("")
        shown = term.until(Terminal.PROMPT)
        assert "42" in shown and "(1 row)" in shown
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
            term.proc.wait()
    history = (home / ".tensordb_history").read_text().splitlines()
    assert "SELECT 6 * 7 AS answer;" in history
    assert "  AS answer;" not in history and "SELECT 6 * 7" not in history


# -- quiet ---------------------------------------------------------------------------------------

SCRIPT = ("CREATE OR REPLACE TENSOR A (i 2, j 2);\n"
          "B[i,j] = A[i,j] + 3;\n"
          "SET workers = 1;\n"
          "SELECT sum(value) AS total FROM B;\n"
          "B;\n"
          "EXPLAIN C[i,k] = B[i,j] * B[j,k];\n")


def test_quiet_prints_what_queries_return_only(db):
    loud = piped(db, SCRIPT)
    quiet = piped(db, SCRIPT, "-q")
    assert loud.returncode == quiet.returncode == 0
    assert "CREATE TENSOR A" in loud.stdout and "SET workers = 1" in loud.stdout
    for said in ("CREATE TENSOR A", "SET workers", "B: float64 (2, 2)\n[[3. 3.]"):
        assert quiet.stdout.count(said) == loud.stdout.count(said) - 1, said
    assert re.search(r"^12(\.0)?\s*$", quiet.stdout, re.M)  # the SELECT
    assert "B: float64 (2, 2)" in quiet.stdout  # the tensor printed by its name
    assert "EXPLAIN" in quiet.stdout


def test_quiet_in_a_script_lasts_to_its_end(db, tmp_path):
    script = tmp_path / "q.sql"
    script.write_text("SET quiet = on;\nCREATE TENSOR Q1 (i 2);\nSELECT 5 AS five;\n")
    done = subprocess.run([sys.executable, "-m", "tensordb", str(db), "-f", str(script),
                           "-c", "CREATE TENSOR Q2 (i 2)"], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "CREATE TENSOR Q1" not in done.stdout and "five" in done.stdout
    assert "CREATE TENSOR Q2: float64 (2,)" in done.stdout
    term = Terminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send(".quiet on")
        term.until(Terminal.PROMPT)
        term.send("Q3[i] = P[i,j] * 2;")
        term.send("SELECT 'after' AS marker;")
        shown = term.until("(1 row)")
        assert "Q3:" not in shown and "after" in shown
        term.until(Terminal.PROMPT)
        term.send(".quiet off")
        assert "quiet off" in term.until(Terminal.PROMPT)
    finally:
        assert term.close() == 0


# -- what SET and DROP TENSOR IF EXISTS say ------------------------------------------------------

def test_settings_echo_as_typed(db):
    done = piped(db, "SET progress = off;\nSET memory_limit = '2GB';\nSHOW memory_limit;\n"
                     "SHOW progress;\nSET progress TO ON;\nSET memory_limit = DEFAULT;\n"
                     "SHOW memory_limit;\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "SET progress = off" in out and "False" not in out and "True" not in out
    assert "SET memory_limit = '2GB'" in out and "GiB" not in out.split("DEFAULT")[0]
    assert re.search(r"^memory_limit\s+2GB\s*$", out, re.M)  # 2 * 10**9 bytes, exactly
    assert re.search(r"^progress\s+off\s*$", out, re.M)
    assert "SET progress = ON" in out
    # a DEFAULT says what it stands for: what SHOW then shows
    said = re.search(r"SET memory_limit = DEFAULT \((.+)\)", out).group(1)
    shown = re.findall(r"^memory_limit\s+(.+?)\s*$", out, re.M)[-1]
    assert said == shown and said != "2GB"
    with tensordb.connect() as con:
        con.execute("SET memory_limit = '2GB'")
        assert con.settings.memory_limit == 2 * 10**9


def test_drop_if_exists_of_a_missing_tensor_says_nothing_was_dropped(db):
    done = piped(db, "DROP TENSOR IF EXISTS Nope;\nDROP TENSOR IF EXISTS P;\n")
    assert done.returncode == 0, done.stderr
    assert "no tensor named 'Nope', nothing dropped" in done.stdout
    assert "DROP TENSOR P" in done.stdout and "DROP TENSOR Nope" not in done.stdout
    with tensordb.connect(db) as con:
        assert not con.store.has("P")


# -- listing tables ------------------------------------------------------------------------------

def test_tables_lists_every_tensor_from_the_start(db):
    with tensordb.connect(db) as con:
        con.load("Q", np.ones(3))
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    done = piped(db, ".tables\nSHOW TABLES;\n"
                     "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                     "ORDER BY table_name;\n")
    assert done.returncode == 0, done.stderr
    tables = [re.findall(r"^(\w+)\s*$", block, re.M) for block in done.stdout.split("(")]
    listed = [sorted(set(names) - {"name", "table_name"}) for names in tables[:3]]
    assert listed == [["P", "Q", "t"]] * 3, done.stdout
    with tensordb.connect(db) as con:  # DuckDB's own answer, once every tensor was named
        con.sql("SELECT * FROM P, Q").fetchall()
        expect = sorted(r[0] for r in con.sql("SHOW TABLES").fetchall())
    assert expect == ["P", "Q", "t"]


# -- a second Ctrl-C -----------------------------------------------------------------------------

# One DuckDB function call over a 5-million-element list: DuckDB does not stop it at a Ctrl-C
# (it runs for about 15 seconds on 2 cores, and longer when they are busy).
STUBBORN = ("CREATE TABLE slow AS SELECT len(list_sort([hash(x) for x in range(5000000)])) AS n;")


def test_a_second_ctrl_c_abandons_a_query_that_the_first_did_not_stop(db):
    term = Terminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send("CREATE TABLE kept AS SELECT 1 AS x;")
        term.until(Terminal.PROMPT)
        term.send(STUBBORN)
        time.sleep(1.0)
        term.proc.send_signal(signal.SIGINT)
        seen = term.until("press Ctrl-C again", limit=30)
        assert "tensordb>" not in seen  # still running: the first Ctrl-C did not stop it
        t0 = time.monotonic()
        term.proc.send_signal(signal.SIGINT)
        assert "abandoned" in term.until("abandoned", limit=30)
        assert term.proc.wait(timeout=30) == 130
        assert time.monotonic() - t0 < 5
    finally:
        term.release()
    with tensordb.connect(db) as con:  # what ran before is stored; the abandoned table is not
        tables = {r[0] for r in con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert "kept" in tables and "slow" not in tables
        np.testing.assert_array_equal(con.tensor("P"), np.arange(6.0).reshape(3, 2))


def test_a_ctrl_c_that_stops_its_statement_gets_no_notice(db):
    with tensordb.connect(db) as con:
        con.load("D", np.random.default_rng(0).random((1500, 1500)), tile=(1500, 1500))
    term = Terminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send("E[i,j] = MIN(D[i,k] + D[k,j]);")
        time.sleep(1.5)
        term.proc.send_signal(signal.SIGINT)
        seen = term.until(Terminal.PROMPT, limit=30)
        assert "interrupted" in seen
        time.sleep(1.5)  # longer than the notice's delay
        term.send("SELECT 'alive' AS still;")
        seen = term.until(Terminal.PROMPT)
        assert "alive" in seen and "press Ctrl-C again" not in seen
    finally:
        assert term.close() == 0


# -- progress ------------------------------------------------------------------------------------

def test_progress_advances_inside_a_long_min_plus_product(db):
    """Two kernel calls do nearly all the work (the loads before them are done at once): the
    bar shows the share of the work, moving while the calls run, never back; not "4/6" tasks
    standing still."""
    with tensordb.connect(db) as con:
        con.load("D", np.random.default_rng(0).random((1200, 1200)), tile=(600, 1200))
    term = Terminal(db, env={"TENSORDB_PROGRESS_DELAY": "0"})
    try:
        term.until(Terminal.PROMPT)
        term.send("SET workers = 2;")
        term.until(Terminal.PROMPT)
        term.send("E[i,j] = MIN(D[i,k] + D[k,j]);")
        shown = term.until("E: float64 (1200, 1200)")
    finally:
        assert term.close() == 0
    shares = [int(p) for p in re.findall(r"(\d+)%", shown)]
    assert shares == sorted(shares) and shares[-1] == 100
    during = {p for p in shares if 0 < p < 100}
    assert len(during) >= 5, shares  # it moved while the kernels ran
    assert not re.search(r"\d+/\d+", shown)  # no task count


def test_tables_lists_a_damaged_tensor_and_still_works(db):
    with tensordb.connect(db) as con:
        con.load("Q", np.ones(3))
        path = next(r for r in con.execute("DESCRIBE Q").fetchall() if r[0] == "file")[1]
    os.remove(path)  # deleted outside tensordb
    done = piped(db, "SHOW TABLES;\nSELECT sum(value) AS s FROM P;\nSELECT * FROM Q;\n")
    assert done.returncode == 1
    listed = set(re.findall(r"^(\w+)\s*$", done.stdout.split("(")[0], re.M)) - {"name"}
    assert listed == {"P", "Q"}
    assert re.search(r"^15(\.0)?\s*$", done.stdout, re.M)  # sum(0..5): other tensors read fine
    assert "<stdin>:3: OperationalError" in done.stderr and "is missing" in done.stderr
