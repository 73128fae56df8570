"""What con.execute returns: DuckDB's result methods (arrow, numpy, pandas, polars), tensor
results (the array and the relation), and con.einsum with and without into=."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import tensordb

QUERY = "SELECT x AS k, x / 2 AS v, 'n' || x::VARCHAR AS s FROM range(6) t(x) ORDER BY x"


@pytest.fixture
def oracle():
    return duckdb.connect()


def test_arrow_and_numpy_match_duckdb(con, oracle):
    want = oracle.sql(QUERY)
    got = con.execute(QUERY)
    table = got.fetch_arrow_table()
    assert isinstance(table, pa.Table)
    assert table.equals(want.to_arrow_table())
    assert got.arrow().equals(table)
    np_got, np_want = got.fetchnumpy(), oracle.sql(QUERY).fetchnumpy()
    assert list(np_got) == list(np_want)
    for c in np_want:
        np.testing.assert_array_equal(np_got[c], np.asarray(np_want[c]))


def test_pandas_and_polars_match_duckdb(con, oracle):
    pd = pytest.importorskip("pandas")
    want = oracle.sql(QUERY).df()
    pd.testing.assert_frame_equal(con.execute(QUERY).df(), want)
    pd.testing.assert_frame_equal(con.execute(QUERY).fetchdf(), want)
    pl = pytest.importorskip("polars")
    got = con.execute(QUERY).pl()
    assert isinstance(got, pl.DataFrame)
    assert got.to_dicts() == oracle.sql(QUERY).pl().to_dicts()


def test_rows_without_arrow_data_convert_too(con):
    """SHOW and DESCRIBE build their rows in Python; the same methods work on them."""
    con.load("A", np.ones((2, 3)))
    r = con.execute("SHOW TENSORS")
    rows = r.fetchall()
    table = con.execute("SHOW TENSORS").fetch_arrow_table()
    assert table.column_names == r.columns and table.num_rows == len(rows) == 1
    assert table.column("name").to_pylist() == ["A"]
    assert con.execute("SHOW TENSORS").fetchnumpy()["name"].tolist() == ["A"]


def test_a_tensor_result_is_the_array_and_the_relation(con, oracle):
    a = np.arange(12.0).reshape(4, 3) - 4
    a[3] = 0
    con.load("A", a)
    r = con.execute("T[i,k] = SUM(A[i,j] * A[k,j])")
    t = a @ a.T
    np.testing.assert_allclose(np.asarray(r), t)
    np.testing.assert_allclose(r.tensor(), t)
    assert np.asarray(r, dtype=np.float32).dtype == np.float32
    # its relation: one row per nonzero, as SQL shows the tensor
    rel = r.relation()
    rows = sorted(rel.fetchall())
    assert rows == [(i, k, t[i, k]) for i, k in zip(*np.nonzero(t))]
    assert sorted(r.fetchall()) == rows
    assert [d[:2] for d in r.description] == [("i", "BIGINT"), ("k", "BIGINT"), ("value", "DOUBLE")]
    # the same rows through arrow / numpy / pandas: check against DuckDB over the numpy oracle
    oracle.execute("CREATE TABLE t AS SELECT * FROM (VALUES " +
                   ", ".join(f"({i}, {k}, {float(t[i, k])!r})" for i, k in zip(*np.nonzero(t))) +
                   ") v(i, k, value)")
    want = oracle.sql("SELECT * FROM t ORDER BY i, k").fetchall()
    table = r.fetch_arrow_table().sort_by([("i", "ascending"), ("k", "ascending")])
    assert list(zip(*[table.column(c).to_pylist() for c in ("i", "k", "value")])) == want
    cols = r.fetchnumpy()
    assert sorted(zip(cols["i"].tolist(), cols["k"].tolist(), cols["value"].tolist())) == want
    pytest.importorskip("pandas")
    df = r.df().sort_values(["i", "k"])
    assert list(df.itertuples(index=False, name=None)) == want


def test_result_of_a_non_tensor_holds_no_tensor(con):
    r = con.execute("SELECT 1")
    with pytest.raises(tensordb.ProgrammingError, match="holds no tensor"):
        r.relation()


_MISSING = """
import sys


class NotInstalled:  # imports of the module fail as they do when it is not installed
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} or name.startswith({module!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


sys.meta_path.insert(0, NotInstalled())
import numpy as np, tensordb
con = tensordb.connect()
con.load("A", np.eye(2))
for method in {methods!r}:
    for what, call in [("rows", lambda: getattr(con.execute("SELECT 1 AS x"), method)()),
                       ("tensor", lambda: getattr(con.execute("B[i,j] = A[i,j] * 2"), method)()),
                       ("cursor", lambda: getattr(con.cursor().execute("SELECT 1"), method)())]:
        try:
            call()
        except tensordb.InterfaceError as exc:
            print(method, what, "|", str(exc).replace("\\n", " / "))
        else:
            print(method, what, "| no error")
"""


@pytest.mark.parametrize("module,methods,extra", [("pandas", ("df", "fetchdf"), "pandas"),
                                                  ("polars", ("pl",), "polars")])
def test_a_missing_extra_names_what_to_install(module, methods, extra):
    """Each method of a module in one child (a child per method cost ~1 s more each)."""
    code = textwrap.dedent(_MISSING.format(module=module, methods=methods))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tensordb.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line.split(" | ")[0] for line in lines] == \
        [f"{method} {what}" for method in methods for what in ("rows", "tensor", "cursor")]
    for line in lines:
        assert f"needs {module}" in line and f"pip install tensordb[{extra}]" in line, line
    assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stdout


# -- con.einsum ----------------------------------------------------------------------------------

def _payload_files(con) -> list[str]:
    return sorted(os.listdir(con.store.tiles_dir))


def _catalog(con):
    return con.tensors(), _payload_files(con)


@pytest.mark.parametrize("spec,shapes", [
    ("ij,jk->ik", [(5, 4), (4, 3)]),
    ("ij->ji", [(3, 7)]),
    ("ij,ij->", [(4, 4), (4, 4)]),
    ("i,j->ij", [(3,), (2,)]),
    ("ijk,kl->il", [(2, 3, 4), (4, 5)]),
])
def test_einsum_without_into_returns_numpys_answer_and_stores_nothing(disk_con, spec, shapes):
    con = disk_con
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in shapes]
    names = [f"X{k}" for k in range(len(arrays))]
    for n, a in zip(names, arrays):
        con.load(n, a, tile=tuple(max(1, d // 2) for d in a.shape))
    before = _catalog(con)
    got = con.einsum(spec, *names)
    want = np.einsum(spec, *arrays)
    assert type(got) is type(want)  # an array, or a numpy scalar for a result with no dims
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert _catalog(con) == before
    # and with a join/agg of our own: a min-plus product
    if spec == "ij,jk->ik":
        mp = con.einsum(spec, *names, join="x0 + x1", agg="min")
        np.testing.assert_allclose(mp, (arrays[0][:, :, None] + arrays[1][None]).min(axis=1))
        assert _catalog(con) == before


def test_einsum_without_into_on_block_sparse_input(con):
    a = np.zeros((8, 8))
    a[:2, :2] = 1.5
    con.load("S", a, tile=(2, 2))
    before = con.tensors()
    np.testing.assert_allclose(con.einsum("ij,jk->ik", "S", "S"), a @ a)
    assert con.tensors() == before


def test_einsum_into_stores_and_replaces_like_an_assignment(con):
    a = np.arange(6.0).reshape(2, 3)
    con.load("A", a)
    con.einsum("ij,kj->ik", "A", "A", into="G")
    np.testing.assert_allclose(con.tensor("G"), a @ a.T)
    # into= an existing name replaces it, as `G[i,k] = ...` does
    con.einsum("ij->ji", "A", into="G")
    np.testing.assert_allclose(con.tensor("G"), a.T)
    con.execute("G[i] = SUM(A[i,j])")
    np.testing.assert_allclose(con.tensor("G"), a.sum(axis=1))
    # replace=False refuses, and changes nothing
    before = con.tensors()
    with pytest.raises(tensordb.CatalogError, match="already exists"):
        con.einsum("ij->ji", "A", into="G", replace=False)
    assert con.tensors() == before
    # a graph run follows the same rule
    con.run(tensordb.Graph().einsum("ij->j", "A", into="G"))
    np.testing.assert_allclose(con.tensor("G"), a.sum(axis=0))
    with pytest.raises(tensordb.CatalogError, match="already exists"):
        con.run(tensordb.Graph().einsum("ij->j", "A", into="G"), replace=False)
    # a result may replace one of its own inputs
    con.einsum("ij->i", "A", into="A")
    np.testing.assert_allclose(con.tensor("A"), a.sum(axis=1))


def test_einsum_without_into_errors_change_nothing(con):
    con.load("A", np.ones((4, 3)))
    before = con.tensors()
    with pytest.raises(tensordb.BinderError, match="'j'"):
        con.einsum("ij,jk->ik", "A", "A")
    with pytest.raises(tensordb.CatalogError, match="Nope"):
        con.einsum("ij->i", "Nope")
    assert con.tensors() == before


def test_einsum_without_into_checks_memory_before_allocating(con):
    con.load("V", np.ones(256))
    con.set("memory_limit", 64 * 1024)
    before = con.tensors()
    with pytest.raises(tensordb.OutOfMemoryError, match="einsum"):
        con.einsum("i,j->ij", "V", "V")  # 512 KiB dense
    assert con.tensors() == before
