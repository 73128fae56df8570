"""One driver (tensordb/driver/): parse -> bind -> optimize -> lower -> place -> run -> commit,
each stage timed under TENSORDB_DEBUG, for the connection, the session, Graphs and EXPLAIN
alike; one catalog snapshot per statement group; one prepared-statement cache; the session's
state lives on the connection; the dialect only parses (what it knows of the other stages is
checked against them here)."""
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


def test_the_session_calls_the_engine_never_the_connections_privates():
    """The session is handed the engine (``con.engine``); no ``con._name`` anywhere in it."""
    for path in (ROOT / "tensordb" / "session").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bcon\._[a-z]", text), path


@pytest.fixture
def counted(monkeypatch):
    """How often, per call, the catalog's tile entries are opened and each input's layout and
    NaN/inf facts are computed."""
    from tensordb.storage import Store
    from tensordb.storage.reader import TensorReader
    seen = {"open_many": 0, "layout": 0, "facts": 0}
    for cls, name in ((Store, "open_many"), (TensorReader, "layout"), (TensorReader, "facts")):
        real = getattr(cls, name)

        def counting(self, *args, _real=real, _name=name):
            seen[_name] += 1
            return _real(self, *args)
        monkeypatch.setattr(cls, name, counting)
    return seen


def test_a_group_reads_the_catalog_once_through_its_snapshot(counted):
    """A new group, a repeat, a GRAD step and a Graph each open their inputs in one
    ``Store.open_many`` and compute each input's layout and facts at most once."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    step = ("LET T[i,j] = A[i,j] * 2; L = SUM(T[i,j] * T[i,j]); LET dA = GRAD(L, A); "
            "A[i,j] = A[i,j] - 0.01 * dA[i,j]")
    graph = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="G")
    with tensordb.connect(workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        for run in [lambda: con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")] * 3 + \
                [lambda: con.execute(step)] * 3 + [lambda: con.run(graph)] * 2:
            counted.update(open_many=0, layout=0, facts=0)
            run()
            assert counted["open_many"] == 1, counted
            assert counted["layout"] <= 2 and counted["facts"] <= 2, counted
        np.testing.assert_allclose(con.tensor("C"), a @ b)
        stepped = a * (1 - 0.01 * 8) ** 3  # dL/dA = 8 A, three steps
        np.testing.assert_allclose(con.tensor("A"), stepped)
        np.testing.assert_allclose(con.tensor("G"), stepped @ b)


def test_a_repeated_graph_is_bound_and_planned_once():
    """``con.run(Graph)`` goes through the same prepared-statement cache as SQL text: the
    second run binds nothing and plans nothing, and reads the inputs' new values."""
    rng = np.random.default_rng(6)
    graph = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="G")
    with tensordb.connect(workers=2) as con:
        con.load("B", rng.standard_normal((5, 4)))
        for n in range(3):
            a = rng.standard_normal((6, 5))
            con.load("A", a, replace=True)
            bound, stats = con.engine.cache.bound_hits, con.plan_cache_stats
            con.run(graph)
            np.testing.assert_allclose(con.tensor("G"), a @ con.tensor("B"))
            assert con.engine.cache.bound_hits == bound + (n > 0)
            assert con.plan_cache_stats["hits"] == stats["hits"] + (n > 0)


def test_planning_and_explain_build_no_executor():
    """What planning needs of the executor (workers, fan-in, memory) is declared
    (``Engine.target``): a plan and an EXPLAIN start no worker."""
    with tensordb.connect(workers=2) as con:
        con.load("A", np.arange(6.0).reshape(2, 3))
        text = con.explain("G[i,k] = SUM(A[i,j] * A[k,j])")
        assert text.startswith("EXPLAIN") and con.engine._executor is None
        con.execute("G[i,k] = SUM(A[i,j] * A[k,j])")
        assert con.engine._executor is not None


def test_the_connection_session_and_explain_prepare_through_one_function(monkeypatch):
    """Every entry point (execute, explain, run, einsum) prepares through
    ``driver.pipeline.prepare``: one place to add a decision."""
    from tensordb.driver import engine as engine_mod
    seen = []
    real = engine_mod.prepare
    monkeypatch.setattr(engine_mod, "prepare", lambda *a, **k: seen.append(type(a[0]).__name__)
                        or real(*a, **k))
    with tensordb.connect(workers=2) as con:
        con.load("A", np.eye(3) * 2)
        con.execute("B[i,k] = SUM(A[i,j] * A[j,k])")
        con.explain("B[i,k] = SUM(A[i,j] * A[j,k])")
        con.run(tensordb.Graph().einsum("ij,jk->ik", "A", "A", into="C"))
        got = con.einsum("ij,jk->ik", "A", "A")
        np.testing.assert_allclose(got, np.eye(3) * 4)
        np.testing.assert_allclose(con.tensor("C"), np.eye(3) * 4)
    assert seen == ["list", "list", "Graph", "Graph"]
