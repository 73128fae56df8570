"""The Dask executor without its extra installed, as a user without ``tensordb[distributed]``
meets it: connect (and SET executor) fail at once, naming the command that installs it; the
connection that refused the SET keeps working. A child process makes ``import distributed``
fail (a ``None`` in ``sys.modules``, Python's way to block an import)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, sys
sys.modules["distributed"] = None  # as if dask[distributed] were not installed
import tensordb
out = {}
try:
    tensordb.connect(executor="dask://local")
    out["connect"] = None
except tensordb.Error as exc:
    out["connect"] = [type(exc).__name__, str(exc)]
con = tensordb.connect()
try:
    con.execute("SET executor = 'dask://127.0.0.1:8786'")
    out["set"] = None
except tensordb.Error as exc:
    out["set"] = [type(exc).__name__, str(exc)]
out["executor"] = con.settings.executor
con.execute("CREATE TENSOR A (i 3); B[i] = A[i] + 2")
out["B"] = con.tensor("B").tolist()
print(json.dumps(out))
'''


def test_dask_executor_without_its_extra_fails_at_connect_naming_the_extra():
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("connect", "set"):
        assert out[key] is not None, key
        kind, message = out[key]
        assert kind == "InterfaceError"
        assert "distributed cannot be imported" in message
        assert "HINT: pip install 'tensordb[distributed]'" in message
        assert "ModuleNotFoundError" not in message and "Traceback" not in message
    assert out["executor"] == "local" and out["B"] == [2.0, 2.0, 2.0]


def test_docs_say_how_to_install_the_extra():
    text = (ROOT / "docs" / "distributed.md").read_text()
    assert "pip install 'tensordb[distributed]'" in text
