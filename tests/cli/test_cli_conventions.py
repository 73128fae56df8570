"""The command line's conventions (issue 14, item 5), through the CLI's own entry point in a
subprocess and, for the REPL, through a pseudo-terminal: a bare tensor name prints the tensor,
.help lists the commands and statements, keyword typos get did-you-mean hints, DuckDB's
suggestions name only the user's tables and tensors, no error says its kind twice, SHOW TENSOR
says what is missing, and progress shows within long kernel calls."""
from __future__ import annotations

import contextlib
import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb import cli
from tensordb.plan import kernel as plan_kernel

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TENSORDB_DEBUG": "", "PYTHONUNBUFFERED": "1",
       "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")


def cli_subprocess(*args, cwd=None):
    """``python -m tensordb ARGS``: (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "tensordb", *map(str, args)], capture_output=True,
                       text=True, env=ENV, cwd=cwd, timeout=300)
    return p.returncode, p.stdout, p.stderr


def cli_run(*args):
    """``tensordb ARGS`` through the entry point ``python -m tensordb`` calls (``cli.main``), in
    this process: (exit status, stdout, stderr). A fresh interpreter per call cost ~1 s of the
    suite's time each; the subprocess path itself is checked once
    (test_bare_tensor_name_prints_the_tensor) and in tests/test_examples.py."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


class Terminal:
    """The REPL on a pseudo-terminal: ``send`` a line, ``until`` a text appears."""

    PROMPT = "tensordb> "

    def __init__(self, db, env=None) -> None:
        self.master, slave = pty.openpty()
        home = Path(db).parent / "home"  # the REPL's history file goes here
        home.mkdir(exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "tensordb", str(db)],
                                     stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     env={**ENV, "HOME": str(home), "TERM": "xterm",
                                          "COLUMNS": "120", **(env or {})})
        os.close(slave)
        self.seen = ""

    def until(self, text: str, limit: float = 120.0) -> str:
        """Everything read up to and including ``text`` (ANSI codes removed); a hang guard only."""
        end = time.monotonic() + limit
        while text not in ANSI.sub("", self.seen):
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {text!r} in:\n{ANSI.sub('', self.seen)}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:  # the child closed the terminal
                    chunk = ""
                if not chunk:
                    raise AssertionError(f"the REPL ended before {text!r}:\n{ANSI.sub('', self.seen)}")
                self.seen += chunk
        clean = ANSI.sub("", self.seen)
        cut = clean.index(text) + len(text)
        self.seen = clean[cut:]
        return clean[:cut]

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        try:
            self.send(".quit")
            return self.proc.wait(timeout=60)
        finally:
            self.release()

    def release(self) -> None:
        """Kill the REPL if it still runs and close the terminal (a test's ``finally``)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    """As in ENV: no tracebacks under errors, whatever the shell running the tests set."""
    monkeypatch.delenv("TENSORDB_DEBUG", raising=False)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "db.tdb"
    with tensordb.connect(path) as con:
        con.load("P", np.arange(6, dtype=np.float64).reshape(3, 2) / 4)
        con.load("Prices", np.arange(4, dtype=np.int64))
    return path


# -- a bare name prints the tensor --------------------------------------------------------------

def test_bare_tensor_name_prints_the_tensor(db):
    expect = np.arange(6, dtype=np.float64).reshape(3, 2) / 4
    rc, out, err = cli_subprocess(db, "-c", "P;", "-c", "prices")
    assert rc == 0 and err == ""
    assert f"P: float64 (3, 2)\n{expect}" in out
    assert f"Prices: int64 (4,)\n{np.arange(4)}" in out  # names are case-insensitive, as in SQL


def test_bare_unknown_name_is_a_tensordb_error_with_a_hint(db):
    rc, out, err = cli_run(db, "-c", "SELECT 1;\nPrice;")
    assert rc == 1 and "Traceback" not in err
    assert "-c:2: CatalogError: no tensor named 'Price'" in err
    assert "LINE 2: Price;\n        ^" in err and "HINT: did you mean 'Prices'?" in err
    # Other single words stay DuckDB's statements.
    rc, out, err = cli_run(db, "-c", "CHECKPOINT")
    assert rc == 0 and err == ""


# -- errors: keywords, suggestions, prefixes, SHOW TENSOR ----------------------------------------

@pytest.mark.parametrize("text, hint", [
    ("SELCT 1", "SELECT"),
    ("CRATE TENSOR A (i 2) FLOAT", "CREATE"),
    ("SELECT * FORM range(3) t", "FROM"),
    ("SELECT x FROM range(3) t(x) ORDR BY x", "ORDER"),
    ("SELECT 1 FROM range(3) WHER 1 = 1", "WHERE"),
    ("LOAD TENSR A FROM 'a.npy'", "TENSOR"),
    ("LOAD TENSOR A FORM 'a.npy'", "FROM"),  # our own grammar's errors too
    ("CREATE TENSOR A (i 2) FLOAT TILF (i 1)", "TILE"),
])
def test_misspelt_keywords_get_did_you_mean(db, text, hint):
    rc, _, err = cli_run(db, "-c", text)
    assert rc == 1 and "ParserError: syntax error" in err and "Traceback" not in err
    assert f"HINT: did you mean {hint}?" in err


@pytest.mark.parametrize("text, hint", [
    ("SHOW TENSRS", "SHOW TENSORS"),
    ("SHOW worker", "SHOW workers"),
    ("SET worker = 2", "SET workers"),
])
def test_misspelt_show_and_set_of_ours_get_did_you_mean(db, text, hint):
    rc, _, err = cli_run(db, "-c", text)
    assert rc == 1 and "Traceback" not in err and f"HINT: did you mean {hint}?" in err


def test_syntax_errors_without_a_misspelt_word_get_no_guess(db):
    rc, _, err = cli_run(db, "-c", "SELECT 1 +")
    assert rc == 1 and "syntax error" in err and "did you mean" not in err.lower()


def _internal_names() -> set[str]:
    with duckdb.connect() as duck:
        rows = duck.execute("SELECT table_name FROM duckdb_tables() WHERE internal UNION "
                            "SELECT view_name FROM duckdb_views() WHERE internal").fetchall()
    return {r[0].lower() for r in rows}


def test_suggestions_name_only_user_tables_and_tensors(db):
    internal = _internal_names() | {"tensors", "tiles"}  # DuckDB's and tensordb's catalogs
    assert "pg_depend" in internal
    rc, out, err = cli_run(db, "-c", "SELECT * FROM Nowhere")
    assert rc == 1 and "CatalogError: Table with name Nowhere does not exist!" in err
    quoted = {q.lower() for q in re.findall(r'"([^"]+)"', err)}
    assert not quoted & internal and "did you mean" not in err.lower()
    # A close user table or tensor is suggested instead.
    rc, out, err = cli_run(db, "-c", "CREATE TABLE nowhere2 AS SELECT 1 AS x; SELECT * FROM Nowhere")
    assert rc == 1 and 'HINT: did you mean "nowhere2"?' in err
    rc, out, err = cli_run(db, "-c", "SELECT * FROM Pricez")
    assert rc == 1 and 'HINT: did you mean "Prices"?' in err
    # DuckDB's suggestions of functions and types are its own business, and kept.
    rc, out, err = cli_run(db, "-c", "SELECT sumx(1)")
    assert rc == 1 and 'Did you mean "sum"?' in err
    rc, out, err = cli_run(db, "-c", "SELECT * FROM read_csvv('x.csv')")
    assert rc == 1 and 'Did you mean "read_csv"?' in err


@pytest.mark.parametrize("text, kind", [
    ("SELECT 1 +", "ParserError"),
    ("SELECT * FROM Nowhere", "CatalogError"),
    ("SELECT nope FROM range(3)", "BinderError"),
])
def test_no_doubled_prefixes(db, text, kind):
    rc, _, err = cli_run(db, "-c", text)
    assert rc == 1 and f"-c:1: {kind}: " in err
    # the kind is said once: DuckDB's "Parser Error: " prefix is gone
    spaced = re.sub(r"(?<!^)([A-Z])", r" \1", kind)
    assert spaced not in err and err.count("Error") == 1, err


def test_show_tensor_without_a_name_says_what_is_missing(db):
    rc, _, err = cli_run(db, "-c", "SHOW TENSOR;")
    assert rc == 1 and "Traceback" not in err
    assert "ParserError: syntax error at the end of the statement: expected a tensor name" in err
    assert "LINE 1: SHOW TENSOR;\n" + " " * len("LINE 1: SHOW TENSOR") + "^" in err
    rc, out, err = cli_run(db, "-c", "SHOW TENSOR P")
    assert rc == 0 and "shape" in out and "(3, 2)" in out


# -- the REPL through a pseudo-terminal ----------------------------------------------------------

def test_repl_help_bare_name_and_errors_on_a_terminal(db):
    term = Terminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send(".help")
        shown = term.until(Terminal.PROMPT)
        # every dot-command listed is one the shell knows
        listed = set(re.findall(r"^  (\.[a-z]+)", shown, re.M))
        assert {".help", ".timer", ".tensors", ".tables", ".read", ".quit"} <= listed
        for statement in ("CREATE TENSOR", "CREATE [OR REPLACE] TENSOR", "LOAD [OR REPLACE] TENSOR",
                          "LET ", "EINSUM(", "EXPLAIN [ANALYZE]", "SHOW TENSORS", "SHOW ALL",
                          "DESCRIBE", "DROP TENSOR", "COPY", "CHECK TENSOR", "CHECK DATABASE",
                          "SET ", "BEGIN", "COMMIT", "ROLLBACK", "SELECT", "print tensor"):
            assert statement in shown, statement
        term.send("P;")
        shown = term.until(Terminal.PROMPT)
        assert f"P: float64 (3, 2)\n{np.arange(6, dtype=np.float64).reshape(3, 2) / 4}" \
            in shown.replace("\r", "")
        term.send("SELCT 1;")
        shown = term.until(Terminal.PROMPT)
        assert "ParserError: syntax error" in shown and "HINT: did you mean SELECT?" in shown
        assert "Parser Error" not in shown and "Traceback" not in shown
    finally:
        assert term.close() == 0


def test_listed_dot_commands_are_known():
    with tensordb.connect() as con:
        err = io.StringIO()
        shell = cli.Shell(con, out=io.StringIO(), err=err)
        for cmd in set(re.findall(r"^  (\.[a-z]+)", cli.HELP, re.M)) - {".quit", ".read"}:
            assert shell.command(cmd) and "unknown command" not in err.getvalue(), cmd
        assert not shell.command(".quit")


def test_repl_shows_progress_on_a_terminal(db):
    rng = np.random.default_rng(1)
    with tensordb.connect(db) as con:
        con.load("Big", rng.standard_normal((600, 500)), tile=(600, 500))
    term = Terminal(db, env={"TENSORDB_PROGRESS_DELAY": "0"})
    try:
        term.until(Terminal.PROMPT)
        term.send("R[i] = SUM(EXP(SIN(Big[i,j])));")
        shown = term.until(Terminal.PROMPT)
        assert "running" in shown and "R: float64 (600,)" in shown
    finally:
        assert term.close() == 0


# -- progress within long kernel calls ------------------------------------------------------------

@pytest.mark.parametrize("statement", [
    "R[i] = SUM(EXP(X[i,j]))",        # an aggregate, chunked along j
    "R2[i,j] = EXP(X[i,j]) * 2 + 1",  # elementwise over a large tile, chunked along i
])
def test_progress_is_reported_within_one_long_kernel_call(monkeypatch, statement):
    """One kernel call over one tile, in many chunks: progress is reported between the chunks
    (fractions of the call), not only when the call ends."""
    monkeypatch.setattr(plan_kernel, "CHUNK_ELEMENTS", 1000)  # the plan chooses chunks
    seen: list[tuple[float, int]] = []
    with tensordb.connect() as con:
        con.execute("SET workers = 1")
        con.load("X", np.random.default_rng(2).standard_normal((40, 300)), tile=(40, 300))
        con.progress_callback = lambda done, total: seen.append((done, total))
        con.execute(statement)
        X = con.tensor("X")
        name = statement.split("[")[0]
        expect = np.exp(X).sum(axis=1) if name == "R" else np.exp(X) * 2 + 1
        np.testing.assert_allclose(con.tensor(name), expect, rtol=1e-12)
    total = seen[-1][1]
    assert seen[-1][0] == total
    inside = [d for d, _ in seen if d != int(d)]
    assert len(inside) >= 5  # many chunks, each reported
    assert all(0 < d < total for d in inside)
    dones = [d for d, _ in seen]
    assert dones == sorted(dones)  # one worker: progress only grows
