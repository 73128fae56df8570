"""An in-memory database whose retire of a replaced payload failed (an OSError from the file
system, injected once) keeps no bytes until close: the next commit retires it again once the
catalog proves it unreferenced (``Store._reclaim_strays``). On disk the next open's sweep does.

A real in-memory database and its real payload files; oracles: the file system (the retired
path gone), the tensors read back against the arrays loaded, and CHECK DATABASE."""
from __future__ import annotations

import os

import numpy as np

import tensordb
from tensordb.storage import memfiles


def _held(path: str) -> bool:
    """Whether the payload ``path`` still holds bytes: a file, or bytes kept in memory."""
    return os.path.exists(path) or memfiles.get(path) is not None


def test_a_failed_retire_in_memory_is_reclaimed_by_the_next_commit(monkeypatch):
    rng = np.random.default_rng(3)
    a1, a2, b = (rng.standard_normal((256, 256)) for _ in range(3))
    with tensordb.connect(None) as con:
        store = con.store
        con.load("A", a1)
        real = store.spares.retire
        failed, failing = [], [True]

        def retire(path, keep=True):
            if failing:  # the retire, and the retry the same commit makes
                failed.append(path)
                raise OSError(5, "injected")
            return real(path, keep)

        monkeypatch.setattr(store.spares, "retire", retire)
        con.load("A", a2, replace=True)
        assert failed and _held(failed[0])  # the stray: still there
        failing.clear()
        con.load("B", b)  # the next commit retires it: the catalog names it no more
        assert not _held(failed[0]) and store._strays == []
        np.testing.assert_array_equal(con.tensor("A"), a2)
        np.testing.assert_array_equal(con.tensor("B"), b)
        con.execute("CHECK DATABASE")
