"""An idle REPL that holds a database for writing keeps no reader out: the shell on a
pseudo-terminal writes and then waits at its prompt, while other processes read the database
(the CLI with --read-only or DuckDB's -readonly, and Python), each read checked with NumPy
against what the REPL stored; a second writer is refused with the REPL's process id."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

import tensordb
from tests.cli.test_cli_conventions import ENV, Terminal


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
            out = subprocess.run([sys.executable, "-m", "tensordb", str(db), flag, "-c",
                                  "SELECT sum(value) FROM Q"], capture_output=True, text=True,
                                 env=ENV, timeout=300)
            assert out.returncode == 0, out.stderr
            assert str(int(np.arange(6.0).sum() * 10)) in out.stdout
        with tensordb.connect(db, read_only=True) as con:
            np.testing.assert_array_equal(con.tensor("Q"), np.arange(6.0).reshape(3, 2) * 10)
        term.send("Q[i,j] = P[i,j] * 100;")  # a new version: the next reader sees it
        term.until(Terminal.PROMPT)
        with tensordb.connect(db, read_only=True) as con:
            np.testing.assert_array_equal(con.tensor("Q"), np.arange(6.0).reshape(3, 2) * 100)
        out = subprocess.run([sys.executable, "-m", "tensordb", str(db), "-c", "SELECT 1"],
                             capture_output=True, text=True, env=ENV, timeout=300)
        assert out.returncode != 0
        assert f"locked: process {term.proc.pid} has it open for writing" in out.stderr
        term.send(".quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.release()
