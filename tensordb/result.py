"""Result: what ``Connection.execute`` returns for one statement.

Four kinds: ``rows`` (SELECT and other SQL, SHOW, DESCRIBE; DB-API fetching), ``tensor`` (an
assignment: ``.tensor()`` is the stored result as a dense array), ``explain`` (``.text``) and
``status`` (statements that return nothing but a message, such as CREATE TENSOR).

>>> r = Result.rows(["name", "value"], [("workers", 4)])
>>> r.fetchone(), r.fetchall()
(('workers', 4), [])
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import ProgrammingError

__all__ = ["Result"]

_MAX_SHOWN_ROWS = 40


class Result:
    """The result of one statement. Rows are fetched like a DB-API cursor."""

    def __init__(self, kind: str, *, statement: str = "", columns: Sequence[str] = (),
                 data: list[tuple] | None = None, table=None, name: str | None = None, con=None,
                 text: str | None = None, message: str | None = None,
                 shape: tuple[int, ...] | None = None, dtype: str | None = None) -> None:
        self.kind = kind
        self.statement = statement
        self.columns = list(columns)
        self._rows = data
        self._table = table  # a pyarrow Table for SQL results
        self.name = name
        self._con = con
        self.text = text
        self.message = message
        self._shape, self._dtype = shape, dtype
        self._pos = 0
        self._array: np.ndarray | None = None
        self.elapsed: float | None = None  # seconds; set by the executor
        self.count: int | None = None      # rows changed, for SQL statements that report it

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def rows(cls, columns: Sequence[str], data: list[tuple], statement: str = "") -> "Result":
        return cls("rows", columns=columns, data=[tuple(r) for r in data], statement=statement)

    @classmethod
    def from_relation(cls, rel, statement: str = "") -> "Result":
        """Materialize a DuckDB relation now, so that its errors belong to the statement."""
        if rel is None:
            return cls.status("OK", statement)
        table = rel.to_arrow_table()
        return cls("rows", columns=list(table.column_names), table=table, statement=statement)

    @classmethod
    def for_tensor(cls, con, name: str, statement: str = "") -> "Result":
        meta = con.store.meta(name)
        return cls("tensor", name=meta.name, con=con, statement=statement,
                   shape=tuple(meta.shape), dtype=np.dtype(meta.dtype).name)

    @classmethod
    def explain(cls, text: str, statement: str = "", data: dict | None = None) -> "Result":
        r = cls("explain", text=text, statement=statement, columns=["explain"], data=[(text,)])
        r.plan = data
        return r

    @classmethod
    def status(cls, message: str, statement: str = "") -> "Result":
        return cls("status", message=message, statement=statement)

    # -- rows (DB-API style) -------------------------------------------------------------------
    def _all(self) -> list[tuple]:
        if self._rows is None:
            self._rows = [tuple(r.values()) for r in self._table.to_pylist()] \
                if self._table is not None else []
        return self._rows

    @property
    def rowcount(self) -> int:
        """Rows of a query; rows changed by INSERT/UPDATE/DELETE; -1 when unknown."""
        if self.kind in ("rows", "explain"):
            return len(self._all())
        return self.count if self.count is not None else -1

    @property
    def description(self) -> list[tuple] | None:
        if not self.columns:
            return None
        return [(c, None, None, None, None, None, None) for c in self.columns]

    def fetchone(self) -> tuple | None:
        rows = self._all()
        if self._pos >= len(rows):
            return None
        self._pos += 1
        return rows[self._pos - 1]

    def fetchmany(self, size: int = 1) -> list[tuple]:
        rows = self._all()[self._pos:self._pos + size]
        self._pos += len(rows)
        return rows

    def fetchall(self) -> list[tuple]:
        rows = self._all()[self._pos:]
        self._pos += len(rows)
        return rows

    def __iter__(self):
        return iter(self.fetchall())

    def fetchnumpy(self) -> dict[str, np.ndarray]:
        """Columns as numpy arrays (like DuckDB's ``fetchnumpy``)."""
        if self._table is not None:
            return {c: self._table.column(c).to_numpy(zero_copy_only=False) for c in self.columns}
        rows = self._all()
        out = {}
        for k, c in enumerate(self.columns):
            values = [r[k] for r in rows]
            try:
                out[c] = np.array(values)
            except ValueError:  # ragged (tuples of different lengths)
                out[c] = np.array(values, dtype=object)
        return out

    def arrow(self):
        """The rows as a pyarrow Table."""
        import pyarrow as pa
        if self._table is not None:
            return self._table
        return pa.table({c: [r[k] for r in self._all()] for k, c in enumerate(self.columns)})

    def df(self):
        """The rows as a pandas DataFrame (needs pandas)."""
        return self.arrow().to_pandas()

    # -- tensors -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...] | None:
        return self._shape

    @property
    def dtype(self) -> str | None:
        return self._dtype

    def tensor(self) -> np.ndarray:
        """The tensor this statement stored, as a dense numpy array."""
        if self.kind != "tensor":
            raise ProgrammingError(f"this {self.kind} result holds no tensor")
        if self._array is None:
            self._array = self._con.tensor(self.name)
        return self._array

    def preview(self, max_elements: int = 1_000_000) -> str:
        """The tensor printed like numpy; a large one is read only at its corners."""
        size = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        if size <= max_elements:
            return format_array(self.tensor())
        return format_array(corners(self._con.store.open(self.name), _EDGE), threshold=0)

    def __array__(self, dtype=None, copy=None):
        arr = self.tensor()
        return arr if dtype is None else arr.astype(dtype)

    # -- display -------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        """How a notebook shows the result: an HTML table (tensordb.notebook)."""
        from .notebook import result_html
        return result_html(self)

    def tile_map(self):
        """Which tiles of the stored tensor exist, as an SVG picture (tensordb.notebook)."""
        from .notebook import tile_map
        if self.kind != "tensor":
            raise ProgrammingError(f"this {self.kind} result holds no tensor")
        return tile_map(self._con, self.name)

    def __repr__(self) -> str:
        if self.kind == "tensor":
            return f"<Result tensor {self.name} {self.dtype} {self.shape}>"
        if self.kind == "rows":
            return f"<Result {len(self._all())} row(s): {', '.join(self.columns)}>"
        return f"<Result {self.kind}: {self.message or (self.text or '')[:60]}>"

    def __str__(self) -> str:
        if self.kind == "tensor":
            head = f"{self.name}: {self.dtype} {self.shape}"
            return head + "\n" + format_array(self.tensor())
        if self.kind == "explain":
            return self.text or ""
        if self.kind == "status":
            return self.message or "OK"
        return format_rows(self.columns, self._all())


_EDGE = 3


def format_array(arr: np.ndarray, threshold: int = 200) -> str:
    """Like numpy's repr: large arrays elided with '...'."""
    return np.array2string(np.asarray(arr), threshold=threshold, edgeitems=_EDGE, max_line_width=100,
                           precision=6, suppress_small=True)


def corners(reader, edge: int) -> np.ndarray:
    """The first and last ``edge`` entries along each long dimension, with one filler entry
    between them, which numpy's printing elides as '...' (so only the corners are read)."""
    import itertools
    shape = reader.meta.shape
    parts = [[(0, n, 0)] if n <= 2 * edge else [(0, edge, 0), (n - edge, n, edge + 1)] for n in shape]
    out = np.zeros([n if n <= 2 * edge else 2 * edge + 1 for n in shape], dtype=reader.meta.dtype)
    for combo in itertools.product(*parts):
        box = reader.read_box(tuple(c[0] for c in combo), tuple(c[1] for c in combo))
        if box is not None:
            out[tuple(slice(c[2], c[2] + c[1] - c[0]) for c in combo)] = box
    return out


def format_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(format_cell(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return "NULL" if value is None else str(value)


def format_rows(columns: Sequence[str], rows: list[tuple]) -> str:
    """A plain-text table (the REPL prints a rich one)."""
    shown = rows if len(rows) <= _MAX_SHOWN_ROWS else \
        rows[:_MAX_SHOWN_ROWS // 2] + [None] + rows[-_MAX_SHOWN_ROWS // 2:]
    cells = [[format_cell(v) for v in r] if r is not None else ["..."] * len(columns) for r in shown]
    widths = [max([len(c)] + [len(r[k]) for r in cells]) for k, c in enumerate(columns)]
    line = lambda vals: " | ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(columns), "-+-".join("-" * w for w in widths)] + [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)
