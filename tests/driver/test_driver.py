"""The Connection is the one driver: parse -> bind -> optimize -> lower -> place -> run ->
commit, each stage timed under TENSORDB_DEBUG; the session's state lives on the connection; the
dialect only parses (what it knows of the other stages is checked against them here)."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb import config, explain, session
from tensordb.dialect import SETTINGS, parse
from tensordb.dialect.parser import MAX_EXPRESSION_DEPTH
from tensordb.plan import scalar

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("parse", "bind", "optimize", "lower", "place", "run", "commit")

SCRIPT = """
import numpy as np, tensordb
with tensordb.connect(workers=2) as con:
    con.load("A", np.arange(12.0).reshape(3, 4))
    con.execute("G[i,k] = A[i,j] * A[k,j]")
    print(len(con.last_plan.tasks), float(con.tensor("G").sum()))
"""


def debug_run(level: str) -> tuple[str, str]:
    env = {**os.environ, "TENSORDB_DEBUG": level, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout, run.stderr


def stage_times(err: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, ms in re.findall(r"^\[tensordb\] (\w+)\s+(\d+\.\d+) ms$", err, re.M):
        out.setdefault(name, []).append(float(ms))
    return out


def test_debug_1_times_every_stage_of_a_statement_once():
    out, err = debug_run("1")
    a = np.arange(12.0).reshape(3, 4)
    assert float(out.split()[1]) == pytest.approx(float((a @ a.T).sum()))
    times = stage_times(err)
    for name in STAGES:
        assert len(times.get(name, [])) == 1, f"stage {name!r} not timed once:\n{err}"
        assert times[name][0] >= 0
    assert "tile plan" not in err and "EXPLAIN" not in err   # plans only from level 2


def test_debug_2_prints_the_plan_and_3_every_tile_task():
    _, err2 = debug_run("2")
    assert set(STAGES) <= set(stage_times(err2))
    assert "EXPLAIN: 1 operation(s) on 2 worker(s)" in err2 and "G[i,k] = SUM(" in err2
    assert "tile tasks:" not in err2
    out3, err3 = debug_run("3")
    tasks = int(out3.split()[0])
    header = re.search(r"^tile tasks: (\d+)$", err3, re.M)
    assert header and int(header.group(1)) == tasks
    task_lines = re.findall(r"^\s+\d+ w\d+ .*(?:Load|Assemble|Kernel|Aggregate)\(", err3, re.M)
    assert len(task_lines) == tasks


def test_without_debug_nothing_is_printed(capfd, monkeypatch):
    monkeypatch.delenv("TENSORDB_DEBUG", raising=False)
    with tensordb.connect(workers=2) as con:
        con.load("A", np.eye(3))
        con.execute("B[i,k] = A[i,j] * A[j,k]")
    assert capfd.readouterr().err == ""


def test_session_state_is_per_connection():
    with tensordb.connect() as one, tensordb.connect() as two:
        for con in (one, two):
            con.load("A", np.arange(6.0).reshape(2, 3))
        one.execute("LET S[i] = SUM(A[i,j])")
        assert list(one.session.lets) == ["s"] and two.session.lets == {}
        two.execute("BEGIN; T[i] = A[i,j] * 2")
        assert two.pending_statements() == 1 and one.pending_statements() is None
        one.execute("U[i] = S[i] + 1")  # the LET is one's
        np.testing.assert_allclose(one.tensor("U"), np.arange(6.0).reshape(2, 3).sum(1) + 1)
        with pytest.raises(tensordb.CatalogError, match="unknown tensor 'S'"):
            two.execute("COMMIT; U[i] = S[i] + 1")
        assert two.pending_statements() is None and not two.store.has("U")


def test_explain_on_a_graph_plans_on_the_connection_and_renders_without_running():
    with tensordb.connect(workers=2) as con:
        con.load("A", np.arange(6.0).reshape(2, 3))
        g = tensordb.Graph().einsum("ij,kj->ik", "A", "A", into="G")
        text = con.explain(g)
        assert text.startswith("EXPLAIN: 1 operation(s)") and not con.store.has("G")
        text = con.explain(g, analyze=True)
        assert text.startswith("EXPLAIN ANALYZE")
        a = np.arange(6.0).reshape(2, 3)
        np.testing.assert_allclose(con.tensor("G"), a @ a.T)
    assert not hasattr(explain, "explain_graph")  # explain renders; the connection plans


def test_the_dialects_settings_are_the_connections():
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(config.Settings)}
    for name in SETTINGS:  # each is ours: SHOW/SET of it is not sent to DuckDB
        assert type(parse(f"SHOW {name}")[0]).__name__ == "ShowSettingStmt"
        assert type(parse(f"SET {name} = 1")[0]).__name__ == "SetStmt"


def test_the_dialects_depth_bound_is_the_irs():
    assert MAX_EXPRESSION_DEPTH == scalar.MAX_EXPRESSION_DEPTH


def test_the_sessions_explain_formats_are_explains():
    assert session.script.FORMATS == explain.FORMATS
