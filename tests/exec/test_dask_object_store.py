"""The Dask executor with the payloads in an object store (a real S3 server on 127.0.0.1: moto,
tests/s3server.py): every worker process reads its Load tiles from the store by byte range
itself (nothing scattered from the client), checking the prefix's database id first; results
match numpy and the local pool's."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tests.corpus.test_engine_corpus import assert_matches, make_case, oracle
from tests.s3server import s3, s3_storage  # noqa: F401 - fixtures

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    from tensordb.exec.dask import local_cluster
    with local_cluster(2, local_directory=str(tmp_path_factory.mktemp("dask"))) as cluster:
        yield cluster


def test_workers_read_the_object_store(dask_cluster, tmp_path, s3_storage):
    url, options = s3_storage
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((96, 64)), rng.standard_normal((64, 80))
    with tensordb.connect(tmp_path / "db", workers=2, storage=url, storage_options=options,
                          executor=f"dask://{dask_cluster.scheduler_address}") as con:
        con.load("A", a, tile=(48, 32))
        con.load("B", b, tile=(32, 40))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
        run = con._get_executor().last_run
        assert run["scattered_bytes"] == 0
        loads = {t.key for t in con.last_plan.tasks if type(t).__name__ == "Load"}
        assert loads and loads <= set(run["loads_on"])  # every Load was read on a worker
        client = con._get_executor().client
        pids = client.run(lambda: __import__("os").getpid())
        assert __import__("os").getpid() not in pids.values()
        # a corpus case or two, against the oracle
        for seed in (1, 5, 9):
            operands, out, arrays, join, agg, pins, _ = make_case(seed)
            names = []
            for k, (arr, tile) in enumerate(arrays):
                names.append(f"x{seed}_{k}")
                con.load(names[-1], arr, tile=tile or None, replace=True)
            g = tensordb.Graph().op(f"o{seed}", out, list(zip(names, operands)), join=join,
                                    agg=agg, pieces=pins)
            con.run(g, replace=True)
            assert_matches(con.tensor(f"o{seed}"), oracle(operands, out, arrays, join, agg))


def test_a_worker_refuses_another_database_at_the_prefix(dask_cluster, tmp_path, s3_storage):
    url, options = s3_storage
    with tensordb.connect(tmp_path / "db", workers=2, storage=url, storage_options=options,
                          executor=f"dask://{dask_cluster.scheduler_address}") as con:
        con.load("A", np.ones((8, 8)), tile=(4, 8))
        from tensordb.storage.objects import ObjectStore
        store = ObjectStore(url, options)
        with store.fs.open_output_stream(f"{store.bucket}/{store.prefix}/database.id") as out:
            out.write(b"1" * 32)
        with pytest.raises(tensordb.OperationalError, match="Dask worker .*another database"):
            con.execute("B[i,j] = A[i,j] * 2")
        assert not con.store.has("B")
