"""kill -9 in the early-fdatasync window of an appended payload (review rev39a; storage/writer.py
``_append``, staging.py ``sync_early``): a replace of C whose tiles are large enough (>= 1 MiB
as CSR, EARLY_SYNC_MIN) that each starts its file's fdatasync from the writing thread, killed
while that sync runs on its helper thread, after it returned but before the commit, and after
the catalog's commit. The parent reopens and checks against scipy: C is wholly the old
version (killed before the commit) or the new one (after), every payload file is referenced,
CHECK reports nothing wrong."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tests.harness import assert_killed, assert_payloads_referenced, run_script

ROWS, COLS = 512, 4096

CHILD = textwrap.dedent("""
    import sys, threading
    import numpy as np, scipy.sparse as sp
    import tensordb
    from tensordb.storage import redolog, staging, store_commit
    from tests.harness import die, die_after, die_before
    sys.path.insert(0, sys.argv[3])
    from test_crash_early_sync import tiles

    path, point = sys.argv[1], sys.argv[2]
    con = tensordb.connect(path)
    real = staging._datasync
    seen = []

    def datasync(fd):
        early = threading.current_thread() is not threading.main_thread() and not seen
        seen.append(fd)
        if early and point == "in_early_sync":
            die()                            # the helper's fdatasync under way
        real(fd)
        if early and point == "after_early_sync":
            store_commit.StoreCommits._end = die   # synced; the commit not begun
    staging._datasync = datasync
    if point == "after_commit":             # the catalog's commit ended (DuckDB's or the log's)
        die_after(store_commit.StoreCommits, "_end")
    new = tiles(2)
    w = con.store.writer("C", (2 * 512, 4096), np.float64, (512, 4096), replace=True)
    for r, t in enumerate(new):
        w.write_tile((r, 0), t)
    w.commit()
    print("committed", flush=True)
    con.close()
""")


def tiles(seed: int) -> list:
    out = []
    for r in range(2):
        t = sp.csr_array(sp.random(ROWS, COLS, density=0.07, format="csr",
                                   random_state=10 * seed + r, dtype=np.float64))
        t.sum_duplicates()
        t.data += 1.0
        out.append(t)
    return out


def _want(seed: int) -> np.ndarray:
    return sp.vstack(tiles(seed), format="csr").toarray()


@pytest.mark.slow
@pytest.mark.parametrize("point, new", [("in_early_sync", False), ("after_early_sync", False),
                                        ("after_commit", True)])
def test_kill_in_the_early_sync_window(tmp_path, point, new):
    path = tmp_path / "db"
    with tensordb.connect(path) as con:
        w = con.store.writer("C", (2 * ROWS, COLS), np.float64, (ROWS, COLS))
        for r, t in enumerate(tiles(1)):
            w.write_tile((r, 0), t)
        w.commit()
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(1))
    from pathlib import Path
    proc = run_script(CHILD, path, point, Path(__file__).parent)
    assert_killed(proc.returncode, proc.stderr)
    assert b"committed" not in proc.stdout
    with tensordb.connect(path) as con:
        assert_payloads_referenced(con)
        assert [r["problem"] for r in con.check()] == ["ok"]
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(2 if new else 1))
