"""The engine corpus (tests/corpus/test_engine_corpus.py, its numpy oracle tests/fuzz_oracle.py)
with the payloads in an object store: a real S3 server on 127.0.0.1 (moto, tests/s3server.py),
the catalog in a local directory, at a small size (every case's inputs and output are objects
written whole and read back by byte range)."""
from __future__ import annotations

import pytest

import tensordb
from tensordb.optimizer import STRATEGIES
from tests.corpus.test_engine_corpus import run_case
from tests.s3server import s3  # noqa: F401 - fixture

N_CASES = 16


@pytest.fixture(scope="module")
def ocon(s3, tmp_path_factory):
    path = tmp_path_factory.mktemp("objcorpus") / "db"
    with tensordb.connect(path, workers=3, storage=s3.prefix("corpus"),
                          storage_options=s3.options) as c:
        yield c


# every case under the default strategy, every fourth under each other one
CASES = [(seed, "default") for seed in range(N_CASES)] + [
    (seed, s) for s in sorted(STRATEGIES) if s != "default" for seed in range(0, N_CASES, 4)]


@pytest.mark.parametrize("seed, strategy", CASES)
def test_random_einsum_on_object_store(ocon, seed, strategy):
    run_case(ocon, seed, strategy)


def test_corpus_left_only_referenced_objects(ocon):
    from tensordb.storage.objects import ObjectStore
    listed = {n for n, _ in ObjectStore(ocon.store.storage, ocon.store.objects.options).list()}
    files = {r[0] for r in ocon.store.duck.execute("SELECT DISTINCT file FROM tensordb.tiles")
             .fetchall()}
    assert listed == files == set()  # every case dropped what it made
