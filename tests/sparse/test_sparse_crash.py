"""kill -9 during a sparse load (CREATE OR REPLACE TENSOR ... FROM (SELECT ...) INDEX ...) leaves
the old tensor or the new one, and reopening removes what the killed load left.

A child replaces a small dense tensor G with a sparse one built from COO rows (8 CSR tiles) and
kills itself with SIGKILL at chosen points, as tests/storage/test_crash.py does for dense loads: after k
sparse tiles are in the payload file, before the catalog transaction, inside it before COMMIT,
after COMMIT before the old payload is retired, and after the statement without closing (DuckDB
replays its WAL). The parent reopens the database and checks G and CHECK DATABASE.
"""
from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

import tensordb
from tests.harness import assert_killed, assert_payloads_referenced, run_script

N, ROWS, TILE_ROWS = 2000, 20000, 250
OLD = np.full((8, 8), 7.0, "float32")
LOAD = (f"CREATE OR REPLACE TENSOR G FROM (SELECT (r * 7919) % {N} AS i, "
        f"(r * 104729 + 13) % {N} AS j, (r % 7 + 1)::FLOAT AS v FROM range({ROWS}) t(r)) "
        f"INDEX (i, j) VALUE v SHAPE ({N}, {N}) TILE ({TILE_ROWS}, {N})")

CHILD = textwrap.dedent("""
    import sys
    import tensordb
    from tensordb.storage import catalog, spares, store as st, writer as wr
    from tests.harness import die, die_after, die_before, nth_call

    path, point, sql = sys.argv[1], sys.argv[2], sys.argv[3]

    if point.startswith("tile"):           # after k sparse tiles are in the payload file
        die_after(wr.TensorWriter, "_append", nth_call(int(point[4:])))
    elif point == "before_catalog":
        die_before(st.Store, "_commit_writers")
    elif point == "before_commit":
        die_after(catalog, "replace")
    elif point == "after_commit":
        die_before(spares.SparePayloads, "retire")

    con = tensordb.connect(path)
    con.execute(sql)
    if point == "after_load":
        die()
    con.close()
""")


def new_value():
    r = np.arange(ROWS)
    a = np.zeros((N, N), "float32")
    np.add.at(a, ((r * 7919) % N, (r * 104729 + 13) % N), (r % 7 + 1).astype("float32"))
    return a


@pytest.mark.parametrize("point", ["tile1", "tile5", "before_catalog", "before_commit",
                                   "after_commit", "after_load"])
def test_kill_during_a_sparse_load_leaves_old_or_new(tmp_path, point):
    root = str(tmp_path / "db")
    with tensordb.connect(root) as con:
        con.load("G", OLD)
    proc = run_script(CHILD, root, point, LOAD)
    assert_killed(proc.returncode, proc.stderr)
    with tensordb.connect(root) as con:
        got = con.tensor("G")
        if point in ("tile1", "tile5", "before_catalog", "before_commit"):
            np.testing.assert_array_equal(got, OLD)
        else:
            np.testing.assert_array_equal(got, new_value())
            formats = {r[0] for r in con.execute(
                "SELECT format FROM tensordb.tiles WHERE tensor = 'G'").fetchall()}
            assert formats == {"csr"}
            assert con.describe("G")["tile_count"] == N // TILE_ROWS
        report = con.check()
        assert report[-1]["problem"] == "ok", report
        assert_payloads_referenced(con)
        files = sorted(os.listdir(os.path.join(root, "tiles")))
        assert len(files) == 1, files  # the killed load's payload (or the old one) is gone
