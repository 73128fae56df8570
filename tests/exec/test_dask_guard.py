"""executor="dask://local" in a script without ``if __name__ == "__main__":`` (issue 14, item 6):
one short tensordb error naming the guard, before any worker process starts; with the guard the
script runs, and the answer is numpy's. Each script runs in a subprocess, as a user runs it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tensordb.exec.spawn import _guarded, check_main_guard, starts_local_processes

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TENSORDB_DEBUG": "",
       "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
GUARD = 'if __name__ == "__main__":'

BODY = """\
import numpy as np
import tensordb
con = tensordb.connect(workers=2, executor="dask://local")
con.load("A", np.arange(12.0).reshape(3, 4))
print("sums", con.execute("B[i] = SUM(A[i,j])").tensor().tolist())
con.close()
"""


def run_script(tmp_path, text: str, name: str = "job.py", **files):
    for fname, content in files.items():
        (tmp_path / fname).write_text(textwrap.dedent(content))
    script = tmp_path / name
    script.write_text(textwrap.dedent(text))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV,
                       cwd=tmp_path, timeout=300)
    return p.returncode, p.stdout, p.stderr


def assert_short_guard_error(rc, out, err, script):
    assert rc == 1 and "sums" not in out
    lines = err.strip().splitlines()
    assert lines[-5].startswith("tensordb.errors.ProgrammingError: executor 'dask://local' "
                                "starts worker processes"), err
    assert str(script) in lines[-5] and GUARD in lines[-5] and lines[-4] == f"HINT: {GUARD}"
    assert len(lines) < 30, err  # one error (and the script's short traceback), no worker logs
    assert not re.search(r"distributed\.\w+ - ", err)  # Dask's worker logs
    for noise in ("RuntimeError", "bootstrapping", "Nanny"):
        assert noise not in err, noise


def test_unguarded_script_fails_with_one_short_error(tmp_path):
    rc, out, err = run_script(tmp_path, BODY)
    assert_short_guard_error(rc, out, err, tmp_path / "job.py")


def test_unguarded_call_through_an_imported_module_and_set_executor(tmp_path):
    # The connect happens inside a module imported at the script's top level.
    rc, out, err = run_script(tmp_path, "import helper\n", **{"helper.py": """\
        import tensordb
        con = tensordb.connect(executor="dask://local?retries=0")
        """})
    assert rc == 1 and "ProgrammingError: executor 'dask://local?retries=0'" in err and GUARD in err
    # SET executor at the top level: refused, and the setting is unchanged.
    rc, out, err = run_script(tmp_path, """\
        import numpy as np, tensordb
        con = tensordb.connect()
        con.load("A", np.ones((2, 2)))
        try:
            con.execute("SET executor = 'dask://local'")
        except tensordb.ProgrammingError as exc:
            print("refused:", str(exc).splitlines()[0])
        print("executor", con.execute("SHOW executor").fetchall())
        print("sums", con.execute("B[i] = SUM(A[i,j])").tensor().tolist())
        """)
    assert rc == 0, err
    assert "refused: executor 'dask://local' starts worker processes" in out and GUARD in out
    assert "executor [('executor', 'local')]" in out and "sums [2.0, 2.0]" in out


def test_guarded_script_runs_on_a_local_cluster(tmp_path):
    guarded = GUARD + "\n" + textwrap.indent(BODY, "    ")
    rc, out, err = run_script(tmp_path, guarded)
    assert rc == 0, err
    expect = np.arange(12.0).reshape(3, 4).sum(axis=1).tolist()
    assert f"sums {expect}" in out


def test_the_command_line_starts_a_local_cluster(tmp_path):
    """``python -m tensordb`` is a package's __main__, which spawn does not run again."""
    p = subprocess.run([sys.executable, "-m", "tensordb", "-c",
                        "SET executor = 'dask://local'; CREATE TENSOR A FROM (SELECT i, j, i + j AS v "
                        "FROM range(3) r(i), range(4) s(j)) INDEX (i, j) VALUE v; "
                        "B[i] = SUM(A[i,j] * 2)"], capture_output=True, text=True, env=ENV,
                       cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    expect = (np.add.outer(np.arange(3), np.arange(4)) * 2).sum(axis=1)
    assert f"B: int64 (3,)\n{expect}" in p.stdout


def test_the_guard_is_found_in_the_source(tmp_path):
    src = tmp_path / "s.py"
    src.write_text("import x\n\nif __name__ == '__main__':\n    a = 1\n    b = 2\nc = 3\n"
                   "if '__main__' == __name__:\n    d = 4\nif __name__ == 'other':\n    e = 5\n")
    assert [_guarded(str(src), n) for n in (1, 4, 5, 6, 8, 10)] == \
        [False, True, True, False, True, False]
    assert _guarded(str(tmp_path / "missing.py"), 1) is None  # cannot tell: no refusal


def test_only_local_clusters_are_checked():
    assert starts_local_processes("dask://local") and starts_local_processes("dask://")
    assert starts_local_processes("dask://local-cuda?timeout=5")
    assert not starts_local_processes("dask://10.0.0.5:8786") and not starts_local_processes("local")
    # pytest's __main__ is not running its top-level code: nothing to refuse here
    check_main_guard("dask://local")
