"""The fast sparse load path: a sparse matrix's rows bucketed into CSR with no sort in DuckDB
(formats/coo_scan.py; tests/sparse/test_sparse_load_scan.py tests it further).
Shuffled rows with repeats, from Parquet, over several tiles: the stored tensor is scipy's sum of
the entries, every stored tile a valid CSR (sorted, checked by storage.sparse.validate), zeros
left out; DUPLICATES ERROR still finds a repeat; con.load of a scipy matrix with
explicit zeros stores only its nonzeros."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.storage.sparse import validate


def _shuffled_entries(rng, n, m, repeats):
    i = rng.integers(0, n, m)
    j = rng.integers(0, n, m)
    i = np.r_[i, i[:repeats]]
    j = np.r_[j, j[:repeats]]
    v = rng.standard_normal(i.size)
    order = rng.permutation(i.size)
    return i[order], j[order], v[order]


def _tiles_valid(con, name):
    r = con.store.open(name)
    for c, e in r.entries.items():
        if e.sparse:
            assert validate(r.stored_tile(c), name, c) == []
    return sorted({e.format for e in r.entries.values()})


@pytest.mark.parametrize("tile", [None, (97, 500), (500, 250)])
def test_parquet_rows_shuffled_with_repeats_load_as_scipy_sums_them(tmp_path, tile):
    rng = np.random.default_rng(11)
    n = 500
    i, j, v = _shuffled_entries(rng, n, 4000, 300)
    v[:5] = 0.0          # zeros: not stored
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"i": i, "j": j, "v": v}), path)
    want = sp.csr_array(sp.coo_array((v, (i, j)), shape=(n, n)))
    want.sum_duplicates()
    with tensordb.connect(tmp_path / "db") as con:
        tile_sql = f" TILE ({tile[0]}, {tile[1]})" if tile else ""
        con.execute(f"CREATE TENSOR G FROM (SELECT i, j, v FROM read_parquet('{path}')) "
                    f"INDEX (i, j) VALUE v SHAPE ({n}, {n}){tile_sql}")
        got = con.sparse("G")
        # a repeated cell's values are summed in an order of DuckDB's: equal to an ulp
        np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=1e-14, atol=0)
        assert (got != 0).sum() == (want != 0).sum()
        assert con.describe("G")["nnz"] == np.count_nonzero(want.toarray())
        assert "csr" in _tiles_valid(con, "G")
        con.execute("CHECK TENSOR G")
        Y = con.execute("Y[i] = SUM(G[i,j] * 1.0)") and con.tensor("Y")
        np.testing.assert_allclose(Y, want.sum(axis=1), rtol=1e-12, atol=1e-12)


def test_a_repeat_is_still_refused_when_rows_arrive_sorted(tmp_path):
    rng = np.random.default_rng(12)
    i, j, v = _shuffled_entries(rng, 300, 2000, 1)
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"i": i, "j": j, "v": v}), path)
    with tensordb.connect(tmp_path / "db") as con:
        with pytest.raises(tensordb.DataError, match="appears more than once"):
            con.execute(f"CREATE TENSOR G FROM (SELECT i, j, v FROM read_parquet('{path}')) "
                        "INDEX (i, j) VALUE v SHAPE (300, 300) DUPLICATES ERROR")
        assert not con.store.has("G")


def test_a_scipy_matrix_with_explicit_zeros_stores_only_its_nonzeros():
    rng = np.random.default_rng(13)
    m = sp.random_array((400, 300), density=0.02, random_state=14, format="csr")
    m.data[::7] = 0.0     # explicit zeros, still in the structure
    with tensordb.connect() as con:
        con.load("M", m)
        assert con.describe("M")["nnz"] == np.count_nonzero(m.toarray())
        np.testing.assert_array_equal(con.sparse("M").toarray(), m.toarray())
        assert _tiles_valid(con, "M") == ["csr"]
        x = rng.standard_normal(300)
        con.load("x", x)
        con.execute("y[i] = SUM(M[i,j] * x[j])")
        np.testing.assert_allclose(con.tensor("y"), m @ x, rtol=1e-12, atol=1e-12)
