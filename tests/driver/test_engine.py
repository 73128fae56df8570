"""The tensor-relational engine end to end: block-sparse joins, graphs, re-tiling, transfers,
and bad input that must change nothing."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.physical.plan import Assemble, Kernel
from tensordb.plan.ir import EinGraph, EinOp, TensorInfo


@pytest.fixture
def con():
    with tensordb.connect(workers=2) as c:
        yield c


def _block_sparse(rng, tiles, tile, density):
    mask = rng.random((tiles, tiles)) < density
    a = rng.standard_normal((tiles * tile, tiles * tile)) * np.kron(mask, np.ones((tile, tile)))
    return a, mask


@pytest.mark.parametrize("density", [0.05, 0.2, 0.6])
def test_block_sparse_matmul_calls_equal_joined_pairs(con, density):
    rng = np.random.default_rng(int(density * 100))
    a, ma = _block_sparse(rng, 16, 8, density)
    b, mb = _block_sparse(rng, 16, 8, density)
    con.load("A", a, tile=(8, 8))
    con.load("B", b, tile=(8, 8))
    con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 16, "j": 16, "k": 16})
    pairs = int(np.einsum("ij,jk->", ma.astype(int), mb.astype(int)))
    assert con.last_plan.kernel_calls == pairs
    np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-9)


def test_max_sees_zeros_of_absent_tiles(con):
    x = -np.abs(np.random.default_rng(0).standard_normal((8, 8))) - 1
    x[:, 4:] = 0  # absent tiles: the row maximum is 0, not a negative number
    con.load("X", x, tile=(4, 4))
    con.run(tensordb.Graph().op("M", "i", [("X", "ij")], agg="max", pieces={"i": 2, "j": 2}))
    np.testing.assert_array_equal(con.tensor("M"), x.max(axis=1))


def test_prod_of_absent_tile_is_zero(con):
    x = np.random.default_rng(1).uniform(1, 2, (6, 6))
    x[:3, :3] = 0
    con.load("X", x, tile=(3, 3))
    con.run(tensordb.Graph().op("P", "i", [("X", "ij")], agg="prod", pieces={"i": 2, "j": 2}))
    np.testing.assert_allclose(con.tensor("P"), x.prod(axis=1))


def test_graph_with_temporaries_stores_only_outputs(con):
    rng = np.random.default_rng(2)
    x, w1, c, w2 = (rng.standard_normal(s) for s in [(16, 8), (8, 32), (32,), (32, 8)])
    for n, a in zip(["X", "W1", "c", "W2"], [x, w1, c, w2]):
        con.load(n, a)
    g = (tensordb.Graph()
         .einsum("bh,hf->bf", "X", "W1", into="Z", store=False)
         .op("H", "bf", [("Z", "bf"), ("c", "f")], join="relu(x0 + x1)", store=False)
         .einsum("bf,fh->bh", "H", "W2", into="Y"))
    con.run(g)
    np.testing.assert_allclose(con.tensor("Y"), np.maximum(x @ w1 + c, 0) @ w2, atol=1e-9)
    names = {t["name"] for t in con.tensors()}
    assert "Y" in names and not {"Z", "H"} & names


def test_retiling_between_operations(con):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((12, 10)), rng.standard_normal((10, 9))
    con.load("A", a)
    con.load("B", b)
    g = (tensordb.Graph()
         .einsum("ij,jk->ik", "A", "B", into="T", store=False, pieces={"i": 3, "k": 1, "j": 2})
         .op("U", "ki", [("T", "ik")], join="x0 * 2", pieces={"i": 2, "k": 3}))
    con.run(g)
    assert any(isinstance(t, Assemble) for t in con.last_plan.tasks)
    assert con.last_plan.stats[1].retile_bytes > 0
    np.testing.assert_allclose(con.tensor("U"), 2 * (a @ b).T, atol=1e-9)


def test_transfers_are_counted_from_the_plan(con):
    rng = np.random.default_rng(4)
    con.load("A", rng.standard_normal((64, 64)))
    result = con.einsum("ij,jk->ik", "A", "A", into="C", pieces={"i": 2, "j": 2, "k": 2})
    plan = con.last_plan
    made = {t.key: t.worker for t in plan.tasks}
    size = {}
    for t in plan.tasks:
        if isinstance(t, Kernel):
            size[t.key] = int(np.prod(t.out_shape)) * 8
    expected = sum(size.get(k, 0) for t in plan.tasks for k in t.inputs
                   if made[k] != t.worker and k in size)
    assert result.bytes_moved == expected
    np.testing.assert_allclose(con.tensor("C"), con.tensor("A") @ con.tensor("A"), atol=1e-9)


def test_bad_input_changes_nothing(con):
    con.load("A", np.ones((4, 3)))
    con.load("B", np.ones((5, 2)))
    before = con.tensors()
    cases = [
        (lambda: con.einsum("ij,jk->ik", "A", "Nope", into="C"), tensordb.CatalogError, "Nope"),
        (lambda: con.einsum("ij,jk->ik", "A", "B", into="C"), tensordb.BinderError, "'j'"),
        (lambda: con.einsum("ij->ii", "A", into="C"), tensordb.BinderError, "repeated"),
        (lambda: con.einsum("", "A", into="C"), tensordb.BinderError, "spec"),
        (lambda: con.einsum("ij,jk->ik", into="C"), tensordb.BinderError, "operand"),
        (lambda: con.einsum("ij->ik", "A", into="C"), tensordb.BinderError, "'k'"),
        (lambda: con.einsum("ijk->i", "A", into="C"), tensordb.BinderError, "dimension"),
        (lambda: con.einsum("ij->i", "A", into="C", agg="median"), tensordb.BinderError, "median"),
        (lambda: con.einsum("ij->i", "A", into="C", join="foo(x0)"), tensordb.BinderError, "foo"),
        (lambda: con.einsum("ij->i", "A", into="A", replace=False), tensordb.CatalogError, "exists"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    assert con.tensors() == before


def test_unsupported_dtype_mix_is_refused():
    with pytest.raises(tensordb.DataError, match="complex128"):
        EinGraph((TensorInfo("A", (2,), "complex128"),),
                 (EinOp.contraction("B", "i", [("A", "i")], {"i": 2}, dtype="complex128"),), ("B",))


def test_label_size_error_names_both_sizes(con):
    con.load("A", np.ones((4, 3)))
    con.load("B", np.ones((5, 2)))
    with pytest.raises(tensordb.BinderError) as err:
        con.einsum("ij,jk->ik", "A", "B", into="C")
    assert "3" in str(err.value) and "5" in str(err.value)


def test_blas_threads_restored_after_run(con):
    from threadpoolctl import threadpool_info
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    con.load("A", np.ones((64, 64)))
    con.einsum("ij,jk->ik", "A", "A", into="C")
    after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert before == after


def test_optimizer_follows_the_stored_grid_of_block_sparse_inputs(con):
    """Without hints, a block-sparse product is cut on the stored grid: calls = joined pairs."""
    rng = np.random.default_rng(7)
    a, ma = _block_sparse(rng, 16, 16, 0.05)
    b, mb = _block_sparse(rng, 16, 16, 0.05)
    con.load("A", a, tile=(16, 16))
    con.load("B", b, tile=(16, 16))
    con.einsum("ij,jk->ik", "A", "B", into="C")
    assert con.last_plan.stats[0].pieces == {"i": 16, "k": 16, "j": 16}
    assert con.last_plan.kernel_calls == int(np.einsum("ij,jk->", ma.astype(int), mb.astype(int)))
    np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-9)


def test_tile_join_sees_tensors_written_earlier_in_the_same_transaction(con):
    """The catalog rows of a tensor loaded inside an open block are not committed yet; the tile
    join must still see them (it runs on the catalog's own connection)."""
    rng = np.random.default_rng(8)
    a, _ = _block_sparse(rng, 8, 4, 0.3)
    with con.store.transaction():
        con.load("A", a, tile=(4, 4))
        con.einsum("ij,jk->ik", "A", "A", into="C", pieces={"i": 8, "j": 8, "k": 8})
    np.testing.assert_allclose(con.tensor("C"), a @ a, atol=1e-9)
    assert not con.sql("SELECT * FROM duckdb_tables() WHERE table_name LIKE '__tensordb%'").fetchall()


def test_results_hand_back_statistics_not_the_stored_bytes(con):
    """Output tiles are computed in place in the stored payload (or its staging buffer): the
    run's result drops them after the commit, so the caller holds nothing that could change the
    stored tensor, and the buffers are free for the next run; reads go through the catalog."""
    con.load("A", np.eye(4))
    result = con.einsum("ij,jk->ik", "A", "A", into="C")
    assert result.tiles == {} and result.kernel_calls >= 1
    got = con.tensor("C")
    try:
        got[...] = 99
    except ValueError:  # a read-only view of the payload
        pass
    np.testing.assert_array_equal(con.tensor("C"), np.eye(4))


def test_a_full_disk_is_an_error_not_a_crash(tmp_path):
    """Output files get their blocks before they are mapped: running out of space (here, a file
    size limit) fails the query cleanly instead of killing the process with SIGBUS."""
    import subprocess
    import sys
    code = f"""
import resource, signal, numpy as np, tensordb
con = tensordb.connect({str(tmp_path / 'db')!r})
con.load("A", np.ones((512, 512)))                      # 2 MiB
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    con.einsum("ij,jk->ik", "A", "A", into="C")         # a 2 MiB result: over the limit
except tensordb.OperationalError as exc:
    print("refused:", exc.message)
print("stored:", con.store.has("C"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: cannot reserve" in out.stdout and "stored: False" in out.stdout


def test_many_small_runs_on_many_workers_queue_each_task_once():
    """Workers start while the first tasks are still being queued: a task whose inputs finish
    meanwhile must still run exactly once (results and the count of kernel calls say so)."""
    with tensordb.connect(workers=8) as con:
        b = np.arange(1024.0).reshape(32, 32) % 7
        con.load("B", b, tile=(4, 4))
        for _ in range(40):
            result = con.einsum("ij,jk->ik", "B", "B", into="D", pieces={"i": 2, "j": 8, "k": 2},
                                replace=True)
            assert result.kernel_calls == 32
            np.testing.assert_allclose(con.tensor("D"), b @ b)


def test_integer_products_with_a_fractional_scale(con):
    a = np.arange(16).reshape(4, 4)
    con.load("A", a)
    con.einsum("ij,jk->ik", "A", "A", into="H", join="x0 * x1 / 2")
    con.einsum("ij,jk->ik", "A", "A", into="F", join="x0 * x1 * 2.5")
    np.testing.assert_allclose(con.tensor("H"), (a @ a) / 2)
    np.testing.assert_allclose(con.tensor("F"), (a @ a) * 2.5)


def test_tiling_hints_are_checked_and_follow_a_replaced_tensor(con):
    con.load("A", np.ones((8, 8)))
    with pytest.raises(tensordb.ProgrammingError, match="'z'"):
        con.einsum("ij,jk->ik", "A", "A", into="C", pieces={"z": 2})
    with pytest.raises(tensordb.ProgrammingError, match="integer"):
        con.einsum("ij,jk->ik", "A", "A", into="C", pieces={"j": "x"})
    con.einsum("ij,jk->ik", "A", "A", into="A", pieces={"i": 4}, replace=True)
    assert con.last_plan.stats[0].pieces["i"] == 4
    np.testing.assert_allclose(con.tensor("A"), np.full((8, 8), 8.0))


def test_bad_data_in_a_kernel_is_a_data_error(con):
    con.load("A", np.array([[1, -2], [3, 4]]))
    with pytest.raises(tensordb.DataError):  # integers to negative integer powers
        con.run(tensordb.Graph().op("P", "ij", [("A", "ij"), ("A", "ij")], join="x0 ** x1"))
    assert not con.store.has("P")


def test_changing_the_memory_limit_reaches_the_running_pool(con):
    con.load("A", np.ones((64, 64)))
    con.einsum("ij,jk->ik", "A", "A", into="C")
    con.set("memory_limit", 1000)
    assert con._get_executor().memory_limit == 1000
