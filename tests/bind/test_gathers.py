"""Gathers in einsum statements, ``E[tok[b,t], d]`` (an embedding lookup): the rows of a stored
tensor that a stored integer tensor's values select, numpy's ``E[tok]``, read by a join of the
index's values with the stored row tiles (storage/boxes.py). Checked against numpy."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb.storage import verify


@pytest.fixture
def con(disk_con):
    """The tests here run on an on-disk database (conftest's ``disk_con``)."""
    return disk_con


RNG = np.random.default_rng(11)
E = RNG.normal(size=(50, 4))


@pytest.mark.parametrize("idtype", ["int32", "int64"])
def test_gather_matches_numpy(con, idtype):
    tok = RNG.integers(0, 50, size=(3, 7)).astype(idtype)
    con.load("E", E, tile=(8, 3))
    con.load("tok", tok, tile=(2, 4))
    con.execute("CREATE TENSOR Y[b,t,d] AS E[tok[b,t], d]")
    got = con.tensor("Y")
    assert got.dtype == E[tok].dtype
    np.testing.assert_array_equal(got, E[tok])


def test_gather_in_an_expression_and_negative_rows(con):
    tok = np.array([[0, -1, 49], [-50, 7, 7]], dtype=np.int64)  # numpy: -1 is the last row
    w = RNG.normal(size=(4, 2))
    con.load("E", E, tile=(8, 4))
    con.load("tok", tok)
    con.load("W", w)
    con.execute("CREATE TENSOR H[b,f] AS RELU(SUM(E[tok[b,t], d] * W[d,f]))")
    np.testing.assert_allclose(con.tensor("H"), np.maximum(np.einsum("btd,df->bf", E[tok], w), 0),
                               rtol=1e-12)


def test_gather_with_an_int_tensor_of_one_dimension(con):
    ids = np.array([5, 3, 5, 0], dtype=np.int32)
    con.load("E", E.astype(np.float32), tile=(16, 4))
    con.load("ids", ids)
    con.execute("CREATE TENSOR R[n,d] AS E[ids[n], d] * 2")
    got = con.tensor("R")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, E.astype(np.float32)[ids] * 2)


def test_a_gather_reads_only_the_row_tiles_it_names(tmp_path):
    root = tmp_path / "db"
    with tensordb.connect(root) as con:
        con.load("E", E, tile=(10, 4))
        rows = con.store.duck.execute(
            'SELECT t.coords, t.file, t."offset" FROM tensordb.tiles t JOIN tensordb.tensors m '
            "ON m.name = t.tensor AND m.version = t.version WHERE t.tensor = 'E'").fetchall()
        con.load("ok", np.array([1, 12, 3], dtype=np.int64))
        con.load("far", np.array([1, 45], dtype=np.int64))
    file, offset = {tuple(c): (f, o) for c, f, o in rows}[(4, 0)]  # rows 40..50
    with open(os.path.join(root, "tiles", file), "r+b") as f:
        f.seek(offset + 8)
        data = f.read(4)
        f.seek(offset + 8)
        f.write(bytes(b ^ 0xFF for b in data))
    verify.forget_verified()
    with tensordb.connect(root) as con:
        con.execute("CREATE TENSOR G[n,d] AS E[ok[n], d]")
        np.testing.assert_array_equal(con.tensor("G"), E[[1, 12, 3]])
        with pytest.raises(tensordb.DataError, match=r"tile \(4, 0\)"):
            con.execute("CREATE TENSOR F[n,d] AS E[far[n], d]")


def test_out_of_range_index_is_a_data_error_and_changes_nothing(con):
    con.load("E", E)
    con.load("bad", np.array([[1, 60]], dtype=np.int32))
    before = [(t["name"], t["version"]) for t in con.tensors()]
    with pytest.raises(tensordb.DataError,
                       match=r"index bad\[0, 1\] = 60 is out of range for the 50 rows of E"):
        con.execute("CREATE TENSOR Y[b,t,d] AS E[bad[b,t], d]")
    assert [(t["name"], t["version"]) for t in con.tensors()] == before


@pytest.mark.parametrize("text", [
    "LET D2[k,d] = E[k,d] + 1; CREATE OR REPLACE TENSOR Y[n,d] AS D2[idx[n], d];",
    "BEGIN; CREATE OR REPLACE TENSOR E[k,d] AS E[k,d] + 1; "
    "CREATE OR REPLACE TENSOR Y[n,d] AS E[idx[n], d]; COMMIT;",
])
def test_a_gather_of_a_computed_tensor_out_of_range_is_a_data_error_and_changes_nothing(con, text):
    """A gather of a LET or of an earlier result in the same unit (an equality join with the
    index's one-hot rows, read sparse): an index out of range is numpy's IndexError, not a
    row of zeros."""
    con.load("E", E)
    con.load("idx", np.array([3, 10**6, -2]))
    before = [(t["name"], t["version"]) for t in con.tensors()]
    with pytest.raises(tensordb.DataError, match=r"index idx\[1\] = 1000000 is out of range"):
        con.execute(text)
    assert [(t["name"], t["version"]) for t in con.tensors()] == before
    np.testing.assert_array_equal(con.tensor("E"), E)


@pytest.mark.parametrize("text, cls, match, caret", [
    ("Y[b,d] = E[W[b,d], d]", tensordb.BinderError, "the index tensor W of a gather is float64",
     "W[b,d]"),
    ("Y[b,d] = E[tok[b], d]", tensordb.BinderError,
     r"the index tensor tok has 2 dimension\(s\) but is indexed with 1 label", "tok[b]"),
    ("Y[b,t,d] = E[tok[b,t], d 0:2]", tensordb.NotSupportedError,
     "a slice next to a gather is not supported", "d 0:2"),
    ("Y[b,d] = E[d, tok[b,t]]", tensordb.ParserError, "must be the first subscript", "tok[b,t]"),
    ("LET Z[b,t] = tok[b,t]; Y[b,t,d] = E[Z[b,t], d]", tensordb.BinderError,
     "cannot gather with 'Z': it is a LET", "E[Z"),
    ("Y[b,t,d] = E[tok[b,t], d]; L = SUM(Y[b,t,d]); dt = GRAD(L, tok)", tensordb.BinderError,
     r"GRAD with respect to 'tok', the index of the gather E\[tok\]: an index has no gradient",
     "tok)"),
    ("Y[b,t,d] = E[nope[b,t], d]", tensordb.CatalogError, "unknown tensor 'nope'", "nope"),
])
def test_gather_errors(con, text, cls, match, caret):
    con.load("E", E)
    con.load("W", np.ones((3, 4)))
    con.load("tok", np.zeros((3, 5), dtype=np.int32))
    before = [(t["name"], t["version"]) for t in con.tensors()]
    with pytest.raises(cls, match=match) as info:
        con.execute(text)
    lines = str(info.value).splitlines()
    src = next(l for l in lines if l.startswith("LINE"))
    col = lines[lines.index(src) + 1].index("^")
    assert src[col:].startswith(caret)
    assert [(t["name"], t["version"]) for t in con.tensors()] == before


def test_a_bool_index_is_refused(con):
    con.load("E", E)
    con.load("m", np.array([True, False]))
    with pytest.raises(tensordb.BinderError, match="the index tensor m of a gather is bool"):
        con.execute("CREATE TENSOR Y[n,d] AS E[m[n], d]")


def test_a_repeated_gather_reads_the_new_index(con):
    """The plan cache keys the plan by layout, and the reader of the new index is rebound."""
    con.load("E", E, tile=(8, 4))
    con.load("tok", np.array([1, 2, 3], dtype=np.int64))
    con.execute("CREATE TENSOR Y[n,d] AS E[tok[n], d]")
    con.load("tok", np.array([40, 0, 9], dtype=np.int64), replace=True)
    con.execute("CREATE OR REPLACE TENSOR Y[n,d] AS E[tok[n], d]")
    np.testing.assert_array_equal(con.tensor("Y"), E[[40, 0, 9]])


@pytest.mark.distributed
def test_gathers_on_the_dask_executor(tmp_path):
    """A gather's reader ships to Dask workers (pickled) and joins there."""
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    tok = RNG.integers(-50, 50, size=(4, 6))
    with local_cluster(2, local_directory=str(tmp_path / "dask")) as cluster, \
            tensordb.connect(tmp_path / "db", workers=2,
                             executor=f"dask://{cluster.scheduler_address}") as con:
        con.load("E", E, tile=(8, 4))
        con.load("tok", tok, tile=(2, 3))
        con.execute("CREATE TENSOR Y[b,t,d] AS E[tok[b,t], d] WITH (PIECES b 2)")
        np.testing.assert_array_equal(con.tensor("Y"), E[tok])


def test_python_api_gathers(con):
    from tensordb.plan.builder import Graph
    tok = RNG.integers(0, 50, size=(3, 4))
    w = RNG.normal(size=(4, 2))
    con.load("E", E, tile=(8, 4))
    con.load("tok", tok)
    con.load("W", w)
    np.testing.assert_allclose(con.einsum("btd,df->btf", "E[tok]", "W"), E[tok] @ w, rtol=1e-12)
    con.run(Graph().einsum("btd->bd", "E[tok]", into="Bag"))
    np.testing.assert_allclose(con.tensor("Bag"), E[tok].sum(1), rtol=1e-12)
    with pytest.raises(tensordb.BinderError, match="the index tensor W of a gather is float64"):
        con.einsum("nd->n", "E[W]")
    g = Graph().einsum("btd,df->btf", "E[tok]", "W", into="H").einsum("btf->", "H", into="L")
    con.run(g.grad("L", ["E", "W"]))  # a gather's gradient: a scatter-add over the rows
    autograd = pytest.importorskip("autograd")
    f = lambda e, v: (e[tok] @ v).sum()
    np.testing.assert_allclose(con.tensor("dE"), autograd.grad(f, 0)(E, w), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("dW"), autograd.grad(f, 1)(E, w), rtol=1e-12)
    with pytest.raises(tensordb.BinderError, match="grad with respect to 'tok', the index"):
        con.run(g.grad("L", ["tok"]))
