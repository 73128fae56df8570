"""kill -9 during a hypersparse load (every tile COO: rows far above entries) and during a
replace of a tensor stored with COO tiles: reopening leaves the old state or the new one (no
tensor, or the old entries; or the new entries), CHECK DATABASE is clean and no payload is left
unreferenced. The child dies at the points tests/sparse/test_sparse_crash.py uses: after k tiles
are in the payload file, before the catalog transaction, inside it before COMMIT, after COMMIT
before the old payload is retired, and after the statement without closing."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tests.harness import assert_killed, assert_payloads_referenced, run_script
from tests.sparse.test_sparse_crash import CHILD as REPLACE_CHILD

# a first load has no catalog row to replace and no old payload to retire: it dies after
# catalog.insert (inside the transaction, before COMMIT) instead
CHILD = REPLACE_CHILD.replace('die_after(catalog, "replace")',
                              'die_after(catalog, "replace" if "OR REPLACE" in sql else "insert")')

N, TILE_ROWS = 10**9, 10**8          # 10 row tiles of 10^8 rows, a few entries each: COO


def _load(mul: int, add: float, rows: int) -> str:
    return (f"CREATE OR REPLACE TENSOR H FROM (SELECT (r * {mul}) % {N} AS i, "
            f"(r * 104729 + 13) % {N} AS j, ({add} + r)::DOUBLE AS v FROM range({rows}) t(r)) "
            f"INDEX (i, j) VALUE v SHAPE ({N}, {N}) TILE ({TILE_ROWS}, {N})")


OLD_SQL, NEW_SQL = _load(99999989, 0.5, 30), _load(7919 * 12345, -3.5, 40)


def _oracle(mul: int, add: float, rows: int) -> dict:
    r = np.arange(rows, dtype=np.int64)
    return {(int(i), int(j)): float(add + k) for k, i, j in
            zip(r, (r * mul) % N, (r * 104729 + 13) % N)}


OLD, NEW = _oracle(99999989, 0.5, 30), _oracle(7919 * 12345, -3.5, 40)


def _entries(con) -> dict:
    return {(int(i), int(j)): float(v) for i, j, v in con.execute("SELECT * FROM H").fetchall()}


@pytest.mark.parametrize("mode,point", [(m, p) for m in ("load", "replace") for p in (
    "tile1", "tile5", "before_catalog", "before_commit", "after_commit", "after_load")
    if not (m == "load" and p == "after_commit")])  # a first load retires no old payload
def test_kill_during_a_hypersparse_load_or_replace_leaves_old_or_new(tmp_path, mode, point):
    assert len(OLD) == 30 and len(NEW) == 40  # no coordinates repeat: the oracle is exact
    root = str(tmp_path / "db")
    with tensordb.connect(root) as con:
        if mode == "replace":
            con.execute(OLD_SQL)
            assert {r[0] for r in con.execute(
                "SELECT format FROM tensordb.tiles WHERE tensor = 'H'").fetchall()} == {"coo"}
        else:
            con.load("other", np.arange(6.0))  # the catalog is not empty
    sql = NEW_SQL if mode == "replace" else NEW_SQL.replace("CREATE OR REPLACE", "CREATE")
    proc = run_script(CHILD, root, point, sql, timeout=300)
    assert_killed(proc.returncode, proc.stderr)
    with tensordb.connect(root) as con:
        names = {t["name"] for t in con.tensors()}
        if point in ("tile1", "tile5", "before_catalog", "before_commit"):
            if mode == "replace":
                assert _entries(con) == OLD
            else:
                assert "H" not in names
        else:
            assert _entries(con) == NEW
            formats = [r[0] for r in con.execute(
                "SELECT format FROM tensordb.tiles WHERE tensor = 'H'").fetchall()]
            assert set(formats) == {"coo"} and len(formats) == N // TILE_ROWS
        files = sorted(os.listdir(os.path.join(root, "tiles")))
        # the killed load's payload (or the old one) is gone; "other"'s stays
        assert len(files) == (1 if mode == "replace" else 1 + ("H" in names)), files
        report = con.check()
        assert report[-1]["problem"] == "ok", report
        assert_payloads_referenced(con)
        if point in ("after_commit", "after_load"):
            con.execute("S = SUM(H[i,j])")  # the reopened COO tiles compute
            assert float(con.tensor("S")) == pytest.approx(sum(NEW.values()), rel=1e-12)
