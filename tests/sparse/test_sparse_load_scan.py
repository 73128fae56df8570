"""The scan load of a sparse matrix's COO table (formats/coo_scan.py): no ORDER BY in DuckDB, the
rows bucketed into CSR by two counting sorts, pass by pass under a memory budget.

Oracles: numpy's ``add.at`` over the rows in the table's order (the repeats of a cell summed in
that order, bit for bit), scipy's COO -> CSR sum; every stored tile a valid CSR
(storage.sparse.validate). Column-split tiles (one CSR row per row and column tile), integer and
float32 values, DUPLICATES ERROR naming a coordinate that is repeated, and a load of many passes
(a budget of a few hundred entries) storing what one pass stores."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.formats import coo_scan
from tensordb.formats.tables import _stream
from tensordb.storage.sparse import validate


def _table(rng, n, m, repeats, dtype=np.float64):
    i, j = rng.integers(0, n, m), rng.integers(0, n, m)
    k = rng.integers(0, m, repeats)  # cells drawn again, some three times or more
    i, j = np.r_[i, i[k], i[k[: repeats // 3]]], np.r_[j, j[k], j[k[: repeats // 3]]]
    v = (rng.standard_normal(i.size) if np.dtype(dtype).kind == "f" else
         rng.integers(-1000, 1000, i.size)).astype(dtype)
    order = rng.permutation(i.size)
    return i[order], j[order], v[order]


def _in_order(i, j, v, n):
    """The dense sum of the rows in the table's order (numpy's unbuffered add.at)."""
    out = np.zeros((n, n), v.dtype)
    np.add.at(out, (i, j), v)
    return out


def _stored_valid(con, name):
    r = con.store.open(name)
    for c, e in r.entries.items():
        if e.sparse:
            assert validate(r.stored_tile(c), name, c) == []
    return {e.format for e in r.entries.values()}


@pytest.mark.parametrize("tile", [None, (64, 100), (37, 600)])
def test_repeats_sum_in_the_tables_order_bit_for_bit(tmp_path, tile):
    rng = np.random.default_rng(21)
    n = 600
    i, j, v = _table(rng, n, 3000, 900)
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"i": i, "j": j, "v": v}), path)
    with tensordb.connect(tmp_path / "db") as con:
        tile_sql = f" TILE ({tile[0]}, {tile[1]})" if tile else ""
        con.execute(f"CREATE TENSOR G FROM (SELECT i, j, v FROM read_parquet('{path}')) "
                    f"INDEX (i, j) VALUE v SHAPE ({n}, {n}){tile_sql}")
        want = _in_order(i, j, v, n)
        assert con.tensor("G").tobytes() == want.tobytes()
        assert con.describe("G")["nnz"] == np.count_nonzero(want)
        assert _stored_valid(con, "G") == {"csr"}
        con.execute("CHECK TENSOR G")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_integer_and_float32_values_equal_scipys_sums(tmp_path, dtype):
    rng = np.random.default_rng(22)
    n = 400
    i, j, v = _table(rng, n, 2500, 500, dtype)
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"i": i, "j": j, "v": v}), path)
    want = sp.csr_array(sp.coo_array((v, (i, j)), shape=(n, n)))
    want.sum_duplicates()
    with tensordb.connect() as con:
        con.execute(f"CREATE TENSOR G FROM (SELECT i, j, v FROM read_parquet('{path}')) "
                    f"INDEX (i, j) VALUE v SHAPE ({n}, {n}) TILE (50, 200)")
        got = con.sparse("G")
        assert got.dtype == np.dtype(dtype)
        if np.dtype(dtype).kind == "f":  # a float32 cell's repeats: scipy's order, to an ulp
            np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(got.toarray(), want.toarray())
        assert _stored_valid(con, "G") == {"csr"}


@pytest.mark.parametrize("tile", [None, (30, 70)])
def test_duplicates_error_names_a_repeated_coordinate_and_stores_nothing(tmp_path, tile):
    rng = np.random.default_rng(23)
    n = 200
    i, j = rng.integers(0, n, 1500), rng.integers(0, n, 1500)
    cells = np.unique(i * n + j)
    i, j = cells // n, cells % n            # distinct cells
    i, j = np.r_[i, i[700]], np.r_[j, j[700]]  # one of them again, at the end
    order = rng.permutation(i.size)
    i, j = i[order], j[order]
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"i": i, "j": j, "v": np.ones(i.size)}), path)
    with tensordb.connect(tmp_path / "db") as con:
        tile_sql = f" TILE ({tile[0]}, {tile[1]})" if tile else ""
        with pytest.raises(tensordb.DataError, match="appears more than once") as err:
            con.execute(f"CREATE TENSOR G FROM (SELECT i, j, v FROM read_parquet('{path}')) "
                        f"INDEX (i, j) VALUE v SHAPE ({n}, {n}){tile_sql} DUPLICATES ERROR")
        assert f"(i={cells[700] // n}, j={cells[700] % n})" in str(err.value)
        assert not con.store.has("G")


@pytest.mark.parametrize("tile", [(16, 250), (16, 90)])
def test_many_passes_store_what_one_pass_stores(tmp_path, tile):
    rng = np.random.default_rng(24)
    n = 250
    i, j, v = _table(rng, n, 4000, 600)
    frame = pa.table({"i": i, "j": j, "v": v})
    want = _in_order(i, j, v, n)
    with tensordb.connect(tmp_path / "db") as con:
        store = con.store
        view = "__test_scan_edges"
        store.duck.register(view, frame)
        try:
            groups = coo_scan._passes(store.duck, view, "i", tile[0], i.size, 56, 56 * 700)
            assert len(groups) > 3
            assert sum(g[2] for g in groups) == i.size
            assert all(g[2] <= 700 or g[1] - g[0] == 1 for g in groups)
            for name, budget in (("one", None), ("many", 56 * 700)):
                with store.writer(name, (n, n), np.float64, tile, dims=("i", "j")) as w:
                    coo_scan.load_passes(w, store.duck, view, ["i", "j"], "v", tile_shape=tile,
                                         rows=i.size, limit=None, duplicates="sum",
                                         where="test", stream=_stream, budget=budget)
        finally:
            store.duck.unregister(view)
        for name in ("one", "many"):
            assert con.tensor(name).tobytes() == want.tobytes()
            assert _stored_valid(con, name) == {"csr"}
