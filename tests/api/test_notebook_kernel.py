"""tensordb in a real Jupyter kernel, as a notebook user runs it: a notebook executed with
nbclient in an environment without ipywidgets connects (in memory and to a directory) and
displays a result, a tensor and an EXPLAIN as HTML. DuckDB refuses to change its progress-bar
setting in a kernel without ipywidgets; connect() must not need to."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]

CELLS = [
    "import numpy as np, tensordb\n"
    "con = tensordb.connect()\n"
    "con.load('A', np.arange(12.0).reshape(3, 4))\n"
    "con.execute('SELECT sum(value) AS total FROM A')",
    "con.execute('B[i,k] = SUM(A[i,j] * A[k,j])')",
    "con.execute('EXPLAIN C[i,k] = A[i,j] * A[k,j]')",
    "disk = tensordb.connect(DB)\n"
    "disk.load('D', np.eye(2), replace=True)\n"
    "disk.execute('D')",
]


def run_notebook(tmp_path: Path) -> list[dict]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"DB = {str(tmp_path / 'nb.tdb')!r}")] + \
        [nbformat.v4.new_code_cell(c) for c in CELLS]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel(env=env):  # the kernel imports this checkout's tensordb
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    return [cell.outputs for cell in nb.cells]


def html(outputs) -> str:
    shown = [o for o in outputs if o.get("output_type") == "execute_result"]
    assert shown, outputs
    return shown[-1]["data"]["text/html"]


def test_a_notebook_without_ipywidgets_connects_and_displays(tmp_path):
    if importlib.util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed: the failure this test guards against cannot occur")
    outputs = run_notebook(tmp_path)
    for out in outputs:
        assert not [o for o in out if o.get("output_type") == "error"], out
    a = np.arange(12.0).reshape(3, 4)
    total = html(outputs[1])
    assert "<th>total</th>" in total and f"<td>{a.sum():g}</td>" in total
    b = html(outputs[2])
    assert "B: float64 (3, 3)" in b
    for value in (a @ a.T)[0]:
        assert f"<td>{value:g}</td>" in b
    plan = html(outputs[3])
    assert "C[i,k]" in plan and "<table" in plan
    d = html(outputs[4])
    assert "D: float64 (2, 2)" in d and "<td>1</td>" in d
