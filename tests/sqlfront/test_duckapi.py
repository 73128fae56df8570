"""DuckDB's Python API on a tensordb connection, from a DuckDB user's side: every call is made on
a plain ``duckdb.connect()`` too, and DuckDB's answer is the oracle."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import tensordb

ROWS = [(k, k * 0.5, f"s{k}") for k in range(6)]


@pytest.fixture
def both(con):
    """(tensordb connection, duckdb connection), each with the same table t."""
    duck = duckdb.connect()
    for c in (con, duck):
        c.execute("CREATE TABLE t (k INTEGER, v DOUBLE, s VARCHAR)")
        c.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS)
    yield con, duck
    duck.close()


def frame() -> pd.DataFrame:
    return pd.DataFrame({"a": np.arange(5), "b": np.linspace(0, 1, 5)})


def test_register_and_unregister_like_duckdb(both):
    con, duck = both
    df = frame()
    query = "SELECT a, b * 2 FROM people WHERE a > 1 ORDER BY a"
    for c in (con, duck):
        assert c.register("people", df) is c  # returns the connection, as DuckDB's does
    assert con.sql(query).fetchall() == duck.sql(query).fetchall()
    assert con.execute(query).fetchall() == duck.execute(query).fetchall()
    for obj in (pa.table({"x": [1, 2]}), pl.DataFrame({"x": [1, 2]})):
        con.register("other", obj)
        duck.register("other", obj)
        assert con.sql("SELECT sum(x) FROM other").fetchall() == \
            duck.sql("SELECT sum(x) FROM other").fetchall()
    for c in (con, duck):
        c.unregister("people")
    with pytest.raises(duckdb.CatalogException):
        duck.sql(query)
    with pytest.raises(tensordb.CatalogError, match="people"):
        con.sql(query)
    con.unregister("never_registered")  # as in DuckDB, nothing happens
    duck.unregister("never_registered")


def test_a_registered_name_and_a_tensor_name_exclude_each_other(con):
    con.load("W", np.eye(2))
    with pytest.raises(tensordb.CatalogError, match="tensor named 'W'"):
        con.register("w", frame())
    con.register("people", frame())
    with pytest.raises(tensordb.CatalogError, match="registered as 'people'"):
        con.load("People", np.eye(2))
    with pytest.raises(tensordb.CatalogError, match="registered"):
        con.execute("CREATE TENSOR people (2, 2) FLOAT32")
    with pytest.raises(tensordb.ProgrammingError, match="cannot register int"):
        con.register("n", 5)
    assert not con.store.has("people")
    con.unregister("people")
    con.load("people", np.eye(2))
    np.testing.assert_array_equal(con.tensor("people"), np.eye(2))


def test_relations_from_tables_files_and_frames(both, tmp_path):
    con, duck = both
    df = frame()
    duck.execute(f"COPY t TO '{tmp_path / 't.parquet'}'")
    duck.execute(f"COPY t TO '{tmp_path / 't.csv'}'")
    pairs = [
        (lambda c: c.table("t"), "k"),
        (lambda c: c.view("t"), None),
        (lambda c: c.read_parquet(str(tmp_path / "t.parquet")), "k"),
        (lambda c: c.read_csv(str(tmp_path / "t.csv")), "k"),
        (lambda c: c.from_df(df), "a"),
        (lambda c: c.from_arrow(pa.Table.from_pandas(df)), "a"),
    ]
    duck.execute("CREATE VIEW tv AS SELECT * FROM t")
    con.execute("CREATE VIEW tv AS SELECT * FROM t")
    for make, order in pairs:
        if order is None:  # view(): DuckDB's finds views only
            mine, theirs = con.view("tv"), duck.view("tv")
        else:
            mine, theirs = make(con), make(duck)
        assert mine.columns == theirs.columns
        assert sorted(mine.fetchall()) == sorted(theirs.fetchall())
        if order:
            assert mine.order(order).limit(2).fetchall() == theirs.order(order).limit(2).fetchall()
    with pytest.raises(tensordb.CatalogError):
        con.table("no_such_table")
    with pytest.raises(tensordb.ProgrammingError, match="DataFrame"):
        con.from_df([1, 2])


def test_a_tensor_is_a_table_too(con):
    a = np.array([[0, 2.0], [3.0, 0]])
    con.load("A", a)
    assert sorted(con.table("a").fetchall()) == [(0, 1, 2.0), (1, 0, 3.0)]


@pytest.mark.filterwarnings("ignore:Arrow output on a DB-API result")
def test_connection_fetches_read_the_last_result(both):
    con, duck = both
    query = "SELECT k, v, s FROM t ORDER BY k"
    for c in (con, duck):
        c.execute(query)
    assert con.fetchone() == duck.fetchone()
    assert con.fetchmany(2) == duck.fetchmany(2)
    assert con.fetchall() == duck.fetchall()
    assert con.fetchall() == duck.fetchall() == []
    for method in ("fetchnumpy", "fetchdf", "df", "fetch_df", "to_arrow_table", "arrow", "pl"):
        for c in (con, duck):
            c.execute(query)
            c.fetchone()  # the rest of the rows, as DuckDB's give them
        mine = getattr(con, method)()
        # DuckDB 2 has no arrow() nor pl() on its connection: its Arrow table is theirs
        theirs = getattr(duck, method)() if hasattr(duck, method) else duck.to_arrow_table()
        if method == "pl":
            theirs = pl.from_arrow(theirs)
        if method == "fetchnumpy":
            assert mine.keys() == theirs.keys()
            for key in mine:
                np.testing.assert_array_equal(mine[key], theirs[key])
        elif method in ("fetchdf", "df", "fetch_df"):
            pd.testing.assert_frame_equal(mine, theirs)
        elif method == "pl":
            assert mine.equals(theirs)
        else:
            assert mine.equals(theirs)
    assert [d[0] for d in con.description] == [d[0] for d in duck.description]


def test_fetching_from_the_connection_without_a_result_is_an_error(con):
    with pytest.raises(tensordb.ProgrammingError, match="nothing to fetch"):
        con.fetchall()
    con.execute("CREATE TENSOR Z (2, 2) FLOAT32")
    with pytest.raises(tensordb.ProgrammingError, match="no rows"):
        con.fetchone()


def test_a_cursor_leaves_the_connections_result_alone(both):
    con, duck = both
    for c in (con, duck):
        c.execute("SELECT 1")
        c.cursor().execute("SELECT 2")
    assert con.fetchall() == duck.fetchall() == [(1,)]


def test_executemany_on_the_connection(both):
    con, duck = both
    for c in (con, duck):
        c.execute("CREATE TABLE kv (k INTEGER, v DOUBLE)")
        c.executemany("INSERT INTO kv VALUES (?, ?)", [(1, 0.5), (2, 1.5), (3, 2.5)])
    assert con.fetchall() == duck.fetchall()
    assert con.rowcount == duck.rowcount == 3
    for c in (con, duck):
        c.execute("UPDATE kv SET v = 0 WHERE k > 1")
    assert con.rowcount == duck.rowcount == 2
    for c in (con, duck):
        c.execute("SELECT * FROM kv")
    assert con.rowcount == duck.rowcount == -1
    duck.fetchall()
    assert con.sql("SELECT * FROM kv ORDER BY k").fetchall() == \
        duck.sql("SELECT * FROM kv ORDER BY k").fetchall()
    with pytest.raises(tensordb.DataError):
        con.executemany("INSERT INTO kv VALUES (?, ?)", [(4, 1.0), ("x", 1.0)])
    assert con.sql("SELECT count(*) FROM kv").fetchall() == [(3,)]  # all or nothing


def test_statements_that_count_fetch_their_count(both):
    con, duck = both
    for stmt in ("CREATE TABLE u (x INTEGER)", "INSERT INTO u SELECT * FROM range(4)",
                 "INSERT INTO u VALUES (?)", "UPDATE u SET x = x + 1 WHERE x < 2",
                 "DELETE FROM u WHERE x = 3", "CREATE TABLE w AS SELECT * FROM u",
                 "DROP TABLE w"):
        params = [7] if "?" in stmt else None
        mine, theirs = con.execute(stmt, params), duck.execute(stmt, params)
        described = [(d[0], str(d[1])) for d in theirs.description]
        assert [(d[0], str(d[1])) for d in mine.description] == described, stmt
        assert mine.fetchall() == theirs.fetchall(), stmt
    cur, dcur = con.cursor(), duck.cursor()
    cur.execute("INSERT INTO u VALUES (1), (2)")
    dcur.execute("INSERT INTO u VALUES (1), (2)")
    assert cur.fetchall() == dcur.fetchall() == [(2,)]
    assert cur.rowcount == 2


def test_description_type_codes_are_duckdbs(both):
    con, duck = both
    query = "SELECT k, v, s, 1.5 AS d, DATE '2024-01-02' AS day, [1, 2] AS l FROM t"
    mine = con.execute(query).description
    theirs = duck.execute(query).description
    assert mine == theirs
    for (_, code, *_), (_, want, *_) in zip(mine, theirs):
        assert type(code) is type(want) and code == want and str(code) == str(want)
        for group in ("NUMBER", "STRING", "DATETIME", "BINARY"):
            assert (code == getattr(duckdb, group)) == (want == getattr(duckdb, group))
    assert mine[0][1] == tensordb.NUMBER and mine[2][1] == tensordb.STRING
    assert mine[4][1] == tensordb.DATETIME and mine[3][1] == "DECIMAL(2,1)"


def test_sql_with_params_is_a_relation(both):
    con, duck = both
    query = "SELECT k, s FROM t WHERE k >= ? AND s <> ? ORDER BY k"
    mine = con.sql(query, params=[2, "s4"])
    assert isinstance(mine, tensordb.sqlfront.relations.Relation)
    assert mine.fetchall() == duck.sql(query, params=[2, "s4"]).fetchall()
    named = "SELECT $lo + 1 AS x"
    assert con.sql(named, params={"lo": 41}).fetchall() == \
        duck.sql(named, params={"lo": 41}).fetchall()
    assert con.query(query, params=[2, "s4"]).fetchall() == duck.query(query, params=[2, "s4"]).fetchall()
    with pytest.raises(tensordb.ProgrammingError, match="params"):
        con.sql(query, params=5)
    con.sql("INSERT INTO t VALUES (?, ?, ?)", params=[9, 1.0, "n"])
    assert con.sql("SELECT count(*) FROM t").fetchall() == [(len(ROWS) + 1,)]
    assert con.sql("SELECT k FROM t", alias="tt").alias == duck.sql("SELECT k FROM t", alias="tt").alias


def test_module_functions_use_a_default_connection():
    query = "SELECT range * 2 AS x FROM range(4)"
    assert tensordb.sql(query).fetchall() == duckdb.sql(query).fetchall()
    assert tensordb.execute(query).fetchall() == duckdb.execute(query).fetchall()
    assert tensordb.query(query).fetchall() == duckdb.query(query).fetchall()
    assert tensordb.default_connection() is tensordb.default_connection()
    tensordb.execute(query)
    duckdb.execute(query)
    assert tensordb.fetchone() == duckdb.fetchone()
    assert tensordb.fetchall() == duckdb.fetchall()  # DuckDB 2: a result must end before more
    tensordb.load("module_A", np.eye(3))
    try:
        np.testing.assert_array_equal(tensordb.einsum("ij,jk->ik", "module_A", "module_A"),
                                      np.eye(3))
    finally:
        tensordb.drop("module_A")


def test_connect_takes_duckdbs_arguments(tmp_path):
    path = tmp_path / "d.tdb"
    with tensordb.connect(database=str(path)) as con:
        con.load("A", np.arange(3.0))
    with tensordb.connect(str(path), True) as con:  # read_only, positionally as in DuckDB
        np.testing.assert_array_equal(con.tensor("A"), np.arange(3.0))
        with pytest.raises(tensordb.OperationalError, match="read-only"):
            con.load("B", np.eye(2))
    with tensordb.connect(database=str(path), config={"access_mode": "READ_ONLY"}) as con:
        assert con.store.read_only
    with tensordb.connect(":memory:", config={"threads": 2, "memory_limit": "1GiB"}) as con:
        assert not con.store.persistent and con.settings.workers == 2
        assert con.settings.memory_limit == 1 << 30
    with pytest.raises(tensordb.ProgrammingError, match="not both"):
        tensordb.connect(str(path), database=str(path))
    with pytest.raises(tensordb.ProgrammingError, match="config option 'nonsense'"):
        tensordb.connect(config={"nonsense": 1})


# -- DataFrames by their variable names (DuckDB's replacement scan) ---------------------------------

GLOBAL_FRAME = pd.DataFrame({"g": [1, 2, 3]})


def _no_views(con) -> list:
    """Views left behind, other than the tensors' own (a listing query like this one shows
    every tensor as a view of its name)."""
    tensors = {t["name"] for t in con.tensors()}
    return [row for row in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
            if row[0] not in tensors]


def test_frames_are_read_by_their_variable_names(con):
    duck = duckdb.connect()
    people = frame()
    arrow_table = pa.table({"x": [1, 2, 3], "y": [0.5, 1.5, 2.5]})
    polars_frame = pl.DataFrame({"z": [10, 20]})
    queries = ["SELECT a, b FROM people WHERE a > 2 ORDER BY a",
               "SELECT sum(y * x) FROM arrow_table",
               'SELECT count(*), max(z) FROM "polars_frame"',
               "SELECT sum(g) FROM GLOBAL_FRAME",
               "SELECT p.a, q.x FROM people p JOIN arrow_table q ON p.a = q.x ORDER BY 1"]
    for query in queries:
        want = duck.sql(query).fetchall()
        assert con.sql(query).fetchall() == want, query
        assert con.execute(query).fetchall() == want, query
        assert con.cursor().execute(query).fetchall() == want, query
    assert _no_views(con) == []  # each was shown for its statement only
    duck.close()


def test_a_relation_over_a_local_frame_outlives_the_function(con):
    def make():
        local_frame = pd.DataFrame({"q": [3, 4]})
        return con.sql("SELECT q * 2 AS d FROM local_frame")
    rel = make()
    assert rel.fetchall() == [(6,), (8,)]
    assert rel.filter("d > 6").fetchall() == [(8,)]  # derived relations scan it too
    assert _no_views(con) == []


def test_a_frame_inside_create_tensor_from_select(con):
    sales = pd.DataFrame({"r": [0, 1, 2, 0], "c": [0, 1, 1, 2], "v": [1.5, 2.0, 3.0, 4.0]})
    con.execute("CREATE TENSOR S FROM (SELECT v, r FROM sales ORDER BY r, c)")
    np.testing.assert_array_equal(con.tensor("S"),
                                  sales.sort_values(["r", "c"])[["v", "r"]].to_numpy(float))
    con.execute("CREATE TENSOR M FROM (SELECT r, c, v AS value FROM sales) INDEX (r, c) SHAPE (3, 3)")
    want = np.zeros((3, 3))
    want[sales.r, sales.c] = sales.v
    np.testing.assert_array_equal(con.tensor("M"), want)
    assert _no_views(con) == []


def test_copy_of_a_frame_to_a_file(con, tmp_path):
    duck = duckdb.connect()
    people = frame()
    out = tmp_path / "people.parquet"
    con.execute(f"COPY (SELECT * FROM people WHERE a < 3) TO '{out}'")
    assert duck.sql(f"SELECT * FROM '{out}'").fetchall() == \
        duck.sql("SELECT * FROM people WHERE a < 3").fetchall()
    with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
        con.execute(f"COPY (SELECT * FROM people) TO '{con.store.root / 'x.parquet'}'")
    duck.close()


def test_names_in_strings_tensors_and_tables_come_first(con):
    duck = duckdb.connect()
    A = pd.DataFrame({"never": [1]})  # noqa: N806: a tensor of this name hides it
    con.load("A", np.eye(2))
    assert sorted(con.sql("SELECT * FROM A").fetchall()) == [(0, 0, 1.0), (1, 1, 1.0)]
    t = pd.DataFrame({"never": [1]})
    for c in (con, duck):
        c.execute("CREATE TABLE t AS SELECT 5 AS x")
    assert con.sql("SELECT * FROM t").fetchall() == duck.sql("SELECT * FROM t").fetchall()
    people = frame()
    query = "SELECT 'people' AS s -- people"
    assert con.sql(query).fetchall() == duck.sql(query).fetchall()
    not_a_frame = 5
    with pytest.raises(tensordb.CatalogError, match="not_a_frame"):
        con.sql("SELECT * FROM not_a_frame")
    assert A is not None and t is not None and people is not None and not_a_frame
    duck.close()


def test_module_sql_reads_the_callers_frames():
    fresh = pd.DataFrame({"u": [2, 5]})
    assert tensordb.sql("SELECT max(u) FROM fresh").fetchall() == \
        duckdb.sql("SELECT max(u) FROM fresh").fetchall()


def test_a_second_connect_to_a_path_shares_the_database(tmp_path):
    path = str(tmp_path / "shared.tdb")
    duck_path = str(tmp_path / "shared.duckdb")
    d1, d2 = duckdb.connect(duck_path), duckdb.connect(duck_path)  # DuckDB shares the instance
    c1, c2 = tensordb.connect(path), tensordb.connect(database=path)
    for a, b in ((c1, c2), (d1, d2)):
        a.execute("CREATE TABLE t AS SELECT 7 AS x")
        assert b.execute("SELECT x FROM t").fetchall() == [(7,)]
    c1.load("A", np.eye(3))
    np.testing.assert_array_equal(c2.tensor("A"), np.eye(3))
    c2.execute("B[i,k] = SUM(A[i,j] * A[j,k])")
    np.testing.assert_array_equal(c1.tensor("B"), np.eye(3))
    c1.close()
    with pytest.raises(tensordb.InterfaceError):
        c1.tensor("A")
    assert sorted(t["name"] for t in c2.tensors()) == ["A", "B"]  # the other goes on
    with pytest.raises(tensordb.OperationalError, match="already open for writing"):
        tensordb.connect(path, read_only=True)  # DuckDB: another configuration is refused too
    with pytest.raises(duckdb.ConnectionException):
        duckdb.connect(duck_path, read_only=True)
    c2.close()
    d1.close()
    d2.close()
    with tensordb.connect(path, read_only=True) as reader:  # the last one closed it
        np.testing.assert_array_equal(reader.tensor("B"), np.eye(3))


def test_a_view_over_a_frame_finds_it_when_read(con):
    """DuckDB looks a name up when it binds a statement, a view's body included."""
    duck = duckdb.connect()
    orders = pd.DataFrame({"n": [1, 2, 3]})
    for c in (con, duck):
        c.execute("CREATE VIEW big AS SELECT n FROM orders WHERE n > 1")
    assert con.sql("SELECT sum(n) FROM big").fetchall() == duck.sql("SELECT sum(n) FROM big").fetchall()

    def later():
        orders = pd.DataFrame({"n": [10, 20]})  # noqa: F841: the view reads this one now
        return con.execute("SELECT sum(n) FROM big").fetchall(), \
            duck.execute("SELECT sum(n) FROM big").fetchall()
    mine, theirs = later()
    assert mine == theirs == [(30,)]
    assert _no_views(con) == [("big",)]
    del orders
    with pytest.raises(tensordb.CatalogError, match="orders"):
        con.sql("SELECT * FROM big")
    duck.close()


def test_a_relations_writes_are_guarded_like_sql(con, tmp_path):
    """A relation's own writing methods are checked as the SQL that writes is: no file inside
    the database directory, nothing in the catalog schema, no table named like a tensor."""
    duck = duckdb.connect()
    con.load("A", np.eye(2))
    rel = con.sql("SELECT 1 AS x")
    for method in ("to_parquet", "write_parquet", "to_csv", "write_csv"):
        with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
            getattr(rel, method)(str(con.store.root / "tiles" / f"x.{method}"))
        out = tmp_path / f"ok_{method}"
        getattr(rel, method)(str(out))  # elsewhere as DuckDB writes it
        getattr(duck.sql("SELECT 1 AS x"), method)(str(tmp_path / f"duck_{method}"))
        assert out.read_bytes()[:4] == (tmp_path / f"duck_{method}").read_bytes()[:4]
    for method in ("create", "to_table", "insert_into", "create_view", "to_view"):
        with pytest.raises(tensordb.ProgrammingError, match="catalog"):
            getattr(rel, method)("tensordb.evil")
    for method in ("create", "to_table", "create_view"):
        with pytest.raises(tensordb.CatalogError, match="tensor named 'A'"):
            getattr(rel, method)("a")
    with pytest.raises(tensordb.ProgrammingError, match="catalog table"):
        con.table("tensordb.tensors")
    rel.create("made")
    assert con.table("made").fetchall() == [(1,)]
    assert con.sql("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'tensordb' "
                   "AND table_name = 'evil'").fetchall() == [(0,)]
    duck.close()


def test_connects_and_closes_racing_in_threads_never_find_the_database_held(tmp_path):
    """The last close of a shared store and a connect in another thread: the connect finds
    either the open store or a closed database, never 'already open in this process'."""
    import threading
    path = str(tmp_path / "race.tdb")
    with tensordb.connect(path) as con:
        con.load("A", np.ones(3))
    errors = []

    def loop():
        for _ in range(25):
            try:
                con = tensordb.connect(path)
                assert con.tensor("A").sum() == 3
                con.close()
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
