"""The executor contract (exec/contract.py; issue 25, item 5): every executor is an ``Executor``,
planning reads its ``Capabilities`` without making one, and every executor hands each stored
output tile to the run's ``OutputSink`` (physical/sink.py CatalogSink), with the facts the
catalog records; the oracles are numpy and ``tile_stats`` of the stored bytes."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.bind import bind_graph as bind
from tensordb.exec import LocalExecutor, capabilities
from tensordb.exec.contract import Capabilities, Executor, OutputSink
from tensordb.exec.gpu import DeviceTiles
from tensordb.physical import CatalogSink
from tensordb.storage.tilestats import tile_stats
from tests.fakecupy import cupy as fakecupy


def test_capabilities_are_read_without_making_an_executor(monkeypatch):
    import tensordb.exec as ex
    from tensordb.exec.dask import DaskExecutor
    made = []
    for cls in (LocalExecutor, DaskExecutor):
        monkeypatch.setattr(cls, "__init__", lambda self, *a, **k: made.append(a))
    assert capabilities("local", 3, 3000) == Capabilities(3, None, 1000)
    assert capabilities("gpu", 2, None) == Capabilities(2, None, None)
    assert capabilities("dask://local", 2, 2000) == Capabilities(2, 8, 1000)
    assert ex.max_fan_in("dask://10.0.0.5:8786", lambda: 1 / 0) == 8
    assert not made
    with pytest.raises(tensordb.ProgrammingError, match="valid executors: dask, gpu, local"):
        capabilities("nope://x", 1)
    with pytest.raises(ValueError):
        Capabilities(0)


def test_every_in_process_executor_keeps_the_contract():
    pool = LocalExecutor(2, memory_limit=4000)
    gpu = LocalExecutor(2, tiles=DeviceTiles([0, 1], xp=fakecupy))
    try:
        for ex in (pool, gpu):
            assert isinstance(ex, Executor) and ex.alive
        assert pool.capabilities() == capabilities("local", 2, 4000) == Capabilities(2, None, 2000)
    finally:
        pool.close()
        gpu.close()


class RecordingSink(CatalogSink):
    """The sink the connection uses, recording what the executor hands it."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.handed: dict[int, tuple] = {}

    def finished(self, key, tile, facts=None):
        self.handed[key] = (np.array(tile, copy=True), facts)
        return super().finished(key, tile, facts)


@pytest.mark.parametrize("kind", ["pool", "gpu"])
def test_each_stored_output_tile_reaches_the_sink_once(tmp_path, kind):
    assert issubclass(CatalogSink, OutputSink)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((96, 64)).astype(np.float32)
    b = rng.standard_normal((64, 80)).astype(np.float32)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a, tile=(32, 32))
        con.load("B", b, tile=(32, 32))
        g = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C",
                                    pieces={"i": 3, "j": 2, "k": 2})
        _, plan = con.plan(bind(g, con.store), g.pieces)
        ex = LocalExecutor(2) if kind == "pool" else \
            LocalExecutor(2, tiles=DeviceTiles([0, 1], xp=fakecupy))
        sink = RecordingSink(con.store, plan, replace=True)
        try:
            result = ex.run(plan, con.store, sink=sink)
            sink.commit(result)
        finally:
            ex.close()
        keys = set(plan.outputs["C"].tiles.values())
        assert set(sink.handed) == keys
        for tile, facts in sink.handed.values():
            assert facts == tile_stats(np.ascontiguousarray(tile))  # what the catalog records
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-5, atol=1e-5)
        entries = con.store.open("C").entries.values()
        assert sorted(e.crc32 for e in entries) == sorted(f[2] for _, f in sink.handed.values())
        assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"
