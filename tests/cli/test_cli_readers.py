"""An idle REPL that holds a database for writing keeps no reader out: the shell on a
pseudo-terminal writes and then waits at its prompt, while other processes read the database
(the CLI with --read-only or DuckDB's -readonly, and Python), each read checked with NumPy
against what the REPL stored; a second writer is refused with the REPL's process id. The
command lines beside the REPL run ``cli.main`` in the test's own process (another process than
the REPL's, without an interpreter started for each)."""
from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tensordb
from tests.cli.test_cli_conventions import ENV, Terminal, cli_run


def test_an_idle_repl_keeps_no_reader_out(tmp_path):
    db = tmp_path / "db.tdb"
    with tensordb.connect(db) as con:
        con.load("P", np.arange(6, dtype=np.float64).reshape(3, 2))
    term = Terminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send("Q[i,j] = P[i,j] * 10;")
        term.until(Terminal.PROMPT)  # stored; the REPL now sits idle, holding the database
        for flag in ("--read-only", "-readonly"):
            rc, stdout, stderr = cli_run(db, flag, "-c", "SELECT sum(value) FROM Q")
            assert rc == 0, stderr
            assert str(int(np.arange(6.0).sum() * 10)) in stdout
        with tensordb.connect(db, read_only=True) as con:
            np.testing.assert_array_equal(con.tensor("Q"), np.arange(6.0).reshape(3, 2) * 10)
        term.send("Q[i,j] = P[i,j] * 100;")  # a new version: the next reader sees it
        term.until(Terminal.PROMPT)
        with tensordb.connect(db, read_only=True) as con:
            np.testing.assert_array_equal(con.tensor("Q"), np.arange(6.0).reshape(3, 2) * 100)
        rc, _, stderr = cli_run(db, "-c", "SELECT 1")
        assert rc != 0
        assert f"locked: process {term.proc.pid} has it open for writing" in stderr
        term.send(".quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.release()


class ReadOnlyTerminal(Terminal):
    """The REPL with ``--read-only`` on a pseudo-terminal."""

    def __init__(self, db) -> None:
        self.master, slave = pty.openpty()
        home = Path(db).parent / "home"
        home.mkdir(exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "tensordb", str(db), "--read-only"],
                                     stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     env={**ENV, "HOME": str(home), "TERM": "xterm",
                                          "COLUMNS": "120"})
        os.close(slave)
        self.seen = ""


def test_a_read_only_repl_opened_first_keeps_no_writer_out(tmp_path):
    db = tmp_path / "db.tdb"
    p = np.arange(6, dtype=np.float64).reshape(3, 2)
    with tensordb.connect(db) as con:
        con.load("P", p)
    term = ReadOnlyTerminal(db)
    try:
        term.until(Terminal.PROMPT)
        term.send("SELECT sum(value) AS s FROM P;")
        assert str(int(p.sum())) in term.until(Terminal.PROMPT)  # the REPL has read, now idle
        for k in (10, 100):  # writers started after it: each opens, stores, closes
            rc, _, stderr = cli_run(db, "-c", f"Q[i,j] = P[i,j] * {k};")
            assert rc == 0, stderr
            term.send("SELECT sum(value) AS s FROM Q;")  # the reader's next call: the newest
            assert str(int(p.sum() * k)) in term.until(Terminal.PROMPT)
        with tensordb.connect(db) as con:  # a writer beside the idle reader, left open
            con.load("R", p * 7)
            for _ in range(100):  # the open writer publishes off its statements' path, in
                term.send("SELECT sum(value) AS s FROM R;")  # tens of milliseconds
                shown = term.until(Terminal.PROMPT)
                if "does not exist" not in shown:
                    break
                time.sleep(0.05)
            assert str(int(p.sum() * 7)) in shown, shown
            np.testing.assert_array_equal(con.tensor("Q"), p * 100)
        term.send("Z[i,j] = P[i,j] * 2;")  # a reader stores nothing
        assert "read-only" in term.until(Terminal.PROMPT)
        term.send(".quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.release()
    assert os.listdir(db / "readers") == []  # its lease went with it
