"""The plan cache (physical/cache.py): a repeated statement against unchanged tensors reuses its
plan; a new version of an input, a setting that steers planning or different pieces plan again.
Every result is checked against numpy."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tensordb

SQL = "C[i,k] = SUM(A[i,j] * B[j,k])"


@pytest.fixture
def con(tmp_path):
    rng = np.random.default_rng(3)
    c = tensordb.connect(tmp_path / "db", workers=2)
    c.load("A", rng.standard_normal((12, 10)), tile=(4, 5))
    c.load("B", rng.standard_normal((10, 6)), tile=(5, 3))
    yield c
    c.close()


def _check(con):
    np.testing.assert_allclose(con.tensor("C"), con.tensor("A") @ con.tensor("B"))


def test_a_repeated_statement_hits_the_cache(con):
    con.execute(SQL)
    assert con.plan_cache_stats == {"hits": 0, "misses": 1, "size": 1}
    first = con.last_plan
    for n in range(1, 4):
        con.execute(SQL)
        _check(con)
        assert con.plan_cache_stats["hits"] == n
        assert con.last_plan is first  # the very plan, not planned again
    # EXPLAIN of the same statement is planned from the same graph: a hit too.
    con.explain(SQL)
    assert con.plan_cache_stats["hits"] == 4


def test_a_new_version_of_an_input_misses_and_the_stale_plan_goes(con):
    sql = SQL + " WITH (PIECES i 3, j 2, k 2)"  # A's (4, 5) tiles are the pieces of i and j
    con.execute(sql)
    rng = np.random.default_rng(9)
    con.load("A", rng.standard_normal((12, 10)), tile=(4, 5), replace=True)
    con.execute(sql)
    _check(con)
    stats = con.plan_cache_stats
    assert stats["hits"] == 0 and stats["misses"] == 2 and stats["size"] == 1  # the old one pruned
    assert con.last_run.kernel_calls == 3 * 2 * 2
    # A block-sparse new version has other kernel calls: the old plan must not come back.
    a = con.tensor("A")
    a[:8] = 0
    con.load("A", a, tile=(4, 5), replace=True)
    con.execute(sql)
    _check(con)
    assert con.plan_cache_stats["hits"] == 0
    present = sum(bool(a[4 * i:4 * i + 4, 5 * j:5 * j + 5].any()) for i in range(3) for j in range(2))
    assert con.last_run.kernel_calls == present * 2


def test_the_output_a_statement_reads_changes_its_version(con):
    """C = C @ D reads C: every run is a new version of its input, so every run plans again."""
    con.load("D", np.eye(6) * 2, tile=(3, 3))
    con.execute(SQL)
    expected = con.tensor("C")
    for n in range(3):
        con.execute("C[i,k] = SUM(C[i,j] * D[j,k])")
        expected = expected @ (np.eye(6) * 2)
        np.testing.assert_allclose(con.tensor("C"), expected)
    assert con.plan_cache_stats["hits"] == 0


def test_settings_that_steer_planning_miss_and_others_hit(con):
    con.execute(SQL)
    con.execute("SET workers = 1")
    con.execute(SQL)
    _check(con)
    assert con.plan_cache_stats["hits"] == 0 and con.plan_cache_stats["misses"] == 2
    assert con.last_plan.workers == 1
    con.execute("SET workers = 2")
    con.execute(SQL)  # the first plan again
    assert con.plan_cache_stats["hits"] == 1 and con.last_plan.workers == 2
    con.execute("SET progress = false")  # the CLI's display: plans do not depend on it
    con.execute(SQL)
    assert con.plan_cache_stats["hits"] == 2
    con.execute(SQL + " WITH (PIECES i 3)")  # other pieces: another plan
    _check(con)
    assert con.plan_cache_stats["hits"] == 2


def test_a_cache_hit_shows_in_debug_output(tmp_path):
    script = ("import numpy as np, tensordb\n"
              f"con = tensordb.connect({str(tmp_path / 'db')!r})\n"
              "con.load('A', np.ones((4, 4)))\n"
              "for _ in range(2):\n"
              "    con.execute('C[i] = SUM(A[i,j])')\n"
              "assert (con.tensor('C') == 4).all()\n")
    env = dict(os.environ, TENSORDB_DEBUG="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stderr.count("plan cache hit") == 1
    assert out.stderr.count("[tensordb] lower") == 1
