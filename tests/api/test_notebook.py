"""Notebook display (tensordb/notebook.py): the HTML and SVG that Jupyter shows for results,
tensors, EXPLAIN and tile maps, parsed back and checked against numpy and DuckDB."""
from __future__ import annotations

import copy
import html.parser
import math
import os
import shutil
import xml.etree.ElementTree as ET

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb import explain, notebook
from tensordb.errors import NotSupportedError, ProgrammingError
from tensordb.result import Result

SVG = "{http://www.w3.org/2000/svg}"


def parse(text: str) -> ET.Element:
    """Our HTML is well-formed XML (every tag closed, every text escaped): parse it strictly."""
    return ET.fromstring(text)


def texts(row: ET.Element, tag: str) -> list[str]:
    return ["".join(c.itertext()) for c in row if c.tag == tag]


def body_rows(table: ET.Element) -> list[ET.Element]:
    return list(table.find("tbody"))


def header(table: ET.Element) -> list[str]:
    return texts(table.find("thead/tr"), "th")


def as_float(s: str) -> float:
    return float({"True": 1, "False": 0}.get(s, s))


# -- rows ----------------------------------------------------------------------------------------

QUERY = ("SELECT i, i * 0.5 AS \"half<&>\", '<b>' || i || '</b> & \"x\"' AS tag "
         "FROM range(50) r(i) ORDER BY i")


def test_sql_result_is_a_bounded_escaped_table():
    with tensordb.connect() as con:
        result = con.execute(QUERY)
        page = result._repr_html_()
        expected = duckdb.connect().sql(QUERY).fetchall()
        table = parse(page)
        assert table.tag == "table"
        assert table.find("caption").text == \
            f"50 rows \u00d7 3 columns (first {notebook.MAX_ROWS} shown)"
        assert header(table) == ["i", "half<&>", "tag"]
        rows = body_rows(table)
        assert len(rows) == notebook.MAX_ROWS + 1
        for row, want in zip(rows[:-1], expected):
            i, half, tag = texts(row, "td")
            assert (int(i), float(half), tag) == want
        assert rows[-1].get("class") == "ellipsis" and texts(rows[-1], "td") == ["\u2026"] * 3
        assert "<b>" not in page and "&lt;b&gt;" in page  # the user's text never becomes markup
        # showing the result does not move its cursor
        assert result.fetchone() == expected[0]


def test_small_and_odd_row_results():
    with tensordb.connect() as con:
        table = parse(con.execute("SELECT 1 AS a, 2 AS a, NULL AS n")._repr_html_())
        assert table.find("caption").text == "1 row \u00d7 3 columns"
        assert header(table) == ["a", "a", "n"]
        assert [texts(r, "td") for r in body_rows(table)] == [["1", "2", "NULL"]]
        con.load("A", np.ones((3, 4)))
        described = con.execute("DESCRIBE A")
        want = described.fetchall()
        table = parse(described._repr_html_())
        assert len(body_rows(table)) == len(want)
        got = {texts(r, "td")[0]: texts(r, "td")[1] for r in body_rows(table)}
        assert got["shape"] == "(3, 4)" and got["dtype"] == "float64"
        empty = parse(con.execute("SELECT 1 AS x WHERE false")._repr_html_())
        assert empty.find("caption").text == "0 rows \u00d7 1 column" and body_rows(empty) == []
        status = parse(con.execute("CREATE TENSOR Z (i 2)")._repr_html_())
        assert status.tag == "pre" and "CREATE TENSOR Z" in status.text


class _Cells(html.parser.HTMLParser):
    """The text of every <td> of DuckDB's HTML (which is not XML: <br> is not closed)."""

    def __init__(self):
        super().__init__()
        self.cells, self._in = [], False

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self._in = True
            self.cells.append("")

    def handle_endtag(self, tag):
        if tag == "td":
            self._in = False

    def handle_data(self, data):
        if self._in:
            self.cells[-1] += data


def test_sql_relation_shows_duckdbs_table_escaped():
    with tensordb.connect() as con:
        con.load("A", np.array([[0.0, 2.5], [3.5, 0.0]]))
        bundle = con.sql("SELECT i, j, value, '<i>' AS t FROM A ORDER BY i")._repr_mimebundle_()
        cells = _Cells()
        cells.feed(bundle["text/html"])
        assert cells.cells == ["0", "1", "2.5", "<i>", "1", "0", "3.5", "<i>"]
        assert "<i>" not in bundle["text/html"]


# -- tensors -------------------------------------------------------------------------------------

def check_grid(table: ET.Element, want: np.ndarray, shape: tuple[int, int]) -> None:
    """``table`` shows the head of an array of ``shape`` whose head is ``want``."""
    rows_more, cols_more = want.shape[0] < shape[0], want.shape[1] < shape[1]
    cols = header(table)[1:]
    assert cols == [str(j) for j in range(want.shape[1])] + (["\u2026"] if cols_more else [])
    rows = body_rows(table)
    assert len(rows) == want.shape[0] + rows_more
    for i, row in enumerate(rows[:want.shape[0]]):
        assert texts(row, "th") == [str(i)]
        cells = texts(row, "td")
        if cols_more:
            assert cells.pop() == "\u2026"
        np.testing.assert_allclose([as_float(c) for c in cells], want[i], rtol=1e-5)
    if rows_more:
        assert rows[-1].get("class") == "ellipsis"


def test_large_tensor_shows_its_first_rows_and_columns(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 40)) * 1e3
    with tensordb.connect(tmp_path / "db.tdb") as con:
        con.load("A", a)
        result = con.execute("B[i,j] = A[i,j] * 2")
        table = parse(result._repr_html_()).find("table")
        assert table.find("caption").text == "B: float64 (300, 40)"
        assert header(table)[0] == "i\\j"
        check_grid(table, 2 * a[:notebook.MAX_ROWS, :notebook.MAX_COLS], a.shape)


@pytest.mark.parametrize("shape,dtype", [((), "float64"), ((7,), "int32"), ((20,), "float32"),
                                         ((3, 2), "bool"), ((0, 4), "float64")])
def test_small_tensors_are_shown_whole(shape, dtype):
    rng = np.random.default_rng(2)
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    with tensordb.connect() as con:
        con.load("A", a)
        page = parse(Result.for_tensor(con, "A")._repr_html_())
        table = page.find("table")
        assert table.find("caption").text == f"A: {np.dtype(dtype).name} {shape}"
        if len(shape) == 2:
            check_grid(table, a, shape)
            return
        cells = texts(body_rows(table)[0], "td")
        flat = a.reshape(-1)
        if flat.size > notebook.MAX_COLS:
            assert cells.pop() == "\u2026" and header(table)[-1] == "\u2026"
        np.testing.assert_allclose([as_float(c) for c in cells], flat[:notebook.MAX_COLS],
                                   rtol=1e-5)


def test_tensor_of_three_dimensions_shows_slices():
    a = np.arange(5 * 30 * 3, dtype=np.int64).reshape(5, 30, 3)
    with tensordb.connect() as con:
        con.load("T", a, dims=["batch", "row", "col"])
        page = parse(Result.for_tensor(con, "T")._repr_html_())
        assert page.find("p").text == "T: int64 (5, 30, 3)"
        tables = page.findall("table")
        assert len(tables) == notebook.MAX_SLICES
        for b, table in enumerate(tables):
            assert table.find("caption").text == f"T[{b}, :, :]"
            assert header(table)[0] == "row\\col"
            check_grid(table, a[b, :notebook.MAX_ROWS], (30, 3))
        assert page.find("p[@class='ellipsis']").text == \
            f"\u2026 {5 - notebook.MAX_SLICES} more slices"


# -- tile maps -----------------------------------------------------------------------------------

def tile_presence(a: np.ndarray, tile: tuple[int, ...]) -> np.ndarray:
    """The oracle: which tiles of ``a`` hold a nonzero, as a grid of booleans."""
    grid = tuple(-(-n // t) for n, t in zip(a.shape, tile))
    out = np.zeros(grid, dtype=bool)
    for c in np.ndindex(*grid):
        out[c] = np.any(a[tuple(slice(k * t, (k + 1) * t) for k, t in zip(c, tile))])
    return out


def squares(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root.findall(f"{SVG}rect")


def span(text: str) -> slice:
    lo, hi = text.split(":")
    return slice(int(lo), int(hi))


def check_map(svg: str, present: np.ndarray) -> None:
    """Every square's counts agree with ``present`` (rows: leading tiles flattened)."""
    flat = present.reshape(-1, present.shape[-1]) if present.ndim >= 2 else present.reshape(1, -1)
    seen = np.zeros(flat.shape, dtype=int)
    for rect in squares(svg):
        rows, cols = span(rect.get("data-rows")), span(rect.get("data-cols"))
        block = flat[rows, cols]
        seen[rows, cols] += 1
        assert int(rect.get("data-tiles")) == block.size
        assert int(rect.get("data-present")) == int(block.sum())
        want = "present" if block.all() else "absent" if not block.any() else "partial"
        assert rect.get("class") == want
    assert (seen == 1).all(), "the squares cover the grid exactly once"


def test_block_sparse_tensor_shows_which_tiles_exist():
    a = np.zeros((300, 40))
    a[:64, :] = 1.0
    a[200:, 5] = -2.0
    a[130, 39] = 3.0
    with tensordb.connect() as con:
        con.load("A", a, tile=(64, 16))
        present = tile_presence(a, (64, 16))
        assert present.shape == (5, 3) and not present.all()
        svg = notebook.tile_map(con, "A")
        check_map(svg, present)
        assert svg._repr_svg_() == str(svg)
        root = ET.fromstring(svg)
        assert root.find(f"{SVG}title").text.startswith(f"A: {int(present.sum())} of 15 tiles stored")
        # the tensor's HTML carries the same map and says how many tiles are stored
        result = Result.for_tensor(con, "A")
        page = parse(result._repr_html_())
        check_map(ET.tostring(page.find(f"{SVG}svg"), encoding="unicode"), present)
        assert page.find("table/caption").text == \
            f"A: float64 (300, 40), {int(present.sum())} of 15 tiles stored"
        check_grid(page.find("table"), a[:notebook.MAX_ROWS, :notebook.MAX_COLS], a.shape)
        assert result.tile_map() == svg
        # a dense tensor shows no map
        con.load("D", np.ones((3, 3)))
        assert parse(Result.for_tensor(con, "D")._repr_html_()).find(f"{SVG}svg") is None


def test_a_large_tile_grid_is_drawn_in_blocks():
    rng = np.random.default_rng(3)
    a = np.where(rng.random((200, 3)) < 0.3, 1.0, 0.0)
    with tensordb.connect() as con:
        con.load("S", a, tile=(1, 1))
        svg = notebook.tile_map(con, "S")
        present = a != 0
        check_map(svg, present)
        rects = squares(svg)
        assert len(rects) <= notebook.MAX_CELLS * 3
        assert sum(int(r.get("data-present")) for r in rects) == int(present.sum())
        assert {r.get("class") for r in rects} >= {"partial"}


@pytest.mark.parametrize("shape,tile", [((40,), (8,)), ((6, 10, 12), (2, 5, 4))])
def test_tile_maps_of_one_and_three_dimensions(shape, tile):
    rng = np.random.default_rng(4)
    a = np.zeros(shape)
    present = rng.random(tuple(-(-n // t) for n, t in zip(shape, tile))) < 0.5
    present.flat[0] = True
    for c in zip(*np.nonzero(present)):
        a[tuple(slice(k * t, k * t + 1) for k, t in zip(c, tile))] = 1.0
    with tensordb.connect() as con:
        con.load("X", a, tile=tile)
        assert (tile_presence(a, tile) == present).all()
        check_map(notebook.tile_map(con, "X"), present)


def test_tile_map_of_a_rows_result_is_refused():
    with tensordb.connect() as con:
        with pytest.raises(ProgrammingError, match="holds no tensor"):
            con.execute("SELECT 1").tile_map()


# -- EXPLAIN -------------------------------------------------------------------------------------

MATMUL = "C[i,k] = SUM(A[i,j] * B[j,k])"


def explain_con():
    con = tensordb.connect(workers=2)
    rng = np.random.default_rng(5)
    con.load("A", rng.random((200, 96)))
    con.load("B", rng.random((96, 64)))
    return con


def test_explain_is_an_html_table_of_its_plan():
    with explain_con() as con:
        text = con.explain(MATMUL)
        assert isinstance(text, str) and text == str(text)
        page = parse(text._repr_html_())
        table = page.find("table")
        assert header(table)[:5] == ["#", "operation", "pieces", "tile", "calls"]
        ops = [r for r in body_rows(table) if r.get("class") == "operation"]
        assert len(ops) == len(text.plan["nodes"]) == 1
        cells = texts(ops[0], "td")
        node = text.plan["nodes"][0]
        assert cells[0] == "1" and cells[1] == node["expression"] == MATMUL
        assert int(cells[4]) == node["kernel_calls"] == math.prod(node["pieces"].values())
        # the tile of one call: the labels' sizes divided by their pieces
        sizes = {"i": 200, "j": 96, "k": 64}
        tile = {l: -(-sizes[l] // node["pieces"][l]) for l in sizes}
        assert cells[3] == f"{tile['i']}x{tile['k']} | {tile['j']}"
        # every cell of the table is on the text form's line for the operation
        line = next(l for l in text.splitlines() if MATMUL in l)
        assert line.split() == " ".join(cells).split()
        assert page.find("pre").text.splitlines()[0] == text.splitlines()[0]
        # the dialect's EXPLAIN result shows the same table
        dialect = parse(con.execute("EXPLAIN " + MATMUL)._repr_html_())
        assert texts(dialect.find("table/tbody/tr"), "td")[1:] == cells[1:]


def test_explain_analyze_html_has_measured_columns_and_text_is_escaped():
    with explain_con() as con:
        text = con.explain(MATMUL, analyze=True)
        page = parse(text._repr_html_())
        assert header(page.find("table"))[-6:] == ["time", "calls*", "moved*", "peak*", "live*",
                                                  "spilled*"]
        assert page.find("p[@class='note']").text.startswith("* measured")
        data = copy.deepcopy(text.plan)
        data["nodes"][0]["expression"] = "<script>alert('&')</script>"
        page = explain.explain_html(data)
        assert "<script>" not in page
        cells = texts(parse(page).find("table/tbody/tr"), "td")
        assert cells[1] == "<script>alert('&')</script>"
        # DuckDB's plan of a SQL statement is rows, shown as a table
        sql_plan = con.execute("EXPLAIN SELECT '<x>' AS t")
        table = parse(sql_plan._repr_html_())
        assert header(table) == sql_plan.columns
        assert [texts(r, "td") for r in body_rows(table)] == \
            [[str(v) for v in row] for row in sql_plan.fetchall()]


def graphviz_nodes_and_edges(svg: str) -> tuple[set[str], set[str]]:
    root = ET.fromstring(svg)
    groups = root.iter(f"{SVG}g")
    nodes, edges = set(), set()
    for g in groups:
        title = g.find(f"{SVG}title")
        if g.get("class") == "node":
            nodes.add(title.text)
        elif g.get("class") == "edge":
            edges.add(title.text)
    return nodes, edges


def test_explain_dot_in_the_dialect_and_the_api():
    with explain_con() as con:
        two = MATMUL + "; D[i] = MAX(C[i,k])"
        dot = con.explain(two, format="dot")
        assert '"A" -> "C";' in dot and '"C" -> "D";' in dot and '"D" [label=' in dot
        dot = con.execute("EXPLAIN (FORMAT DOT) " + MATMUL).text
        assert dot.startswith("digraph plan {") and '"A" -> "C";' in dot and '"B" -> "C";' in dot
        with pytest.raises(ProgrammingError, match="draws einsum plans"):
            con.explain("SELECT 1", format="svg")
        with pytest.raises(ProgrammingError, match="EXPLAIN format must be one of"):
            con.explain(MATMUL, format="png")


@pytest.mark.skipif(shutil.which("dot") is None,
                    reason="Graphviz's dot program is not installed (.ci/run installs it)")
def test_explain_drawn_as_svg_by_graphviz():
    with explain_con() as con:
        svg = con.explain(MATMUL + "; D[i] = MAX(C[i,k])", format="svg")
        assert isinstance(svg, notebook.Svg) and svg._repr_svg_() == str(svg)
        nodes, edges = graphviz_nodes_and_edges(svg)
        assert nodes == {"A", "B", "C", "D"}
        assert edges == {"A->C", "B->C", "C->D"}
        drawn = con.explain(MATMUL).draw()
        assert graphviz_nodes_and_edges(drawn) == ({"A", "B", "C"}, {"A->C", "B->C"})


def test_drawing_without_graphviz_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no dot program on PATH
    with explain_con() as con:
        text = con.explain(MATMUL)
        with pytest.raises(NotSupportedError) as info:
            text.draw()
        message = str(info.value)
        assert "Graphviz's 'dot' program" in message and "apt-get install graphviz" in message
        with pytest.raises(NotSupportedError, match="Graphviz"):
            con.explain(MATMUL, format="svg")
        assert not con.store.has("C")  # EXPLAIN ran nothing
        assert os.environ["PATH"] == str(tmp_path)


def test_a_tensor_dropped_since_shows_why_and_explain_text_pickles():
    import pickle
    with tensordb.connect() as con:
        con.load("A", np.ones((2, 2)))
        result = con.execute("B[i,j] = A[i,j] + 1")
        con.drop("B")
        pre = parse(result._repr_html_())
        with pytest.raises(tensordb.Error) as info:
            con.tensor("B")
        assert pre.tag == "pre" and pre.text == f"B: {info.value}"
        text = con.explain("C[i,j] = A[i,j] * 2")
        again = pickle.loads(pickle.dumps(text))
        assert again == text and isinstance(again, str)
