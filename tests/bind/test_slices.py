"""Slices in einsum statements (``X[i 0:100, d]``) and Python API operands (``'X[0:100, :]'``):
a box of a stored tensor, with numpy's semantics, read as an input of its own that reads only the
stored tiles the box overlaps (storage/boxes.py). Every value is checked against numpy, every
gradient against autograd."""
from __future__ import annotations

import os

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.plan.builder import Graph
from tensordb.storage import verify


@pytest.fixture
def con(disk_con):
    """The tests here run on an on-disk database (conftest's ``disk_con``)."""
    return disk_con


RNG = np.random.default_rng(7)
X = RNG.normal(size=(23, 6))
W = RNG.normal(size=(6, 4))


@pytest.mark.parametrize("text, expected", [
    ("Y[i,d] = X[i 3:17, d]", lambda: X[3:17]),
    ("Y[i,d] = X[i :5, d]", lambda: X[:5]),
    ("Y[i,d] = X[i -4:, d]", lambda: X[-4:]),
    ("Y[i,d] = X[i 2:-3, d 1:5]", lambda: X[2:-3, 1:5]),
    ("Y[i,d] = X[i :, d :]", lambda: X[:, :]),
    ("Y[i,d] = X[i -23:23, d -6:-1]", lambda: X[-23:23, -6:-1]),
    ("Y[d] = X[:10, d]", lambda: X[:10].sum(0)),                  # a bare slice is aggregated
    ("Y[i,j] = X[i :8, d] * X[j 8:, d]", lambda: X[:8] @ X[8:].T),
    ("Y[i,f] = RELU(SUM(X[i 5:12, d] * W[d,f]))", lambda: np.maximum(X[5:12] @ W, 0)),
    ("Y[i,d] = X[i 0:11, d] - X[i 12:, d] + X[i,d 0:1] * 0", lambda: X[0:11] - X[12:]),
])
def test_slice_values_match_numpy(con, text, expected):
    con.load("X", X, tile=(4, 4))  # boxes that cut tiles, cross them, and end inside them
    con.load("W", W)
    if "X[i,d 0:1]" in text:  # a label's size disagrees: i is 11, X's axis 0 is 23
        with pytest.raises(tensordb.BinderError, match="label 'i' has size 11"):
            con.execute("CREATE TENSOR " + text.replace(" = ", " AS ", 1))
        return
    con.execute("CREATE TENSOR " + text.replace(" = ", " AS ", 1))
    got, want = con.tensor("Y"), expected()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["int32", "float32", "int64", "bool"])
def test_slice_keeps_numpy_dtypes(con, dtype):
    a = (np.arange(60).reshape(10, 6) % 7).astype(dtype)
    con.load("A", a, tile=(3, 4))
    con.execute("CREATE TENSOR B[i,j] AS A[i 2:9, j 1:]")
    got = con.tensor("B")
    assert got.dtype == a[2:9, 1:].dtype
    np.testing.assert_array_equal(got, a[2:9, 1:])
    if dtype != "bool":
        con.execute("CREATE TENSOR S[j] AS A[i -5:, j] * 2")
        want = np.einsum("ij->j", a[-5:] * 2)
        assert con.tensor("S").dtype == want.dtype
        np.testing.assert_array_equal(con.tensor("S"), want)


def test_slice_over_absent_tiles_reads_zeros(con):
    a = np.zeros((12, 8))
    a[8:, :4] = RNG.normal(size=(4, 4))  # one stored tile; the others are absent
    con.load("A", a, tile=(4, 4))
    con.execute("CREATE TENSOR B[i,j] AS A[i 2:11, j 2:7]; CREATE TENSOR C[i,j] AS A[i :4, j]")
    np.testing.assert_array_equal(con.tensor("B"), a[2:11, 2:7])
    np.testing.assert_array_equal(con.tensor("C"), a[:4])


def _payload_and_offsets(con, name):
    rows = con.store.duck.execute(
        'SELECT t.coords, t.file, t."offset" FROM tensordb.tiles t JOIN tensordb.tensors m '
        "ON m.name = t.tensor AND m.version = t.version WHERE t.tensor = ?", [name]).fetchall()
    return {tuple(c): (f, o) for c, f, o in rows}


def test_a_slice_reads_only_the_tiles_it_needs(tmp_path):
    """A tile the box does not overlap is damaged (its checksum no longer matches): the slice
    still reads, and the whole tensor does not."""
    root = tmp_path / "db"
    a = RNG.normal(size=(16, 4))
    with tensordb.connect(root) as con:
        con.load("A", a, tile=(4, 4))
        tiles = _payload_and_offsets(con, "A")
    file, offset = tiles[(3, 0)]  # rows 12..16
    path = os.path.join(root, "tiles", file)
    with open(path, "r+b") as f:
        f.seek(offset + 8)
        data = f.read(4)
        f.seek(offset + 8)
        f.write(bytes(b ^ 0xFF for b in data))
    verify.forget_verified()
    with tensordb.connect(root) as con:
        con.execute("CREATE TENSOR B[i,j] AS A[i 1:12, j]")
        np.testing.assert_array_equal(con.tensor("B"), a[1:12])
        with pytest.raises(tensordb.DataError, match=r"tile \(3, 0\)"):
            con.execute("CREATE TENSOR C[i,j] AS A[i 1:13, j]")
        assert not con.store.has("C")


def test_a_repeated_statement_reads_the_new_version(con):
    """The plan cache keys a plan by its inputs' layout and rebinds it to the current versions:
    a slice of a replaced tensor reads the new values."""
    con.load("X", X, tile=(4, 4))
    con.execute("CREATE TENSOR Y[i,d] AS X[i 3:9, d]")
    con.load("X", 2 * X, tile=(4, 4), replace=True)
    con.execute("CREATE OR REPLACE TENSOR Y[i,d] AS X[i 3:9, d]")
    np.testing.assert_array_equal(con.tensor("Y"), 2 * X[3:9])


def test_mini_batch_training_step_matches_autograd(con):
    """Mini-batches of X by slices; the gradient with respect to the weights (read whole)."""
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")
    y = RNG.normal(size=(23, 4))
    con.load("X", X, tile=(5, 6))
    con.load("T", y, tile=(5, 4))
    con.load("W", W)
    w = W.copy()
    for lo, hi in ((0, 8), (8, 16), (16, 23)):
        con.execute(f"""
            LET P[b,f] = X[b {lo}:{hi}, d] * W[d,f];
            L = SUM((P[b,f] - T[b {lo}:{hi}, f]) * (P[b,f] - T[b {lo}:{hi}, f]));
            dW = GRAD(L, W);
            W[d,f] = W[d,f] - 0.01 * dW[d,f]""")
        g = autograd.grad(lambda v: anp.sum((X[lo:hi] @ v - y[lo:hi]) ** 2))(w)
        np.testing.assert_allclose(con.tensor("L"), np.sum((X[lo:hi] @ w - y[lo:hi]) ** 2),
                                   rtol=1e-10)
        np.testing.assert_allclose(con.tensor("dW"), g, rtol=1e-10)
        w = w - 0.01 * g
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-10)


def test_python_api_slices(con):
    con.load("X", X, tile=(4, 4))
    con.load("W", W)
    np.testing.assert_allclose(con.einsum("ij,jk->ik", "X[4:-3]", "W"), X[4:-3] @ W)
    con.run(Graph().einsum("ij,jk->ik", "X[:5, 1:]", "W[1:, :]", into="Y"))
    np.testing.assert_allclose(con.tensor("Y"), X[:5, 1:] @ W[1:])
    con.run(Graph().op("Z", "i", [("X[10:20]", "ij")]))
    np.testing.assert_allclose(con.tensor("Z"), X[10:20].sum(1))
    np.testing.assert_allclose(con.einsum("ij,kj->ik", "X[:2]", "X[20:]"), X[:2] @ X[20:].T)
    # a slice of the graph's own result: an operation selecting the box (plan/select.py)
    con.run(Graph().einsum("ij,jk->ik", "X", "W", into="H").einsum("ij->j", "H[:2]", into="G"))
    np.testing.assert_allclose(con.tensor("G"), (X @ W)[:2].sum(0), rtol=1e-12)


@pytest.mark.parametrize("operand, match", [
    ("X[0:30]", r"slice '0:30' is out of range for X axis 0, of size 23"),
    ("X[3:3]", r"slice '3:3' of X axis 0 \(size 23\) is empty"),
    ("X[-24:]", r"out of range"),
    ("X[0]", r"subscript '0' is not a range"),
    ("X[::2]", r"subscript '::2' is not a range"),
    ("X[:,:,:]", r"3 subscripts for X of shape \(23, 6\)"),
    ("Q[0:2]", r"unknown tensor 'Q'"),
])
def test_python_api_slice_errors(con, operand, match):
    con.load("X", X)
    with pytest.raises(tensordb.ProgrammingError, match=match) as info:
        con.einsum("ij->i", operand)
    assert "^" in str(info.value)


@pytest.mark.parametrize("text, cls, match, caret", [
    ("Y[i,d] = X[i 0:30, d]", tensordb.BinderError,
     r"slice 'i 0:30' is out of range for X axis 0, of size 23", "i 0:30"),
    ("Y[i,d] = X[i 5:5, d]", tensordb.BinderError, r"is empty: it reads 5:5", "i 5:5"),
    ("Y[i,d] = X[i 9:2, d]", tensordb.BinderError, r"is empty: it reads 9:2", "i 9:2"),
    ("Y[i,d] = X[i -30:, d]", tensordb.BinderError, r"out of range", "i -30:"),
    ("Y[i,d] = X[i, d 0:7]", tensordb.BinderError, r"out of range for X axis 1, of size 6",
     "d 0:7"),
    ("LET Q[i,d] = X[i,d] * 2; Y[i,d] = Q[i 0:30, d]", tensordb.BinderError,
     r"slice 'i 0:30' is out of range for Q axis 0, of size 23", "i 0:30"),
    ("Y[i,d] = X[i 0:3 d]", tensordb.ParserError, r"syntax error", "d]"),
])
def test_slice_errors_point_at_the_slice_and_change_nothing(con, text, cls, match, caret):
    con.load("X", X)
    before = [(t["name"], t["version"]) for t in con.tensors()]
    with pytest.raises(cls, match=match) as info:
        con.execute(text)
    lines = str(info.value).splitlines()
    src = next(l for l in lines if l.startswith("LINE"))
    marks = lines[lines.index(src) + 1]
    col = marks.index("^")
    assert src[col:].startswith(caret)
    assert [(t["name"], t["version"]) for t in con.tensors()] == before


def test_python_api_grad_with_respect_to_a_sliced_tensor(con):
    """The gradient of a box scatters into zeros of the stored tensor's shape (plan/select.py),
    added to the gradient of the tensor's whole reads."""
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")
    con.load("X", X, tile=(4, 4))
    con.load("W", W)
    g = Graph().einsum("ij,jk->ik", "X[:5]", "W", into="H").einsum("ik,ik->", "H", "H", into="L")
    con.run(g.grad("L", ["X", "W"]))
    f = lambda x, w: anp.sum((x[:5] @ w) ** 2)
    np.testing.assert_allclose(con.tensor("dX"), autograd.grad(f, 0)(X, W), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(con.tensor("dW"), autograd.grad(f, 1)(X, W), rtol=1e-12)


def test_explain_names_the_box(con):
    con.load("X", X, tile=(4, 4))
    text = con.execute("EXPLAIN CREATE TENSOR Y[i,j] AS X[i :8, d] * X[j 8:, d]").fetchall()[0][0]
    assert "X[0:8,0:6][i,d]" in text and "X[8:23,0:6][j,d]" in text


@pytest.mark.distributed
def test_slices_on_the_dask_executor(tmp_path):
    """A box reader ships to Dask workers (pickled) and reads only its box there."""
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    with local_cluster(2, local_directory=str(tmp_path / "dask")) as cluster, \
            tensordb.connect(tmp_path / "db", workers=2,
                             executor=f"dask://{cluster.scheduler_address}") as con:
        con.load("X", X, tile=(4, 4))
        con.load("W", W)
        con.execute("CREATE TENSOR Y[i,f] AS SUM(X[i 3:-5, d 1:] * W[d 1:, f])")
        np.testing.assert_allclose(con.tensor("Y"), X[3:-5, 1:] @ W[1:], rtol=1e-12)


def test_slice_of_a_sparse_tensor(con):
    sp = pytest.importorskip("scipy.sparse")
    m = sp.random(40, 30, density=0.05, random_state=3, format="csr")
    con.load("S", m, tile=(16, 16))
    v = RNG.normal(size=(30,))
    con.load("v", v)
    con.execute("CREATE TENSOR Y[i] AS SUM(S[i 5:33, j] * v[j]); CREATE TENSOR Z[i,j] AS S[i 10:20, j 3:]")
    np.testing.assert_allclose(con.tensor("Y"), m.toarray()[5:33] @ v, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(con.tensor("Z"), m.toarray()[10:20, 3:])


def test_a_statement_replacing_the_tensor_it_slices(con):
    """The result replaces the tensor whose boxes it reads (a new version; the boxes read the
    old one), repeatedly, with and without reading the tensor whole too."""
    v = np.arange(10.0)
    con.load("V", v, tile=(3,))
    q = np.arange(12.0).reshape(4, 3)
    con.load("Q", q, tile=(2, 2))
    for _ in range(3):
        con.execute("CREATE OR REPLACE TENSOR V[i] AS V[i 1:] * 2 + V[i :-1]; "
                    "Q[i,j] = Q[i,j] + SUM(Q[i,k 0:2])")
        v = v[1:] * 2 + v[:-1]
        q = q + q[:, :2].sum(1, keepdims=True)
        np.testing.assert_array_equal(con.tensor("V"), v)
        np.testing.assert_array_equal(con.tensor("Q"), q)


def test_a_sliced_label_has_one_size(con):
    con.load("Q", np.ones((4, 3)))
    with pytest.raises(tensordb.BinderError,
                       match=r"label 'j' has size 3 in Q axis 1 but 1 in the slice Q\[j 0:1\]"):
        con.execute("Q[i,j] = Q[i,j] + Q[i,j 0:1]")


def test_a_let_may_slice_a_stored_tensor(con):
    con.load("X", X, tile=(4, 4))
    con.load("W", W)
    con.execute("LET Xb[b,d] = X[b 4:12, d]; CREATE TENSOR H[b,f] AS SUM(Xb[b,d] * W[d,f])")
    np.testing.assert_allclose(con.tensor("H"), X[4:12] @ W, rtol=1e-12)
    con.execute("CREATE TENSOR H2[b,f] AS SUM(Xb[b,d] * W[d,f]) + X[b 4:12, f 0:4]")  # used again
    np.testing.assert_allclose(con.tensor("H2"), X[4:12] @ W + X[4:12, :4], rtol=1e-12)
