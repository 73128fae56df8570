"""The executor keeps memory_limit while a query runs (issue 11): a child process runs a query
under a small limit while this process samples its anonymous memory; spill files are removed
however a run ends. Results are checked against numpy, spilling against the run's measurements.
"""
from __future__ import annotations

import _thread
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb.errors import ProgrammingError
from tests.harness import HAS_PROC, SampledChild, rss_anon

pytestmark = pytest.mark.skipif(not HAS_PROC, reason="samples /proc/<pid>/status (Linux)")

MB = 1 << 20
LIMIT = 32 * MB

CHAIN = "LET H[i,k] = RELU(SUM(Xc[i,j] * W1[j,k])); Y[i,m] = SUM(H[i,k] * W2[k,m]);"
# H (64 MiB, twice the limit) is made while Y runs; Z needs all of it again, next to G, which
# is made only then: H must wait for Z, and only part of it fits.
MUST_SPILL = CHAIN + " LET G[i,m] = RELU(SUM(Xc[i,j] * W3[j,m])); Z[k,m] = SUM(H[i,k] * G[i,m]);"


def _f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A database of float32 operands (hundreds of MiB in all), and the arrays."""
    rng = np.random.default_rng(11)
    d = {"X": _f32(rng, 6144, 4096), "W": _f32(rng, 4096, 1024),
         "Xc": _f32(rng, 16384, 256), "W1": _f32(rng, 256, 1024), "W2": _f32(rng, 1024, 64),
         "W3": _f32(rng, 256, 64), "U": _f32(rng, 8192, 1024), "V": _f32(rng, 8192, 1024),
         "D": np.abs(_f32(rng, 768, 768)), "B": _f32(rng, 6144, 256)}
    sparse = _f32(rng, 6144, 6144)
    blocks = rng.random((6, 6)) < 0.5  # half of the 1024 x 1024 tiles are absent
    for (bi, bj), zero in np.ndenumerate(blocks):
        if zero:
            sparse[bi * 1024:(bi + 1) * 1024, bj * 1024:(bj + 1) * 1024] = 0
    d["S"] = sparse
    path = tmp_path_factory.mktemp("budget") / "db.tdb"
    with tensordb.connect(path) as con:
        for name, a in d.items():
            con.load(name, a, tile=(1024, 1024) if name == "S" else None)
        con.load("N", np.arange(-4, 4, dtype=np.int64))
        con.load("Neg", np.full(8, -1, dtype=np.int64))  # int ** -1: a DataError when it runs
        assert con.store.meta("S").tile_count < con.store.meta("S").total_tiles
    return path, d


def _runs(db: Path) -> list[str]:
    """The run spill directories in database ``db`` (exec/spill.py)."""
    try:
        return sorted(e.name for e in os.scandir(db / "spill") if e.name.startswith("run-"))
    except FileNotFoundError:
        return []


def _spill_files(db: Path) -> int:
    return sum(len(os.listdir(db / "spill" / r)) for r in _runs(db) if (db / "spill" / r).exists())


class Child(SampledChild):
    """``python -m tests.budget_child``: warm-up, then the script; sampled every ~2 ms, and the
    most spill files seen at once counted at each sample."""

    def __init__(self, db: Path, limit: int, script: str, workers: int = 2) -> None:
        self.db, self.spill_seen = db, 0
        super().__init__([sys.executable, "-m", "tests.budget_child", str(db), str(limit),
                          str(workers)], script, watch=self._watch)

    def _watch(self) -> None:
        self.spill_seen = max(self.spill_seen, _spill_files(self.db))

    def wait_for_spill_files(self, timeout: float = 60.0) -> None:
        t0 = time.monotonic()
        while not self.spill_seen and self.proc.poll() is None:
            assert time.monotonic() - t0 < timeout, "no spill file appeared"
            time.sleep(0.002)
        assert self.spill_seen, "the run ended before it spilled"


def _bounded(db: Path, script: str, limit: int = LIMIT) -> dict:
    """Run ``script`` in a child under ``limit``: its anonymous memory above idle stays within
    1.25x the limit, and its spill files are gone afterwards."""
    child = Child(db, limit, script)
    out = child.finish()
    assert "result" in out, out
    grew = child.grew
    assert grew <= 1.25 * limit, f"anonymous memory grew by {grew / MB:.1f} MiB " \
        f"(limit {limit / MB:.0f} MiB): {out}"
    assert _runs(db) == []
    print(f"grew {grew / MB:.1f} MiB under {limit / MB:.0f} MiB: {out}")  # shown with -s
    return {**out["result"], "spill_seen": child.spill_seen}


def _stored(db: Path, *names):
    with tensordb.connect(db, read_only=True) as con:
        return [con.tensor(n) for n in names]


def _close(got, expect):
    expect = np.asarray(expect, dtype=np.float64)
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max()))


def _relu(a):
    return np.maximum(a, 0)


# -- the budget holds ----------------------------------------------------------------------------

def test_a_matmul_with_partials_stays_within_the_limit(data):
    db, d = data
    _bounded(db, "Y[i,k] = SUM(X[i,j] * W[j,k]) WITH (PIECES j 8);")
    _close(*_stored(db, "Y"), d["X"].astype(np.float64) @ d["W"])


def test_a_chain_with_an_unstored_intermediate_twice_the_limit(data):
    db, d = data
    _bounded(db, CHAIN)
    h = _relu(d["Xc"].astype(np.float64) @ d["W1"])
    _close(*_stored(db, "Y"), h @ d["W2"])


def test_an_intermediate_needed_again_later_is_spilled_and_read_back(data):
    db, d = data
    result = _bounded(db, MUST_SPILL)
    assert result["spilled_bytes"] > 0 and result["over_budget"] == 0
    x = d["Xc"].astype(np.float64)
    h, g = _relu(x @ d["W1"]), _relu(x @ d["W3"])
    y, z = _stored(db, "Y", "Z")
    _close(y, h @ d["W2"])
    _close(z, h.T @ g)


def test_an_aggregation_of_many_partials(data):
    db, d = data
    _bounded(db, "P[i,k] = SUM(U[j,i] * V[j,k]) WITH (PIECES j 32);")
    _close(*_stored(db, "P"), d["U"].T.astype(np.float64) @ d["V"])


def test_a_min_plus_product(data):
    db, d = data
    _bounded(db, "M[i,j] = MIN(D[i,k] + D[k,j]);")
    dd = d["D"]
    expect = np.min(dd[:, :, None] + dd[None, :, :], axis=1)
    np.testing.assert_array_equal(*_stored(db, "M"), expect)


def test_a_block_sparse_product(data):
    db, d = data
    _bounded(db, "Q[i,k] = SUM(S[i,j] * B[j,k]);")
    _close(*_stored(db, "Q"), d["S"].astype(np.float64) @ d["B"])


def test_without_a_limit_nothing_spills(data):
    db, d = data
    child = Child(db, 0, MUST_SPILL)
    out = child.finish()
    assert out["result"]["spilled_bytes"] == 0 and child.spill_seen == 0


# -- spill files are removed however a run ends ---------------------------------------------------

def test_spill_files_go_after_success(data):
    db, _ = data
    result = _bounded(db, MUST_SPILL)
    assert result["spill_seen"] > 0 and _runs(db) == []


def test_spill_files_go_after_an_error(data):
    db, _ = data
    # The failing statement comes last: its tasks run after H was spilled.
    child = Child(db, LIMIT, MUST_SPILL + " F[i] = POW(N[i], Neg[i]);")
    out = child.finish()
    assert out.get("error") == "DataError", out
    assert child.spill_seen > 0
    assert _runs(db) == []
    with tensordb.connect(db, read_only=True) as con:  # the failed group stored nothing
        assert not con.store.has("F")


def test_spill_files_go_after_kill_9_and_reopen(data):
    db, _ = data
    child = Child(db, LIMIT, MUST_SPILL.replace("Y[", "Y9[").replace("Z[", "Z9["))
    child.wait_for_spill_files()
    child.kill()
    assert _runs(db), "the killed run left its spill directory"
    with tensordb.connect(db) as con:  # the next open removes it
        assert not con.store.has("Z9")
    assert _runs(db) == []


def test_spill_files_go_after_ctrl_c(data):
    db, _ = data
    with tensordb.connect(db, workers=2, memory_limit=LIMIT) as con:
        seen = []

        def interrupt_once_spilling():
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                if _spill_files(db):
                    seen.append(True)
                    _thread.interrupt_main()
                    return
                time.sleep(0.001)

        watcher = threading.Thread(target=interrupt_once_spilling)
        watcher.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                con.execute(MUST_SPILL.replace("Y[", "Yc[").replace("Z[", "Zc["))
        finally:
            watcher.join()
        assert seen and _runs(db) == []
        assert not con.store.has("Zc")


def test_an_in_memory_database_spills_to_a_temporary_directory(tmp_path, monkeypatch, data):
    _, d = data
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with tensordb.connect(workers=2, memory_limit=LIMIT) as con:
        for name in ("Xc", "W1", "W2", "W3"):
            con.load(name, d[name])
        con.execute(MUST_SPILL)
        assert con.last_run.spilled_bytes > 0
        assert [p for p in os.listdir(tmp_path) if p.startswith("tensordb-spill-")] == []
        text = con.explain("E[k,m] = SUM(Xc[i,k] * Xc[i,m])", analyze=True)
        assert "spilled 0 B" in text and "of the 32.0 MiB budget" in text


def test_a_temporary_spill_directory_of_a_killed_process_goes_at_the_next_spill(tmp_path,
                                                                               monkeypatch):
    from tensordb.storage.spilldir import TEMP_PREFIX, make_run_directory
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    orphan = tmp_path / f"{TEMP_PREFIX}{dead.pid}-abc"
    orphan.mkdir()
    (orphan / "7.npy").write_bytes(b"x" * 100)
    alive = tmp_path / f"{TEMP_PREFIX}{os.getppid()}-def"  # a running process's: kept
    alive.mkdir()
    mine = make_run_directory(None)
    try:
        assert not orphan.exists() and alive.exists()
        assert os.path.basename(mine).startswith(f"{TEMP_PREFIX}{os.getpid()}-")
    finally:
        os.rmdir(mine)
        alive.rmdir()


def test_explain_analyze_reports_spilled_bytes(data):
    db, _ = data
    with tensordb.connect(db, workers=2, memory_limit=LIMIT) as con:
        con.execute("LET H[i,k] = RELU(SUM(Xc[i,j] * W1[j,k])); "
                    "LET G[i,m] = RELU(SUM(Xc[i,j] * W3[j,m]));")
        group = "Ye[i,m] = SUM(H[i,k] * W2[k,m]); Ze[k,m] = SUM(H[i,k] * G[i,m]);"
        plan = json.loads(con.explain(group, format="json", analyze=True))
        m = plan["measured"]
        assert m["memory_limit"] == LIMIT and m["spilled_bytes"] > 0 and m["spill_seconds"] > 0
        ops = [n["measured"] for n in plan["nodes"]]
        assert sum(o["spilled_bytes"] for o in ops) == m["spilled_bytes"]
        assert max(o["peak_bytes"] for o in ops) == m["peak_bytes"] > 0
        text = con.explain(group.replace("Ye[", "Yt[").replace("Ze[", "Zt["), analyze=True)
        assert "of the 32.0 MiB budget), spilled " in text and "spilled 0 B" not in text
        assert "live*" in text and "spilled*" in text


def test_the_spill_directory_is_refused_to_user_writes(data):
    db, _ = data
    with tensordb.connect(db) as con:
        target = db / "spill" / "mine.csv"
        with pytest.raises(ProgrammingError):
            con.sql(f"COPY (SELECT 1 AS a) TO '{target}'")
        assert not target.exists()


# -- the order and the Dask mapping ----------------------------------------------------------------

def test_the_order_is_topological_and_consumes_each_intermediate_tile_at_once(data):
    db, _ = data
    with tensordb.connect(db, workers=2, memory_limit=LIMIT) as con:
        con.execute(CHAIN.replace("Y[", "Yo["))
        plan = con.last_plan
    rank = plan.rank
    assert sorted(rank.values()) == list(range(len(plan.tasks)))
    for t in plan.tasks:
        assert all(rank[k] < rank[t.key] for k in t.inputs)
    # every H tile (the RELU's output) is read by the task ranked first among its readers as
    # soon as that reader's other inputs exist: whatever runs in between is a Load or a task
    # that reader needs (depth first), never work for other tiles
    consumers = plan.consumers()
    by_key = {t.key: t for t in plan.tasks}

    def needed_by(key) -> set:
        seen, todo = set(), [key]
        while todo:
            for k in by_key[todo.pop()].inputs:
                if k not in seen:
                    seen.add(k)
                    todo.append(k)
        return seen

    relu = {t.key for t in plan.tasks if getattr(t, "op", None) == 1}
    assert relu
    for k in relu:
        first = min(consumers[k], key=rank.__getitem__)
        needed = needed_by(first)
        between = [t for t in plan.tasks if rank[k] < rank[t.key] < rank[first]]
        assert all(type(t).__name__ == "Load" or t.key in needed for t in between)


def test_a_local_dask_cluster_gets_its_share_of_the_budget():
    pytest.importorskip("distributed")
    from tensordb.exec.dask import PROCESS_ALLOWANCE, DaskExecutor
    ex = DaskExecutor("dask://local", 2, memory_limit=64 * MB)
    try:
        workers = ex.client.scheduler_info()["workers"].values()
        assert [w["memory_limit"] for w in workers] == [32 * MB + PROCESS_ALLOWANCE] * 2
    finally:
        ex.close()


def test_a_spill_that_cannot_be_written_keeps_tiles_in_memory(tmp_path, monkeypatch, data):
    _, d = data
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with tensordb.connect(workers=2, memory_limit=LIMIT) as con:
        for name in ("Xc", "W1", "W2", "W3"):
            con.load(name, d[name])
        monkeypatch.setattr(tempfile, "tempdir", str(not_a_directory))  # mkdtemp fails there
        con.execute(MUST_SPILL)
        assert con.last_run.spilled_bytes == 0  # it waited, or ran over the budget, instead
        x = d["Xc"].astype(np.float64)
        h, g = _relu(x @ d["W1"]), _relu(x @ d["W3"])
        _close(con.tensor("Z"), h.T @ g)


@pytest.mark.parametrize("seed", [1, 3, 4, 5])
def test_fuzzed_statements_under_a_tiny_budget_match_numpy(seed, tmp_path, monkeypatch):
    """The fuzz test's statements (every dtype, join, aggregate, empty and block-sparse tensor)
    with the executor's budget at 2 KiB: it spills, waits and runs over it all the time."""
    from tensordb.exec.budget import Budget
    from tests.corpus.test_fuzz import run_batch
    crossed = []
    real = Budget._spill

    def counted(self, excess, keep):  # the real admission, its crossings counted
        crossed.append(excess)
        return real(self, excess, keep)

    monkeypatch.setattr(Budget, "_spill", counted)
    failures = run_batch(seed, directory=tmp_path, memory_limit=2048)
    assert not failures, "\n".join(failures[:3])
    # these seeds' plans hold more than 2 KiB of tiles: admission found the budget crossed (and
    # spilled, waited or ran over it: which one depends on the two workers' timing)
    assert crossed
    assert not list(tmp_path.glob("*/spill/run-*"))


def test_a_run_that_cannot_reach_the_limit_is_not_admitted_task_by_task(data):
    from tensordb.exec.budget import may_cross, working_bytes
    db, d = data
    with tensordb.connect(db, workers=2, memory_limit=LIMIT) as con:
        con.execute("Eb[k,m] = SUM(Xc[i,k] * Xc[i,m]);")
        small = con.last_plan
        con.execute(CHAIN.replace("Y[", "Yb["))
        chain = con.last_plan
    # the Gram matrix's tiles all fit the limit at once; the chain's do not
    assert sum(working_bytes(small, t) for t in small.tasks) <= LIMIT and not may_cross(small, LIMIT)
    assert may_cross(chain, LIMIT)
    _close(*_stored(db, "Eb"), d["Xc"].T.astype(np.float64) @ d["Xc"])


def test_an_einsum_returned_as_an_array_holds_no_second_copy(tmp_path):
    """con.einsum without into= assembles the output tiles into one array: each tile is let go
    as it lands, and the finished run keeps none (its object lives on in reference cycles
    until a garbage collection: with the collector off, its tiles once stayed with it, twice
    the result's memory under a limit its size)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2048, 512)), rng.standard_normal((512, 2048))
    with tensordb.connect(tmp_path / "db", workers=2, memory_limit="40MB") as con:
        con.load("A", a)
        con.load("B", b)
        con.einsum("ij,jk->ik", "A", "B")  # warm: plans, pools, buffers
        con.engine.last_run = None  # and what the warm run left: measured from nothing held
        gc.collect()
        gc.disable()
        try:
            before = rss_anon()
            r = con.einsum("ij,jk->ik", "A", "B")
            held = rss_anon() - before - r.nbytes
            # a worker thread may still be leaving the task that made the last tile (its
            # frame holds the tile for a moment after the run is finished): on a busy machine
            # that moment is longer. What the run keeps stays; that moment's tile goes.
            deadline = time.monotonic() + 2.0
            while held >= r.nbytes // 4 and time.monotonic() < deadline:
                time.sleep(0.01)
                held = rss_anon() - before - r.nbytes
        finally:
            gc.enable()
        np.testing.assert_allclose(r, a @ b, rtol=1e-10)
        assert held < r.nbytes // 4, f"{held >> 20} MiB held besides the {r.nbytes >> 20} MiB result"
