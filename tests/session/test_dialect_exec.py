"""Running dialect statements end to end: results against numpy, atomicity, blocks, LETs, SQL."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tensordb
from tensordb.errors import (BinderError, CatalogError, Error, NotSupportedError, ParserError,
                             ProgrammingError)


@pytest.fixture
def db(con):
    rng = np.random.default_rng(0)
    con.load("A", rng.standard_normal((5, 4)))
    con.load("B", rng.standard_normal((4, 3)))
    con.load("bias", rng.standard_normal(3))
    con.load("D", rng.random((6, 6)))
    return con


def state(con):
    """Every tensor's name, shape and contents: equal before and after means nothing changed."""
    return {t["name"]: con.tensor(t["name"]).tolist() for t in con.tensors()}


def test_matmul_forms_agree_with_numpy(db):
    A, B = db.tensor("A"), db.tensor("B")
    for stmt in ("C[i,k] = SUM(A[i,j] * B[j,k])", "C[i,k] = A[i,j] * B[j,k]",
                 "C = EINSUM('ij,jk->ik', A, B)"):
        r = db.execute(stmt)
        assert r.kind == "tensor" and r.name == "C" and r.shape == (5, 3)
        assert np.allclose(r.tensor(), A @ B)


def test_mlp_layer_nested_aggregate(db):
    r = db.execute("H[b,f] = RELU(SUM(A[b,h] * B[h,f]) + bias[f])")
    expect = np.maximum(db.tensor("A") @ db.tensor("B") + db.tensor("bias"), 0)
    assert np.allclose(r.tensor(), expect)
    assert "H.t1" not in {t["name"] for t in db.tensors()}


def test_reductions_and_scalars(db):
    A = db.tensor("A")
    db.execute("M[i] = MAX(A[i,j]); mn[j] = MIN(A[i,j]); s = SUM(A[i,j] * A[i,j]); p[i] = PROD(A[i,j])")
    assert np.allclose(db.tensor("M"), A.max(1))
    assert np.allclose(db.tensor("mn"), A.min(0))
    assert np.allclose(db.tensor("s"), (A * A).sum())
    assert np.allclose(db.tensor("p"), A.prod(1))


def test_min_plus_and_softmax(db):
    D, A = db.tensor("D"), db.tensor("A")
    db.execute("P[i,j] = MIN(D[i,k] + D[k,j])")
    assert np.allclose(db.tensor("P"), (D[:, :, None] + D[None, :, :]).min(1))
    db.execute("""
        LET E[i,j] = EXP(A[i,j] - MAX(A[i,k]));
        S[i,j] = E[i,j] / SUM(E[i,k])""")
    e = np.exp(A - A.max(1, keepdims=True))
    assert np.allclose(db.tensor("S"), e / e.sum(1, keepdims=True))
    assert not db.store.has("E")


def test_elementwise_functions(db):
    A = db.tensor("A")
    db.execute("Y[i,j] = SIGMOID(A[i,j]) + TANH(A[i,j]) * SQUARE(A[i,j]) - ABS(A[i,j]) / 2 "
               "+ POW(A[i,j], 2) + MAX(A[i,j], 0) + MIN(A[i,j], 0) + COS(A[i,j]) - SIN(A[i,j]) "
               "+ SQRT(ABS(A[i,j])) + LOG(1 + ABS(A[i,j]))")
    expect = (1 / (1 + np.exp(-A)) + np.tanh(A) * A ** 2 - abs(A) / 2 + A ** 2 + np.maximum(A, 0)
              + np.minimum(A, 0) + np.cos(A) - np.sin(A) + np.sqrt(abs(A)) + np.log(1 + abs(A)))
    assert np.allclose(db.tensor("Y"), expect)


def test_numpy_einsum_semantics_with_ellipsis(con):
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
    con.load("X", X)
    con.load("Y", Y)
    for spec in ("...ij,...jk->...ik", "bij,bjk", "ijk->", "ijk->kji", "...k->..."):
        ops = ["X", "Y"] if "," in spec else ["X"]
        con.execute(f"Z = EINSUM('{spec}', {', '.join(ops)})")
        assert np.allclose(con.tensor("Z"), np.einsum(spec, *[X, Y][:len(ops)])), spec


def test_plain_assignment_replaces_create_does_not(db):
    db.execute("C[i,k] = A[i,j] * B[j,k]")
    db.execute("C[i] = bias[i] * 2")
    assert db.tensor("C").shape == (3,)
    with pytest.raises(CatalogError, match="already exists") as info:
        db.execute("CREATE TENSOR C[i] AS bias[i]")
    assert "CREATE OR REPLACE" in str(info.value)
    db.execute("CREATE OR REPLACE TENSOR C[i] AS bias[i] + 1")
    assert np.allclose(db.tensor("C"), db.tensor("bias") + 1)


def test_self_update_and_reassignment_in_one_group(db):
    D = db.tensor("D")
    db.execute("D[i,j] = MIN(D[i,k] + D[k,j]); D[i,j] = MIN(D[i,k] + D[k,j])")
    step = lambda M: (M[:, :, None] + M[None, :, :]).min(1)  # noqa: E731
    assert np.allclose(db.tensor("D"), step(step(D)))
    names = {t["name"] for t in db.tensors()}
    assert not any(n.startswith("__") or "." in n for n in names)


def test_statements_in_one_call_see_each_other(db):
    db.execute("T[i,k] = A[i,j] * B[j,k]; U[i] = SUM(T[i,k]); CREATE TENSOR V AS EINSUM('i->', U)")
    assert np.allclose(db.tensor("V"), (db.tensor("A") @ db.tensor("B")).sum())


def test_nothing_stored_when_a_later_statement_fails(db):
    before = state(db)
    with pytest.raises(CatalogError):
        db.execute("C[i,k] = A[i,j] * B[j,k]; CREATE TENSOR Z (i 3); Q[i] = NOPE[i]")
    assert state(db) == before
    # a failure in the engine, after other statements ran: everything is undone
    db.execute("CREATE TABLE t AS SELECT 1 AS x")
    with pytest.raises(Error):
        db.execute("CREATE TENSOR Z (i 3); INSERT INTO t VALUES (2); SELECT * FROM no_such_table")
    assert state(db) == before
    assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_begin_commit_across_calls(db):
    before = state(db)
    assert db.execute("BEGIN").message == "BEGIN"
    assert db.execute("C[i,k] = A[i,j] * B[j,k]").message == "queued until COMMIT"
    db.execute("s = SUM(C[i,k])")
    assert state(db) == before
    db.execute("COMMIT")
    assert np.allclose(db.tensor("s"), (db.tensor("A") @ db.tensor("B")).sum())


def test_rollback_and_failed_blocks(db):
    before = state(db)
    db.execute("BEGIN; C[i,k] = A[i,j] * B[j,k]; ROLLBACK")
    assert state(db) == before
    db.execute("BEGIN")
    db.execute("C[i,k] = A[i,j] * B[j,k]")
    with pytest.raises(ParserError):
        db.execute("D[i = 1")
    with pytest.raises(ProgrammingError, match="aborted"):
        db.execute("COMMIT")
    assert state(db) == before
    with pytest.raises(ProgrammingError, match="no transaction"):
        db.execute("COMMIT")
    with pytest.raises(ProgrammingError, match="already open"):
        db.execute("BEGIN; BEGIN")
    db.execute("ROLLBACK")


def test_block_failing_at_commit_stores_nothing(db):
    before = state(db)
    db.execute("BEGIN; C[i,k] = A[i,j] * B[j,k]")
    db.execute("CREATE TENSOR C2 (i 2)")
    db.execute("X[i] = C2[i] + missing[i]")
    with pytest.raises(CatalogError, match="missing"):
        db.execute("COMMIT")
    assert state(db) == before


def test_let_persists_in_the_session_and_can_be_dropped(db):
    db.execute("LET T[i,k] = A[i,j] * B[j,k]")
    r = db.execute("DESCRIBE T")
    assert ("shape", (5, 3)) in r.fetchall()
    db.execute("U[i,k] = T[i,k] + 1")
    assert np.allclose(db.tensor("U"), db.tensor("A") @ db.tensor("B") + 1)
    with pytest.raises(BinderError, match="LET"):
        db.execute("T[i] = bias[i]")
    db.execute("DROP TENSOR T")
    with pytest.raises(CatalogError, match="unknown tensor 'T'"):
        db.execute("U2[i,k] = T[i,k]")


def test_let_defined_in_a_failed_call_is_forgotten(db):
    with pytest.raises(CatalogError):
        db.execute("LET T[i,k] = A[i,j] * B[j,k]; X[i] = nope[i]")
    with pytest.raises(CatalogError, match="unknown tensor 'T'"):
        db.execute("U[i,k] = T[i,k]")


def test_create_tensor_is_sparse_zeros(con):
    r = con.execute("CREATE TENSOR A (i 4096, k 1024) FLOAT32 TILE (i 512, k 1024)")
    assert r.kind == "status"
    info = con.describe("A")
    assert info["shape"] == (4096, 1024) and info["dtype"] == "float32"
    assert info["dims"] == ("i", "k") and info["tile_shape"] == (512, 1024)
    assert info["tile_count"] == 0 and info["bytes"] == 0
    con.execute("CREATE TENSOR z (3, 2) INT64")
    assert con.tensor("z").tolist() == [[0, 0], [0, 0], [0, 0]]
    assert con.execute("CREATE TENSOR IF NOT EXISTS z (5)").message.endswith("nothing done")
    con.execute("CREATE OR REPLACE TENSOR z (5) DOUBLE")
    assert con.tensor("z").shape == (5,)


def test_create_tensor_is_storages_one_call(con):
    """CREATE TENSOR and storage.arrays.create_zeros make the same tensor: zeros, no tile, the
    default tile shape when none is given; a taken name is refused and left as it was."""
    import pathlib
    from tensordb.geometry import default_tile_shape
    from tensordb.storage.arrays import create_zeros
    con.execute("CREATE TENSOR s (i 300, j 5000) INT32")
    meta = create_zeros(con.store, "t", (300, 5000), "int32", dims=("i", "j"))
    for name in ("s", "t"):
        info = con.describe(name)
        assert info["tile_shape"] == default_tile_shape((300, 5000), np.dtype("int32"))
        assert info["dims"] == ("i", "j") and info["tile_count"] == 0 and info["bytes"] == 0
        np.testing.assert_array_equal(con.tensor(name), np.zeros((300, 5000), np.int32))
    assert meta.tile_count == 0 and meta.shape == (300, 5000)
    con.load("u", np.arange(6.0))
    with pytest.raises(CatalogError, match="already exists"):
        create_zeros(con.store, "u", (4,), "float64")
    np.testing.assert_array_equal(con.tensor("u"), np.arange(6.0))
    create_zeros(con.store, "u", (2, 2), "bool", tile=(1, 2), replace=True)
    assert con.describe("u")["tile_shape"] == (1, 2) and not con.tensor("u").any()
    # Outside storage and the loaders (formats/), only the sink of a run's outputs
    # (physical.CatalogSink) drives a writer.
    root = pathlib.Path(tensordb.__file__).parent
    drivers = {str(p.relative_to(root)) for p in root.rglob("*.py")
               if ".writer(" in p.read_text() and p.parent.name not in ("storage", "formats")}
    assert drivers == {"physical/sink.py"}


@pytest.mark.parametrize("text, cls, shown", [
    ("CREATE TENSOR q (i 3) FLOAT16", BinderError, "FLOAT16"),
    ("CREATE TENSOR q (i 3, 4)", BinderError, "4"),
    ("CREATE TENSOR q (i 3) BIT", BinderError, "BIT"),
    ("CREATE TENSOR q (i 3, i 4)", BinderError, "i 4"),
    ("CREATE TENSOR q (i 3) TILE (j 2)", BinderError, "j 2"),
    ("CREATE TENSOR q (3, 4) TILE (i 2)", BinderError, "i 2"),
    ("CREATE TENSOR q (3, 4) TILE (2)", BinderError, "2"),
])
def test_create_errors(con, text, cls, shown):
    with pytest.raises(cls) as info:
        con.execute(text)
    e = info.value
    assert text[e.span.start:e.span.end] == shown
    assert not con.tensors()


def test_load_copy_round_trip(con, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = np.arange(12, dtype="float32").reshape(3, 4)
    con.load("X", x)
    for ext in ("npy", "parquet", "csv"):
        con.execute(f"COPY X TO 'x.{ext}'")
    con.execute("LOAD TENSOR Y FROM 'x.npy' TILE (2, 4)")
    assert con.describe("Y")["tile_shape"] == (2, 4)
    np.savez("x.npz", first=x, second=x * 2)
    con.execute("LOAD TENSOR Z (r, c) FROM 'x.npz' ARRAY 'second' TILE (r 1, c 4)")
    assert np.array_equal(con.tensor("Z"), x * 2) and con.describe("Z")["dims"] == ("r", "c")
    con.execute("LOAD TENSOR P FROM 'x.parquet' INDEX (i, j) VALUE value SHAPE (3, 4)")
    assert np.array_equal(con.tensor("P"), x)
    con.execute("CREATE OR REPLACE TENSOR P FROM 'x.csv' INDEX (i, j) VALUE value")
    assert np.array_equal(con.tensor("P")[:, 1:], x[:, 1:])  # the all-zero first cell is absent
    with pytest.raises(CatalogError, match="already exists"):
        con.execute("LOAD TENSOR P FROM 'x.npy'")
    with pytest.raises(Error) as info:
        con.execute("LOAD TENSOR Q FROM 'missing.npy'")
    assert info.value.span is not None


def test_create_from_query_and_table(con):
    con.execute("CREATE TABLE ratings AS SELECT u, i, (u * 10 + i)::DOUBLE AS r "
                "FROM range(4) t1(u), range(3) t2(i) WHERE (u + i) % 2 = 0")
    con.execute("CREATE TENSOR R FROM (SELECT u, i, r FROM ratings) INDEX (u, i) VALUE r SHAPE (4, 3)")
    expect = np.zeros((4, 3))
    for u in range(4):
        for i in range(3):
            if (u + i) % 2 == 0:
                expect[u, i] = u * 10 + i
    assert np.array_equal(con.tensor("R"), expect) and con.describe("R")["dims"] == ("u", "i")
    con.execute("CREATE TENSOR R2 FROM ratings INDEX (u, i) VALUE r")
    assert np.array_equal(con.tensor("R2"), expect)
    con.execute("CREATE TENSOR M FROM (SELECT 1.0 AS a, 2.0 AS b UNION ALL SELECT 3.0, 4.0)")
    assert sorted(con.tensor("M").ravel().tolist()) == [1, 2, 3, 4]


def test_tensors_are_relations_in_sql(db):
    r = db.execute("SELECT count(*) AS n, sum(value) AS total FROM A")
    assert r.columns == ["n", "total"]
    n, total = r.fetchone()
    assert n == 20 and np.isclose(total, db.tensor("A").sum())


def test_result_api(db):
    r = db.execute("SELECT range AS x, range * 2.5 AS y FROM range(3)")
    assert r.kind == "rows" and r.rowcount == 3
    assert [d[0] for d in r.description] == ["x", "y"]
    assert r.fetchone() == (0, 0.0) and r.fetchmany(1) == [(1, 2.5)] and r.fetchall() == [(2, 5.0)]
    cols = r.fetchnumpy()
    assert cols["x"].tolist() == [0, 1, 2]
    assert r.arrow().num_rows == 3
    assert "x" in str(r) and "3 rows" in str(r)
    t = db.execute("C[i,k] = A[i,j] * B[j,k]")
    assert repr(t).startswith("<Result tensor C") and "C: float64 (5, 3)" in str(t)
    assert np.asarray(t).shape == (5, 3)
    with pytest.raises(ProgrammingError):
        r.tensor()


def test_show_describe_set(db):
    names = [row[0] for row in db.execute("SHOW TENSORS").fetchall()]
    assert names == [t["name"] for t in db.tensors()]
    db.execute("SET workers = 3")
    db.execute("SET memory_limit = '2GB'")
    assert db.settings.workers == 3 and db.settings.memory_limit == 2 * 10 ** 9
    assert db.execute("SHOW workers").fetchall() == [("workers", 3)]
    assert {row[0] for row in db.execute("SHOW ALL").fetchall()} >= {"workers", "memory_limit", "executor"}
    with pytest.raises(ProgrammingError):
        db.execute("SET workers = 0")
    desc = dict(db.execute("DESCRIBE A").fetchall())
    assert desc["shape"] == (5, 4)
    db.execute("SET threads = 1")  # not ours: DuckDB's setting


def test_describe_copy_drop_fall_back_to_sql_for_tables(con, tmp_path):
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    assert ("x",) == con.execute("DESCRIBE t").fetchone()[:1]
    out = tmp_path / "t.csv"
    con.execute(f"COPY t TO '{out}'")
    assert out.exists()
    with pytest.raises(CatalogError):
        con.execute("DROP TENSOR t")


def test_duckdb_errors_are_tensordb_errors(con):
    with pytest.raises(ParserError) as info:
        con.execute("SELECT 1;\nSELEC 2")
    assert "LINE 2: SELEC 2" in str(info.value)
    with pytest.raises(CatalogError) as info:
        con.execute("SELECT * FROM nowhere")
    assert info.value.statement is not None
    with pytest.raises(Error):
        con.execute("SELECT 'a'::INTEGER")


def test_parameters_for_plain_sql(db):
    assert db.execute("SELECT ? + 1 AS x", [41]).fetchall() == [(42,)]
    assert db.execute("SELECT count(*) FROM A WHERE value > ?", [100.0]).fetchone() == (0,)
    with pytest.raises(ProgrammingError, match="the statements have none"):
        db.execute("C[i] = bias[i]", [1])  # einsum statements take them: tests/ml/test_ml_params.py
    with pytest.raises(NotSupportedError):  # one plain SQL statement, or einsum statements
        db.execute("C[i] = bias[i] * ?; SELECT ?", [1, 2])


def test_empty_and_comment_only(con):
    assert con.execute("").kind == "status"
    assert con.execute("-- nothing\n;").kind == "status"
    with pytest.raises(ProgrammingError):
        con.execute(42)


def test_names_are_case_insensitive_like_sql(db):
    db.execute("c2[i,k] = a[i,j] * b[j,k]")
    assert np.allclose(db.tensor("C2"), db.tensor("A") @ db.tensor("B"))


def test_hints_reach_the_plan(db):
    text = db.explain("C[i,k] = A[i,j] * B[j,k] WITH (PIECES i 5)", format="json")
    plan = json.loads(text)
    node = next(n for n in plan["nodes"] if n["output"] == "C")
    assert node["pieces"]["i"] == 5


def test_explain_statement_and_method(db):
    r = db.execute("EXPLAIN C[i,k] = A[i,j] * B[j,k]")
    assert r.kind == "explain" and "C" in r.text
    assert not db.store.has("C")
    plan = json.loads(db.execute("EXPLAIN (FORMAT JSON) C[i,k] = A[i,j] * B[j,k]").text)
    assert plan["nodes"] and "total" in plan
    text = db.explain("T[i,k] = A[i,j] * B[j,k]; U[i] = SUM(T[i,k])")
    assert "T" in text and "U" in text
    analyzed = db.execute("EXPLAIN ANALYZE C[i,k] = A[i,j] * B[j,k]")
    assert analyzed.kind == "explain"
    assert "SEQ_SCAN" in db.explain("SELECT * FROM range(3)").upper().replace(" ", "_") or \
        db.explain("SELECT * FROM range(3)")


def test_explain_errors_have_carets(db):
    with pytest.raises(CatalogError) as info:
        db.execute("EXPLAIN C[i,k] = A[i,j] * Nope[j,k]")
    assert info.value.span is not None
    with pytest.raises(ProgrammingError):
        db.explain("SHOW TENSORS")
    with pytest.raises(ProgrammingError):
        db.explain("C[i] = bias[i]", format="xml")


def test_tensordb_connection_methods_still_work_alongside(db):
    db.execute("C[i,k] = A[i,j] * B[j,k]")
    db.einsum("ij->ji", "C", into="Ct")
    assert np.allclose(db.execute("CT2[k,i] = Ct[k,i] * 1").tensor(), db.tensor("C").T)


def test_read_only_database_allows_queries(tmp_path):
    path = tmp_path / "ro.tdb"
    with tensordb.connect(path) as c:
        c.execute("CREATE TENSOR A (i 3); CREATE TABLE t AS SELECT 1 AS x")
    with tensordb.connect(path, read_only=True) as c:
        # no writer is open: the user's tables are read from catalog.duckdb (readview.py)
        assert c.execute("SELECT * FROM t").fetchall() == [(1,)]
        assert c.execute("SELECT count(*) FROM A").fetchall() == [(0,)]
        assert c.execute("SHOW TENSORS").rowcount == 1
        with pytest.raises(Error):
            c.execute("B[i] = A[i] + 1")


def test_show_tensor_describe_unknown_and_explain_let(db):
    assert dict(db.execute("SHOW TENSOR A").fetchall())["shape"] == (5, 4)
    with pytest.raises(CatalogError, match="no tensor or table named 'nothing'") as info:
        db.execute("DESCRIBE nothing")
    assert info.value.span.start == len("DESCRIBE ")
    with pytest.raises(CatalogError, match="no tensor or table"):
        db.execute("COPY nothing TO 'x.csv'")
    assert "H" in db.execute("EXPLAIN LET H[i,k] = A[i,j] * B[j,k]").text
    with pytest.raises(ProgrammingError, match="LET"):
        db.execute("EXPLAIN ANALYZE LET H[i,k] = A[i,j] * B[j,k]")
    with pytest.raises(ProgrammingError) as info:
        db.execute("LOAD TENSOR X FROM 'data.xyz'")
    assert "FORMAT" in info.value.hint


def test_sql_statements_that_only_count_rows_are_statuses(con):
    r = con.execute("CREATE TABLE t AS SELECT * FROM range(5)")
    assert (r.kind, r.message, r.rowcount) == ("status", "CREATE TABLE: 5 rows", 5)
    r = con.execute("INSERT INTO t VALUES (7), (8)")
    assert (r.message, r.rowcount) == ("INSERT: 2 rows", 2)
    assert con.execute("DROP TABLE t").message == "DROP TABLE"
    assert con.execute("SELECT 1 AS Count").kind == "rows"


def test_large_tensors_print_from_their_corners(con):
    a = np.arange(40 * 30, dtype="float64").reshape(40, 30)
    con.load("A", a, tile=(8, 8))
    r = con.execute("B[i,j] = A[i,j] * 1")
    full = np.array2string(a, threshold=0, edgeitems=3, max_line_width=100, precision=6,
                           suppress_small=True)
    assert r.preview(max_elements=10) == full
    assert "..." in r.preview()  # small enough to read whole; numpy elides it all the same


def test_plain_sql_errors_point_at_the_name_duckdb_names():
    with tensordb.connect() as con:
        with pytest.raises(tensordb.BinderError) as err:
            con.execute("SELECT nosuchcol FROM range(3)")
        assert err.value.span.start == len("SELECT ")
        with pytest.raises(tensordb.CatalogError) as err:
            con.execute("SELECT * FROM nosuchtable")
        assert err.value.span.start == len("SELECT * FROM ")


def test_an_unknown_tensors_hint_lists_stored_and_computed_names_as_spelled(con):
    """The hint after an unknown name lists the stored tensors, then (apart) what the group
    computed so far: once "stored tensors: A, B, l", a result of this group lowercased and
    called stored."""
    con.load("A", np.ones((2, 2)))
    con.load("B", np.ones(2))
    with pytest.raises(CatalogError) as info:
        con.execute("LET Q = SUM(A[i,j]); L = SUM(A[i,j]); dA = GRAD(L, Zzz)")
    assert info.value.hint == "stored tensors: A, B; computed in this group: Q, L"
    assert not con.store.has("L")
    with pytest.raises(CatalogError) as info:
        con.execute("X[i] = SUM(A[i,j]); Y = SUM(X[i] * Bb[i])")
    assert info.value.hint == "did you mean 'B'?"


def test_hints_say_what_to_do_for_a_negative_integer_power_and_an_object_npy(con, tmp_path):
    """An integer to a negative power is refused as NumPy refuses it, with a hint that works
    (once about bools); an object .npy's hint lists every supported dtype (once without bool)."""
    con.load("N", np.array([1, 2, 4], np.int64))
    with pytest.raises(BinderError) as info:
        con.execute("R[i] = POW(N[i], -1)")
    assert info.value.hint == "make the base a float first: POW(x * 1.0, -1)"
    con.execute("R[i] = POW(N[i] * 1.0, -1)")  # the hint's way
    np.testing.assert_array_equal(con.tensor("R"), np.power(np.array([1, 2, 4]) * 1.0, -1))
    path = tmp_path / "o.npy"
    np.save(path, np.array([1, "a"], object), allow_pickle=True)
    with pytest.raises(tensordb.DataError) as info:
        con.execute(f"LOAD TENSOR O FROM '{path}'")
    assert info.value.hint == "supported dtypes: bool, float32, float64, int32, int64"


@pytest.mark.parametrize("text,fn", [("C[i] = SUM()", "SUM"), ("C[i] = N[i] + PROD()", "PROD")])
def test_an_empty_aggregate_is_named_before_the_labels_it_leaves_unused(con, text, fn):
    """C[i] = SUM() said that label i appears nowhere on the right; the mistake is the SUM."""
    con.load("N", np.ones(3))
    with pytest.raises(BinderError) as info:
        con.execute(text)
    assert f"{fn} takes one argument, got 0" in str(info.value)
    assert not con.store.has("C")


@pytest.mark.parametrize("name", ["call", "pragma", "values", "pivot", "summarize", "table"])
def test_a_tensor_named_by_an_unreserved_word_can_be_assigned(con, name):
    """Only SELECT, which DuckDB reserves, begins SQL that looks like an assignment
    (SELECT [1, 2]); a tensor named by an unreserved word is assigned as any other."""
    con.load("A", np.ones(3))
    con.execute(f"{name}[i] = A[i] * 2")
    np.testing.assert_array_equal(con.tensor(name), [2.0, 2.0, 2.0])
    assert con.execute("SELECT [1, 2] AS l").fetchall() == [([1, 2],)]
