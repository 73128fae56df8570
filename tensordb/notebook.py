"""Notebook display: results, tensors and EXPLAIN as HTML tables; plans and tile maps as SVG.

Jupyter shows an object by calling its ``_repr_html_`` or ``_repr_svg_``; the objects users hold
(``Result``, the text ``Connection.explain`` returns, ``Svg``) delegate to the functions here.
Every piece of user text is escaped, and every table is bounded: the first ``MAX_ROWS`` rows and
``MAX_COLS`` columns, an ellipsis for the rest, and the full size in the caption. A tensor is read
only as far as it is shown. Nothing here needs a dependency, except drawing a plan (``dot_svg``),
which runs Graphviz's ``dot`` program.

>>> import numpy as np
>>> "<td>2</td>" in array_html(np.array([[1, 2], [3, 4]]), "M")
True
"""
from __future__ import annotations

import html
import math
import shutil
import subprocess
from typing import Any, Iterable, Sequence

import numpy as np

from .errors import Error, NotSupportedError, OperationalError

__all__ = ["Svg", "escape", "rows_html", "result_html", "array_html", "tensor_html", "tile_svg",
           "tile_map", "dot_svg", "MAX_ROWS", "MAX_COLS", "MAX_SLICES", "MAX_CELLS"]

MAX_ROWS = 20      # rows of a result or a tensor shown
MAX_COLS = 12      # columns of a tensor shown
MAX_SLICES = 3     # 2-D slices shown of a tensor with more than two dimensions
MAX_CELLS = 48     # squares per side of a tile map; a larger grid is drawn in blocks of tiles

ELLIPSIS = "\u2026"


class Svg(str):
    """SVG text that a notebook draws (``_repr_svg_``); ``str`` everywhere else."""

    def _repr_svg_(self) -> str:
        return str(self)

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(self))


def escape(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too: safe in attributes)."""
    return html.escape(str(value), quote=True)


_e = escape


def cell(value: Any) -> str:
    """One value as text: floats in 6 significant digits, NULL for None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(cell(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return "NULL" if value is None else str(value)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# -- rows ----------------------------------------------------------------------------------------

def rows_html(columns: Sequence[str], rows: Iterable[Sequence[Any]], total: int,
              caption: str | None = None) -> str:
    """A table of the first ``MAX_ROWS`` of ``rows`` (``total`` rows in all)."""
    shown = [tuple(r) for _, r in zip(range(MAX_ROWS), rows)]
    cap = caption if caption is not None else \
        f"{_plural(total, 'row')} \u00d7 {_plural(len(columns), 'column')}"
    if total > len(shown):
        cap += f" (first {len(shown)} shown)"
    out = ['<table class="tensordb">', f"<caption>{_e(cap)}</caption>", "<thead><tr>"]
    out += [f"<th>{_e(c)}</th>" for c in columns]
    out.append("</tr></thead><tbody>")
    for r in shown:
        out.append("<tr>" + "".join(f"<td>{_e(cell(v))}</td>" for v in r) + "</tr>")
    if total > len(shown):
        out.append('<tr class="ellipsis">' + f"<td>{ELLIPSIS}</td>" * len(columns) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _arrow_head(table, n: int) -> list[tuple]:
    """The first ``n`` rows of a pyarrow Table as tuples (columns by position: names may repeat)."""
    cols = [table.column(k).slice(0, n).to_pylist() for k in range(table.num_columns)]
    return list(zip(*cols)) if cols else []


def result_html(result) -> str:
    """A ``Result`` of any kind as HTML (its fetch position is left where it was)."""
    if result.kind == "tensor":
        try:
            reader = result._con.store.open(result.name)
        except Error as exc:  # dropped since, or the connection closed: say so, in the page
            return _pre(f"{result.name}: {exc}")
        return tensor_html(reader)
    if result.kind == "explain":
        page = getattr(result.text, "_repr_html_", lambda: None)()  # an explain.Explanation
        return page if page is not None else _pre(result.text or "")
    if result.kind == "status":
        return _pre(result.message or "OK")
    table = result._table
    if table is not None:
        return rows_html(result.columns, _arrow_head(table, MAX_ROWS), table.num_rows)
    rows = result._rows or []
    return rows_html(result.columns, rows, len(rows))


def _pre(text: str) -> str:
    return f'<pre class="tensordb">{_e(text)}</pre>'


# -- tensors -------------------------------------------------------------------------------------

def _grid_table(a: np.ndarray, shape: Sequence[int], dims: Sequence[str], caption: str) -> str:
    """A 2-D (or 1-D, or 0-D) head ``a`` of an array of ``shape`` as a table with row and column
    numbers, and an ellipsis row/column where ``a`` stops short of ``shape``."""
    if len(shape) == 0:
        a, shape, dims = a.reshape(1, 1), (1, 1), ("", "")
    elif len(shape) == 1:
        a, shape, dims = a.reshape(1, -1), (1, shape[0]), ("", dims[0])
    rows_more, cols_more = a.shape[0] < shape[0], a.shape[1] < shape[1]
    col_names = [str(j) for j in range(a.shape[1])] if len(dims[1]) else [""]
    out = ['<table class="tensordb">', f"<caption>{_e(caption)}</caption>", "<thead><tr>",
           f'<th class="dims">{_e(dims[0])}\\{_e(dims[1])}</th>' if dims[1] else "<th></th>"]
    out += [f"<th>{_e(c)}</th>" for c in col_names]
    if cols_more:
        out.append(f"<th>{ELLIPSIS}</th>")
    out.append("</tr></thead><tbody>")
    for i in range(a.shape[0]):
        out.append(f"<tr><th>{i if dims[0] else ''}</th>"
                   + "".join(f"<td>{_e(cell(v))}</td>" for v in a[i])
                   + (f"<td>{ELLIPSIS}</td>" if cols_more else "") + "</tr>")
    if rows_more:
        out.append('<tr class="ellipsis">' + f"<th>{ELLIPSIS}</th>"
                   + f"<td>{ELLIPSIS}</td>" * (a.shape[1] + cols_more) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _head_stops(shape: Sequence[int]) -> tuple[int, ...]:
    """How much of each dimension is shown: slices along the leading ones, then rows, columns."""
    caps = (MAX_COLS,) if len(shape) == 1 else (MAX_SLICES,) * (len(shape) - 2) + (MAX_ROWS, MAX_COLS)
    return tuple(min(n, c) for n, c in zip(shape, caps))


def array_html(arr: np.ndarray, name: str = "", dims: Sequence[str] | None = None,
               shape: Sequence[int] | None = None, note: str = "", figure: str = "") -> str:
    """``arr`` (all of an array, or the head of one of ``shape``) as HTML tables with a
    ``name: dtype shape`` caption, ``figure`` (HTML or SVG) above them; more than two dimensions
    are shown as 2-D slices."""
    arr = np.asarray(arr)
    shape = tuple(arr.shape if shape is None else shape)
    dims = tuple(dims) if dims is not None else tuple(f"d{k}" for k in range(len(shape)))
    head = arr[tuple(slice(0, s) for s in _head_stops(shape))]
    caption = f"{name + ': ' if name else ''}{arr.dtype.name} {shape}{note}"
    if len(shape) <= 2:
        return f'<div class="tensordb-tensor">{figure}{_grid_table(head, shape, dims, caption)}</div>'
    lead = head.shape[:-2]
    combos = list(np.ndindex(*lead))[:MAX_SLICES]
    parts = [f'<div class="tensordb-tensor">{figure}<p class="caption">{_e(caption)}</p>']
    for idx in combos:
        label = f"{name or 'slice'}[{', '.join(map(str, idx))}, :, :]"
        parts.append(_grid_table(head[idx], shape[-2:], dims[-2:], label))
    more = math.prod(shape[:-2]) - len(combos)
    if more > 0:
        parts.append(f'<p class="ellipsis">{ELLIPSIS} {_plural(more, "more slice")}</p>')
    parts.append("</div>")
    return "".join(parts)


def tensor_html(reader) -> str:
    """A stored tensor (a ``TensorReader``): caption, a tile map when it is block-sparse, and the
    first rows and columns of its values (only those tiles are read)."""
    meta = reader.meta
    stops = _head_stops(meta.shape)
    head = reader.read_box((0,) * meta.ndim, stops) if meta.ndim else reader.to_numpy()
    if head is None:
        head = np.zeros(stops, dtype=meta.dtype)
    sparse = meta.tile_count < meta.total_tiles and meta.size > 0
    note = f", {meta.tile_count} of {_plural(meta.total_tiles, 'tile')} stored" if sparse else ""
    figure = tile_svg(meta, reader.coords()) if sparse else ""
    return array_html(np.asarray(head), meta.name, meta.dims, meta.shape, note, figure)


# -- EXPLAIN -------------------------------------------------------------------------------------

def dot_svg(dot: str) -> Svg:
    """Graphviz DOT text drawn as SVG by Graphviz's ``dot`` program (a NotSupportedError naming
    what to install when it is not on PATH)."""
    exe = shutil.which("dot")
    if exe is None:
        raise NotSupportedError(
            "drawing a plan needs Graphviz's 'dot' program, which is not on PATH",
            hint="install Graphviz (apt-get install graphviz, brew install graphviz or conda "
                 "install graphviz; pip cannot install the program), or use format='dot' for the "
                 "graph as text")
    try:
        proc = subprocess.run([exe, "-Tsvg"], input=dot.encode("utf-8"), capture_output=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OperationalError(f"Graphviz's dot ({exe}) did not run: {exc}") from None
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip()[:500]
        raise OperationalError(f"Graphviz's dot ({exe}) failed with exit status "
                               f"{proc.returncode}: {msg}")
    svg = proc.stdout.decode("utf-8", "replace")
    return Svg(svg[svg.find("<svg"):])


# -- tile maps -----------------------------------------------------------------------------------

def _blocks(n: int) -> tuple[int, int]:
    """(tiles per square, squares) for ``n`` tiles along one side of a map."""
    per = max(1, -(-n // MAX_CELLS))
    return per, -(-n // per) if n else 0


def tile_svg(meta, present: Iterable[Sequence[int]]) -> Svg:
    """Which tiles of a tensor are stored, as a grid of squares (filled: stored; empty: absent,
    all zeros). Rows are the tile rows (the leading dimensions' tiles flattened, C order),
    columns the last dimension's tiles. A grid wider than ``MAX_CELLS`` squares is drawn in
    blocks of tiles, each square shaded by the share of its tiles stored. Every square carries
    ``data-rows``/``data-cols`` (its tile ranges, half-open), ``data-tiles`` and ``data-present``.
    """
    g = tuple(meta.grid_shape)
    rows = math.prod(g[:-1]) if len(g) >= 2 else 1
    cols = g[-1] if g else 1
    br, nr = _blocks(rows)
    bc, nc = _blocks(cols)
    counts = np.zeros((nr, nc), dtype=np.int64)
    stored = 0
    for c in present:
        c = tuple(int(x) for x in c)
        r = int(np.ravel_multi_index(c[:-1], g[:-1])) if len(c) >= 2 else 0
        k = c[-1] if c else 0
        counts[r // br, k // bc] += 1
        stored += 1
    total = rows * cols
    side = max(4, min(20, 360 // max(nr, nc, 1)))
    top = 18
    width, height = max(nc * side + 2, 160), nr * side + top + 2
    title = (f"{meta.name}: {stored} of {_plural(total, 'tile')} stored, grid "
             f"{' x '.join(map(str, g)) or '1'}"
             + (f", {br} x {bc} tiles per square" if br * bc > 1 else "")
             + (" (leading dimensions flattened into rows)" if len(g) > 2 else ""))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tensordb-tiles" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" data-grid="{_e(",".join(map(str, g)))}">',
           f"<title>{_e(title)}</title>",
           f'<text x="1" y="12" font-family="monospace" font-size="11">'
           f"{_e(f'{meta.name}: {stored}/{total} tiles stored')}</text>"]
    for i in range(nr):
        r0, r1 = i * br, min(rows, (i + 1) * br)
        for j in range(nc):
            c0, c1 = j * bc, min(cols, (j + 1) * bc)
            n, have = (r1 - r0) * (c1 - c0), int(counts[i, j])
            kind = "present" if have == n else "absent" if have == 0 else "partial"
            fill = "#f4f4f4" if have == 0 else "#3b6ea5"
            opacity = "" if kind != "partial" else f' fill-opacity="{max(0.15, have / n):.2f}"'
            out.append(f'<rect class="{kind}" x="{1 + j * side}" y="{top + i * side}" '
                       f'width="{side}" height="{side}" fill="{fill}"{opacity} stroke="#bbb" '
                       f'stroke-width="0.5" data-rows="{r0}:{r1}" data-cols="{c0}:{c1}" '
                       f'data-tiles="{n}" data-present="{have}">'
                       f"<title>tile rows {r0}:{r1}, tile columns {c0}:{c1}: {have} of {n} "
                       f"stored</title></rect>")
    out.append("</svg>")
    return Svg("".join(out))


def tile_map(con, name: str) -> Svg:
    """The tile map of stored tensor ``name`` on connection ``con`` (see ``tile_svg``)."""
    reader = con.store.open(name)
    return tile_svg(reader.meta, reader.coords())
