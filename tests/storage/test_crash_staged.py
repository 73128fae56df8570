"""kill -9 around the commit of a computed output leaves the old version or the new one.

A stored output of up to ``writer.STAGE_MAX`` bytes is computed in anonymous memory and written
into its new payload file at commit (one pwrite), so its bytes reach the file later than a
mapped output's. A child process replaces W with ``W - 0.5 * G`` and V with ``V + 0.25 * G`` in
one statement group (the SGD update of a training step, its plan reused; both outputs' catalog
rows swapped by the same batched statements) and is killed with SIGKILL before that write, after
it (payload complete, catalog untouched), while the payloads' syncs run (the directory's one
fsync for both outputs just started), inside the catalog transaction before COMMIT (the rows
swapped; and later, every sync finished: the last step before COMMIT, docs/storage.md "The
durable steps of a commit"), and after COMMIT before the old payload is deleted (or kept as
a spare to recycle), each both with new
payload files and with recycled ones (staged too: the database fsyncs its commits). The
parent reopens the database: every payload file is referenced, and W and V are both exactly
the old values or both exactly the new ones (numpy's), never a mix or zeros.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tensordb
from tensordb.storage import writer
from tests.harness import assert_killed, assert_payloads_referenced, run_script

SHAPE = (1024, 512)  # 2 MiB of float32: staged (not mapped), one tile or several

CHILD = textwrap.dedent("""
    import sys
    import tensordb
    from tensordb.storage import catalog, redolog, spares, staging, store_commit, writer as wr
    from tests.harness import die_after, die_before

    path, point, before = sys.argv[1], sys.argv[2], int(sys.argv[3])
    con = tensordb.connect(path, workers=2)
    step = "W[i,j] = W[i,j] - 0.5 * G[i,j]; V[i,j] = V[i,j] + 0.25 * G[i,j]"
    con.execute("X[i,j] = W[i,j] * 1")   # an output of its own first: the plan path is warm
    for _ in range(before):              # steps that leave retired payloads to recycle
        con.execute(step)
    take = spares.SparePayloads.take

    def taken(*args, **kwargs):
        size = take(*args, **kwargs)
        if size is not None:
            print("recycled", flush=True)
        return size
    spares.SparePayloads.take = taken

    if point == "before_write":             # computed, nothing written into the new file
        die_before(wr.TensorWriter, "_write_staged")
    elif point == "after_write":            # payload written, catalog untouched
        die_after(wr.TensorWriter, "_write_staged")
    elif point == "syncing":                # the directory's fsync for both outputs started,
        die_after(staging, "_sync_dir")     # the second output's payload not yet synced
    elif point == "before_commit":          # rows swapped inside the transaction, no COMMIT
        die_after(catalog, "store")         # (a replace this process wrote before: its rows
        die_before(redolog.RedoLog, "append")  # kept back, not yet the redo log's record)
    elif point == "synced":                 # every sync finished, the rows swapped: no COMMIT
        die_before(store_commit.StoreCommits, "_end")
    elif point == "after_commit":           # COMMIT done, the old payload not yet deleted
        die_before(spares.SparePayloads, "retire")
    con.execute(step)
    con.close()
""")


def _values():
    rng = np.random.default_rng(3)
    return (rng.standard_normal(SHAPE, dtype=np.float32),
            rng.standard_normal(SHAPE, dtype=np.float32))


@pytest.mark.parametrize("recycled", [False, True], ids=["new-file", "recycled-file"])
@pytest.mark.parametrize("point, outcome", [
    ("before_write", "old"), ("after_write", "old"), ("syncing", "old"), ("before_commit", "old"),
    ("synced", "old"), ("after_commit", "new")])
def test_kill_around_a_staged_output_commit(tmp_path, point, outcome, recycled):
    """``recycled``: two steps ran first, so the killed step writes into a retired payload file
    renamed to its version's name (storage/spares.py), not into a new one."""
    w, g = _values()
    assert w.nbytes <= writer.STAGE_MAX  # the path under test
    path = tmp_path / "db"
    with tensordb.connect(path) as c:
        c.load("W", w)
        c.load("V", w)
        c.load("G", g)
    before = 2 if recycled else 0
    proc = run_script(CHILD, path, point, before)
    assert_killed(proc.returncode, proc.stderr)
    assert (b"recycled" in proc.stdout) == recycled
    with tensordb.connect(path) as c:
        assert_payloads_referenced(c)
        got, got_v = c.tensor("W"), c.tensor("V")
        assert [r["problem"] for r in c.check()] == ["ok"]
    v = w
    for _ in range(before + (outcome == "new")):
        w = w - np.float32(0.5) * g
        v = v + np.float32(0.25) * g
    np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(got_v, v)
