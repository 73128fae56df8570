"""torch (and JAX) from the user's side (neither is a dependency: these run where installed):
torch tensors in through DLPack, results out as torch tensors, with numpy.einsum and DuckDB's
own ``torch()`` as the oracles."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

import tensordb


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_a_torch_tensor_loads_and_a_result_comes_back_as_one(tmp_path, torch):
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    b = torch.linspace(-1, 1, 20, dtype=torch.float32).reshape(4, 5)
    with tensordb.connect(tmp_path / "t.tdb") as con:
        con.load("A", a)
        con.load("B", b)
        result = con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        c = result.torch()
        assert isinstance(c, torch.Tensor) and c.dtype == torch.float32 and c.shape == (3, 5)
        np.testing.assert_allclose(c.numpy(), np.einsum("ij,jk->ik", a.numpy(), b.numpy()),
                                   rtol=1e-6)
        assert torch.equal(con.to_torch("A"), a)
        assert torch.equal(con.execute("D[i,j] = A[i,j] > 5").torch(), a > 5)  # bool too


def test_rows_as_torch_match_duckdb(torch):
    sql = "SELECT range AS i, range * 0.5 AS x, range % 2 = 0 AS even FROM range(6)"
    with tensordb.connect() as con:
        ours = con.execute(sql).torch()
        con.execute(sql)
        from_connection = con.fetch_torch()
    theirs = duckdb.sql(sql).torch()
    for got in (ours, from_connection):
        assert got.keys() == theirs.keys()
        for column in theirs:
            assert got[column].dtype == theirs[column].dtype
            assert torch.equal(got[column], theirs[column])


def test_a_text_column_has_no_torch_dtype(torch):
    with tensordb.connect() as con:
        with pytest.raises(tensordb.DataError, match="column 's'"):
            con.execute("SELECT 'a' AS s").torch()


def test_a_jax_array_loads_through_dlpack(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    a = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    with tensordb.connect() as con:
        con.load("J", a)
        got = con.execute("S[i] = SUM(J[i,j])").tensor()
    np.testing.assert_allclose(got, np.asarray(a).sum(axis=1))
    assert got.dtype == np.float32
