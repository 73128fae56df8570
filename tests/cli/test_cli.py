"""The command line and the REPL (run in-process through cli.main), and the sql/ scripts."""
from __future__ import annotations

import io
import os
import subprocess
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "sql").glob("*.sql"))


def run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"tensordb {tensordb.__version__}"


def test_commands_print_tables_tensors_and_messages(capsys):
    rc, out, err = run(["-c", "CREATE TENSOR A (i 2, j 3) FLOAT32; SELECT 42 AS answer",
                        "-c", "B[i,j] = A[i,j] + 1", "-c", "SHOW workers"], capsys)
    assert rc == 0 and err == ""
    assert "CREATE TENSOR A: float32 (2, 3)" in out
    assert "answer" in out and "42" in out and "(1 row)" in out
    assert "B: float32 (2, 3)\n[[1. 1. 1.]\n [1. 1. 1.]]" in out
    assert out.index("answer") < out.index("B: float32") < out.index("workers")


def test_large_tensors_are_elided(capsys):
    rc, out, _ = run(["-c", "CREATE TENSOR Z (i 1000, j 1000); Y[i,j] = Z[i,j] + 1"], capsys)
    assert rc == 0 and "..." in out and out.count("\n") < 40


def test_errors_name_the_statement_with_a_caret_and_no_traceback(tmp_path, capsys):
    script = tmp_path / "bad.sql"
    script.write_text("CREATE TENSOR A (i 3);\nSELECT 1;\nC[i] = A[i] * Nope[i];\nSELECT 2;\n")
    rc, out, err = run([tmp_path / "db.tdb", "-f", script], capsys)
    assert rc == 1
    assert f"{script}:3: CatalogError: unknown tensor 'Nope'" in err
    assert "LINE 3: C[i] = A[i] * Nope[i];" in err and "^" in err
    assert "Traceback" not in err and "Traceback" not in out
    # the script is one unit: nothing it created was stored
    rc, out, _ = run([tmp_path / "db.tdb", "-c", "SHOW TENSORS"], capsys)
    assert rc == 0 and "(0 rows)" in out


def test_syntax_error_message(capsys):
    rc, _, err = run(["-c", "C[i,k] = A[i,j] *"], capsys)
    assert rc == 1 and "-c:1: ParserError: syntax error at the end of the statement: expected" in err


def test_failing_command_stops_the_run(capsys):
    rc, out, err = run(["-c", "SELEC 1", "-c", "SELECT 'never' AS x"], capsys)
    assert rc == 1 and "never" not in out and "-c #1:1: ParserError" in err


def test_missing_file(tmp_path, capsys):
    rc, _, err = run(["-f", tmp_path / "nope.sql"], capsys)
    assert rc == 1 and "cannot read" in err


def test_internal_errors_are_one_line(monkeypatch, capsys):
    def boom(*a, **k):
        raise RuntimeError("kaboom")
    monkeypatch.setattr("tensordb.Connection.execute_script", boom)
    monkeypatch.delenv("TENSORDB_DEBUG", raising=False)
    rc, _, err = run(["-c", "SELECT 1"], capsys)
    assert rc == 1 and err.strip() == "internal error: RuntimeError: kaboom"


def test_database_persists_between_runs(tmp_path, capsys):
    db = tmp_path / "p.tdb"
    assert run([db, "-c", "CREATE TENSOR A (i 4); B[i] = A[i] + 2"], capsys)[0] == 0
    rc, out, _ = run([db, "-c", "SELECT sum(value) AS s FROM B"], capsys)
    assert rc == 0 and "8" in out


def test_timer_and_explain(capsys):
    rc, out, _ = run(["--timer", "-c", "CREATE TENSOR A (i 4, j 4); EXPLAIN B[i,k] = A[i,j] * A[j,k]"],
                     capsys)
    assert rc == 0 and "Run Time:" in out and "EXPLAIN" in out


def fed(lines):
    """A ``read`` for ``Shell.repl``: ``lines`` one by one, then EOFError (the end of input)."""
    feed = iter(lines)

    def read(prompt):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None
    return read


def repl(lines, capsys, con=None):
    con = con or tensordb.connect()
    shell = cli.Shell(con)
    shell.repl(read=fed(lines))
    out, err = capsys.readouterr()
    return shell, out, err


def test_repl_multiline_statements_commands_and_errors(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    shell, out, err = repl([
        "CREATE TENSOR A (i 2, j 2)", "  FLOAT64;",
        "B[i,j] =", "  A[i,j] + 3;",
        ".timer on", "SELECT 7 AS seven;", "\\timing off",
        "C[i] = FOO(A[i,j]);",
        "", ".help", ".tensors", ".bogus", ".quit", "SELECT 'not reached';"], capsys)
    assert "in-memory database" in out
    assert "B: float64 (2, 2)\n[[3. 3.]\n [3. 3.]]" in out
    assert "seven" in out and "Run Time:" in out and "timer off" in out
    assert "<stdin>:1: BinderError: unknown function 'foo'" in err
    assert "Statements end with ';'" in out and "unknown command .bogus" in err
    assert "not reached" not in out
    assert shell.con.store.has("B")


def test_repl_blocks_span_several_inputs(capsys):
    shell, out, err = repl(["BEGIN;", "CREATE TENSOR A (i 2);", "B[i] = A[i] + 1;", "COMMIT;"], capsys)
    assert "queued until COMMIT" in out and "COMMIT" in out and err == ""
    assert np.array_equal(shell.con.tensor("B"), [1.0, 1.0])


def test_progress_appears_only_after_a_moment(monkeypatch):
    class TTY(io.StringIO):
        def isatty(self):
            return True
    stream = TTY()
    p = cli._Progress(stream)
    p.reset()
    p(1, 10)  # quick work: nothing shown
    assert p.bar is None
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)
    p(2, 10)
    assert p.bar is not None
    p(10, 10)
    p.stop()
    assert p.bar is None


def test_shell_sets_the_progress_callback():
    with tensordb.connect() as con:
        shell = cli.Shell(con)
        assert con.progress_callback == shell._on_progress


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_sql_scripts_run(script, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run([tmp_path / "w.tdb", "-f", script], capsys)
    assert rc == 0, err
    assert err == "" and out


def test_sql_scripts_exist():
    assert {p.stem for p in SCRIPTS} >= {"quickstart", "mlp", "attention", "matrix_chain",
                                         "shortest_paths", "factor_step"}


def test_script_results_are_right(tmp_path, capsys):
    db = tmp_path / "w.tdb"
    for name in ("shortest_paths", "factor_step", "attention"):
        assert run([db, "-f", ROOT / "sql" / f"{name}.sql"], capsys)[0] == 0
    with tensordb.connect(db) as con:
        assert float(con.tensor("loss_after")) < float(con.tensor("loss_before"))
        assert np.allclose(con.tensor("P").sum(axis=1), 1.0)
        d = con.tensor("D")
        assert d.max() < 1e9 and np.allclose(np.diag(d), 0)


def test_readme_main_command_runs_twice(tmp_path):
    """`tensordb quickstart.tdb -f sql/quickstart.sql`, through the installed console script."""
    exe = Path(sys.executable).with_name("tensordb")
    if not exe.exists():
        pytest.skip("the tensordb console script is not installed")
    for _ in range(2):  # a second run on the same database works too (OR REPLACE)
        proc = subprocess.run([str(exe), "quickstart.tdb", "-f", str(ROOT / "sql" / "quickstart.sql")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TENSORDB_DEBUG": ""})
        assert proc.returncode == 0, proc.stderr
        assert "EXPLAIN" in proc.stdout and "row_max" in proc.stdout


def test_tab_completion():
    with tensordb.connect() as con:
        con.execute("CREATE TENSOR Weights (i 2)")
        shell = cli.Shell(con)
        assert shell.complete("wei", 0) == "Weights"
        assert shell.complete("REL", 0) == "RELU"
        assert shell.complete("crea", 0) == "CREATE" and shell.complete("crea", 1) is None


def test_begin_without_commit_is_reported(capsys):
    rc, out, err = run(["-c", "BEGIN; CREATE TENSOR A (i 2)"], capsys)
    assert rc == 1 and "BEGIN without COMMIT: 1 statement(s) were not run" in err


def test_ctrl_c_stops_a_long_query_in_the_repl_and_quit_leaves(tmp_path):
    """A real SIGINT (twice) to a REPL running a 2000^3 min-plus product: the query stops within
    moments, nothing is stored, the workers are idle and .quit leaves at once."""
    db = tmp_path / "w.tdb"
    with tensordb.connect(db) as con:
        con.load("D", np.random.default_rng(0).random((2000, 2000)), tile=(2000, 2000))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TENSORDB_DEBUG": "",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tensordb", str(db)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            seen.append(line)
            if "go-go" in line:
                started.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.stdin.write("SELECT 'go-go' AS started;\nP[i,j] = MIN(D[i,k] + D[k,j]);\n")
        proc.stdin.flush()
        assert started.wait(60), "".join(seen)
        time.sleep(1.5)  # inside the query's kernel by now
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)  # a second Ctrl-C must not leave workers running
        proc.stdin.write(".quit\n")
        proc.stdin.flush()
        proc.stdin.close()
        proc.wait(timeout=30)
        elapsed = time.perf_counter() - t0
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert elapsed < 5.0, err
    assert proc.returncode == 0, err
    assert "interrupted" in err and "Traceback" not in err
    with tensordb.connect(db) as con:
        assert [t["name"] for t in con.tensors()] == ["D"]


def test_each_statement_of_a_script_prints_the_value_it_produced(tmp_path, capsys):
    """A name reassigned later in a script: each printout shows that statement's own value
    (shape and dtype too), not the name's final one."""
    x = np.arange(3.0)
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "s.sql"
    script.write_text(f"LOAD TENSOR X FROM '{tmp_path / 'x.npy'}';\n"
                      "A[i] = X[i] + 1;\n"
                      "B[i] = A[i] * 10;\n"
                      "A[i] = A[i] + 100;\n"
                      "A = SUM(A[i] * 2);\n")
    rc, out, err = run([tmp_path / "db.tdb", "-f", script], capsys)
    assert rc == 0, err
    a1 = x + 1
    b = a1 * 10
    a2 = a1 + 100
    a3 = (a2 * 2).sum()
    blocks = [blk for blk in out.split("\n\n") if blk.startswith(("A:", "B:"))]
    shown = [f"{name}: float64 {v.shape}\n{np.array2string(v)}"
             for name, v in (("A", a1), ("B", b), ("A", a2), ("A", np.asarray(a3)))]
    assert blocks == shown
    with tensordb.connect(tmp_path / "db.tdb") as con:  # the final state is the last value
        np.testing.assert_array_equal(con.tensor("A"), a3)
        np.testing.assert_array_equal(con.tensor("B"), b)
