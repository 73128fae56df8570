"""The local pool's worker threads keep to a core each (exec/pool.py ``_pin``), unless
``SET pin_workers = off``; a GPU pool's and an oversubscribed pool's threads are never pinned."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb

CORES = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="needs sched_getaffinity and 2 cores")


def _masks(con) -> list[set[int]]:
    """The cores each worker thread may run on, after a run large enough for the workers."""
    con.execute("C[i,k] = SUM(A[i,j] * A[j,k])")  # 2 * 512^3 flops: not run inline
    np.testing.assert_allclose(con.tensor("C"), A @ A, rtol=1e-10)
    return [os.sched_getaffinity(t.native_id) for t in con._get_executor().threads]


A = np.random.default_rng(4).standard_normal((512, 512))


def test_each_worker_keeps_to_a_core_of_its_own(tmp_path):
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", A, tile=(256, 256))
        masks = _masks(con)
        assert len(masks) == 2 and all(len(m) == 1 for m in masks)
        assert masks[0] != masks[1] and masks[0] | masks[1] <= CORES
        assert os.sched_getaffinity(0) == CORES  # the caller's thread is left alone


def test_pin_workers_off_leaves_them_free_and_is_checked(tmp_path):
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", A, tile=(256, 256))
        con.execute("SET pin_workers = off")
        assert all(m == CORES for m in _masks(con))
        con.execute("SET pin_workers = on")  # new threads, pinned again
        assert all(len(m) == 1 for m in _masks(con))
        with pytest.raises(tensordb.ProgrammingError, match="pin_workers must be on or off"):
            con.execute("SET pin_workers = sometimes")


def test_more_workers_than_cores_are_not_pinned(tmp_path):
    with tensordb.connect(tmp_path / "db", workers=len(CORES) + 1) as con:
        con.load("A", A, tile=(128, 128))
        assert all(m == CORES for m in _masks(con))
