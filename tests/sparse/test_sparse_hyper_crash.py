"""kill -9 during a hypersparse load and during the replace of a tensor of COO matrix tiles
(AUDIT26 R3): reopening leaves the old tensor or the new one, CHECK DATABASE is clean and the
entries read back equal the oracle's.

The tensor is 10^8 x 10^8 (40 PB dense) with a few entries a tile: each tile holds far more
rows than entries, so the format rule stores it COO. The child is tests/sparse/test_sparse_crash.py's,
killing itself with SIGKILL after k tiles are in the payload file, before the catalog
transaction, inside it before COMMIT, after COMMIT before the old payload is retired, and after
the statement without closing.
"""
from __future__ import annotations

import os

import pytest

import tensordb
from tests.harness import assert_killed, assert_payloads_referenced, run_script
from tests.sparse.test_sparse_crash import CHILD

N, ROWS, TILE_ROWS = 10**8, 40, 12_500_000


def _sql(rows, salt, replace):
    return (f"CREATE {'OR REPLACE ' if replace else ''}TENSOR G FROM (SELECT "
            f"(r * 2500000 + {salt}) % {N} AS i, (r * 104729 + {salt}) % {N} AS j, "
            f"(r % 7 + {salt})::DOUBLE AS v FROM range({rows}) t(r)) INDEX (i, j) VALUE v "
            f"SHAPE ({N}, {N}) TILE ({TILE_ROWS}, {N})")


def _want(rows, salt):
    return {((r * 2500000 + salt) % N, (r * 104729 + salt) % N): float(r % 7 + salt)
            for r in range(rows)}


def _entries(con):
    return {(int(i), int(j)): v for i, j, v in con.execute("SELECT * FROM G").fetchall()}


@pytest.mark.parametrize("replace,point", [
    (False, "tile1"), (False, "before_catalog"), (False, "after_load"),  # a new tensor
    (True, "tile1"), (True, "tile5"), (True, "before_catalog"), (True, "before_commit"),
    (True, "after_commit"), (True, "after_load")])
def test_kill_during_a_hypersparse_load_or_replace_leaves_old_or_new(tmp_path, point, replace):
    root = str(tmp_path / "db")
    with tensordb.connect(root) as con:
        con.execute(_sql(3, 1, False) if replace else "CREATE TENSOR K FROM (SELECT 1 AS a, "
                    "2.0 AS v) INDEX (a) VALUE v SHAPE (4)")
        if replace:
            assert {r[0] for r in con.execute(
                "SELECT format FROM tensordb.tiles WHERE tensor = 'G'").fetchall()} == {"coo"}
    proc = run_script(CHILD, root, point, _sql(ROWS, 3, True))
    assert_killed(proc.returncode, proc.stderr)
    with tensordb.connect(root) as con:
        new = point in ("after_commit", "after_load")
        if new:
            assert _entries(con) == _want(ROWS, 3)
            formats = {r[0] for r in con.execute(
                "SELECT format FROM tensordb.tiles WHERE tensor = 'G'").fetchall()}
            assert formats == {"coo"}
            assert con.describe("G")["tile_count"] == N // TILE_ROWS
        elif replace:
            assert _entries(con) == _want(3, 1)
        else:
            assert not con.store.has("G")
        report = con.check()
        assert report[-1]["problem"] == "ok", report
        assert_payloads_referenced(con)
