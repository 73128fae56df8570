"""Result: what ``Connection.execute`` returns for one statement.

Four kinds: ``rows`` (SELECT and other SQL, SHOW, DESCRIBE; DB-API fetching), ``tensor`` (an
assignment: ``.tensor()`` or ``np.asarray(r)`` is the stored result as a dense array; its rows are
the tensor's relation, one row per nonzero: dims + ``value``), ``explain`` (``.text``) and
``status`` (statements that return nothing but a message, such as CREATE TENSOR). Rows come out
as DuckDB's results give them: ``fetchall``, ``fetchnumpy``, ``fetch_arrow_table``/``arrow``,
``fetchdf``/``df`` (pandas) and ``pl`` (polars).

>>> r = Result.rows(["name", "value"], [("workers", 4)])
>>> r.fetchone(), r.fetchall()
(('workers', 4), [])
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._optional import require
from .errors import DataError, OutOfMemoryError, ProgrammingError

__all__ = ["Result"]

_MAX_SHOWN_ROWS = 40


_DTYPE_NAMES: dict = {}  # numpy dtype -> its name (Result.for_tensor)

class Result:
    """The result of one statement. Rows are fetched like a DB-API cursor."""

    def __init__(self, kind: str, *, statement: str = "", columns: Sequence[str] = (),
                 data: list[tuple] | None = None, table=None, name: str | None = None, con=None,
                 text: str | None = None, message: str | None = None,
                 shape: tuple[int, ...] | None = None, dtype: str | None = None,
                 types: Sequence[str] | None = None) -> None:
        self.kind = kind
        self.statement = statement
        self.columns = list(columns)
        self.types = list(types) if types is not None else [None] * len(self.columns)
        self._rows = data
        self._table = table  # a pyarrow Table for SQL results
        self.name = name
        self._con = con
        self.text = text
        self.message = message
        self._shape, self._dtype = shape, dtype
        self._pos = 0
        self.version: int | None = None  # a tensor result: the version its statement stored
        self._array: np.ndarray | None = None
        self.elapsed: float | None = None  # seconds; set by the executor
        self.count: int | None = None      # rows changed, for SQL statements that report it
        # True on the status of a BEGIN or COMMIT: the statements before it are stored, whatever
        # fails later in the same call (a block ends the unit before it and commits at COMMIT)
        self.commits = False

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def rows(cls, columns: Sequence[str], data: list[tuple], statement: str = "",
             types: Sequence[str] | None = None) -> "Result":
        return cls("rows", columns=columns, data=[tuple(r) for r in data], statement=statement,
                   types=types)

    @classmethod
    def from_relation(cls, rel, statement: str = "") -> "Result":
        """Materialize a DuckDB relation now, so that its errors belong to the statement."""
        if rel is None:
            return cls.status("OK", statement)
        types = [str(t) for t in rel.types]
        table = rel.to_arrow_table()
        return cls("rows", columns=list(table.column_names), table=table, statement=statement,
                   types=types)

    @classmethod
    def for_tensor(cls, con, name: str, statement: str = "") -> "Result":
        meta = con.store.meta(name)
        dtype = _DTYPE_NAMES.get(meta.dtype)
        if dtype is None:  # ``dtype.name`` is Python code: named once per dtype
            dtype = _DTYPE_NAMES[meta.dtype] = np.dtype(meta.dtype).name
        r = cls("tensor", name=meta.name, con=con, statement=statement,
                shape=tuple(meta.shape), dtype=dtype,
                columns=list(meta.dims) + ["value"],
                types=["BIGINT"] * len(meta.dims) + [_SQL_TYPES[dtype]])
        r.version = meta.version  # the tensor this statement stored; its rows are read later
        return r

    def _check_version(self) -> None:
        """A tensor result's rows and array are read when first asked for: by then the tensor
        must still be the version the statement stored, else an error says so (its rows would
        be another statement's)."""
        meta = self._con.store.find(self.name)
        if meta is None or (self.version is not None and meta.version != self.version):
            raise ProgrammingError(
                f"tensor '{self.name}' was {'dropped' if meta is None else 'replaced'} after the "
                "statement whose result this is; its rows are no longer there to read",
                hint="fetch a result before the statements that replace its tensor")

    @classmethod
    def explain(cls, text: str, statement: str = "", data: dict | None = None) -> "Result":
        r = cls("explain", text=text, statement=statement, columns=["explain"], data=[(text,)])
        r.plan = data
        return r

    @classmethod
    def status(cls, message: str, statement: str = "") -> "Result":
        return cls("status", message=message, statement=statement)

    def with_rows(self, columns: Sequence[str], data: list[tuple],
                  types: Sequence[str]) -> "Result":
        """A status that also holds DuckDB's rows for its statement: INSERT, UPDATE, DELETE,
        COPY fetch ``[(count,)]`` and describe a ``Count`` column, as in DuckDB."""
        self.columns, self.types, self._rows = list(columns), list(types), [tuple(r) for r in data]
        return self

    # -- rows (DB-API style) -------------------------------------------------------------------
    def _arrow_table(self):
        """The rows as Arrow data: a tensor's are its relation's, read when first asked for."""
        if self._table is None and self.kind == "tensor":
            self._check_version()
            self._table = self.relation().to_arrow_table()
        return self._table

    def _all(self) -> list[tuple]:
        if self._rows is None:
            self._arrow_table()
            # by position: columns of one name (SELECT 1 AS a, 2 AS a; a self-join's *) are
            # kept apart, where rows made as dicts kept the last of them
            t = self._table
            if t is None:
                self._rows = []
            elif t.num_columns:
                self._rows = list(zip(*(_python_values(c, ty)
                                        for c, ty in zip(t.columns, self.types))))
            else:
                self._rows = [()] * t.num_rows
        return self._rows

    @property
    def rowcount(self) -> int:
        """Rows of a query; rows changed by INSERT/UPDATE/DELETE; -1 when unknown."""
        if self.kind in ("rows", "explain"):
            return len(self._all())
        return self.count if self.count is not None else -1

    @property
    def description(self) -> list[tuple] | None:
        """DB-API 7-tuples (name, type_code, None x 5); type_code is DuckDB's type object
        (equal to its name, 'BIGINT', 'DOUBLE', ..., and to tensordb.NUMBER and duckdb.NUMBER)
        where known. None when there are no rows."""
        if not self.columns:
            return None
        from .sqlfront.pyobjects import sql_type  # DuckDB's type objects, as its cursors give
        return [(c, sql_type(t), None, None, None, None, None)
                for c, t in zip(self.columns, self.types)]

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

    def rest(self) -> "Result":
        """The rows not fetched yet, as a result of their own (they count as fetched now):
        what a DB-API cursor's fetchnumpy, arrow and df return, as DuckDB's do. A result's
        own methods return every row, as a DuckDB relation's do."""
        rows = self._all()
        r = Result("rows", columns=list(self.columns), types=list(self.types or []),
                   data=rows[self._pos:])
        table = self._arrow_table()
        if table is not None:
            r._table = table.slice(min(self._pos, table.num_rows))
        self._pos = len(rows)
        return r

    def fetchnumpy(self) -> dict[str, np.ndarray]:
        """Columns as numpy arrays (like DuckDB's ``fetchnumpy``)."""
        table = self._arrow_table()
        if table is not None:  # DuckDB's own conversion: DECIMAL as float64, NULLs masked...
            import duckdb
            columns = list(duckdb.from_arrow(table.rename_columns(
                [f"c{k}" for k in range(table.num_columns)])).fetchnumpy().values())
            return dict(zip(self.columns, columns))
        rows = self._all()
        out = {}
        for k, c in enumerate(self.columns):
            values = [r[k] for r in rows]
            try:
                out[c] = np.array(values)
            except ValueError:  # ragged (tuples of different lengths)
                out[c] = np.array(values, dtype=object)
        return out

    def fetch_arrow_table(self):
        """The rows as a pyarrow Table (DuckDB's name; ``arrow()`` is the same)."""
        import pyarrow as pa
        table = self._arrow_table()
        if table is not None:
            return table
        return pa.table({c: [r[k] for r in self._all()] for k, c in enumerate(self.columns)})

    arrow = fetch_arrow_table

    def fetchdf(self):
        """The rows as a pandas DataFrame (``pip install tensordb[pandas]``); ``df()`` is the
        same."""
        require("pandas", "fetchdf()/df()")
        return self.fetch_arrow_table().to_pandas()

    df = fetchdf

    def pl(self):
        """The rows as a polars DataFrame (``pip install tensordb[polars]``)."""
        polars = require("polars", "pl()")
        return polars.from_arrow(self.fetch_arrow_table())

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
            self._check_version()
            self._array = self._con.tensor(self.name)
        return self._array

    def relation(self):
        """A tensor result's relation: plain SQL over the stored tensor (one row per nonzero:
        its dims, then ``value``), as ``con.sql`` returns it."""
        if self.kind != "tensor":
            raise ProgrammingError(f"this {self.kind} result holds no tensor")
        from .storage import quote_ident
        return self._con._read_sql(f"SELECT * FROM {quote_ident(self.name)}")

    def preview(self, max_elements: int = 1_000_000) -> str:
        """The tensor printed like numpy. It is read whole when it has at most ``max_elements``
        elements and its dense array fits the memory budget (``SET memory_limit`` and the memory
        available); otherwise only its corners are read, which numpy would show of it anyway.
        Printing a statement's result never fails (nor undoes the statement) for want of memory."""
        self._check_version()
        size = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        if size <= max_elements:
            try:
                return format_array(self.tensor())
            except OutOfMemoryError:  # the corners fit any budget
                pass
        return format_array(corners(self._con.store.open(self.name), _EDGE), threshold=0)

    def __array__(self, dtype=None, copy=None):
        arr = self.tensor()
        return arr if dtype is None else arr.astype(dtype)

    # -- display -------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        """How a notebook shows the result: an HTML table (tensordb.notebook)."""
        from .notebook import result_html
        return result_html(self)

    def to_xarray(self):
        """The tensor this statement stored, as an xarray DataArray (``con.to_xarray``)."""
        if self.kind != "tensor":
            raise ProgrammingError(f"this {self.kind} result holds no tensor")
        self._check_version()
        return self._con.to_xarray(self.name)

    def torch(self):
        """A tensor result as a torch.Tensor (through DLPack, no copy); rows as a dict of one
        torch.Tensor per column, as DuckDB's ``torch()`` gives them."""
        from ._optional import require
        torch = require("torch", "torch()")
        if self.kind == "tensor":
            return torch.from_dlpack(self.tensor())
        if self.kind != "rows":
            raise ProgrammingError(f"this {self.kind} result holds no tensor and no rows")
        out = {}
        for column, values in self.fetchnumpy().items():
            if values.dtype.kind not in "biufc":
                raise DataError(f"column '{column}' ({values.dtype}) has no torch dtype",
                                hint="torch() takes numeric and boolean columns only")
            out[column] = torch.from_dlpack(np.ascontiguousarray(values))
        return out

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
            return head + "\n" + self.preview()
        if self.kind == "explain":
            return self.text or ""
        if self.kind == "status":
            return self.message or "OK"
        return format_rows(self.columns, self._all())


_EDGE = 3
_WIDE_INTEGERS = ("HUGEINT", "UHUGEINT")


def _python_values(column, sql_type) -> list:
    """A column's values as DuckDB's fetchall gives them: its HUGEINTs (a sum of BIGINTs) come
    through Arrow as decimals of scale 0, and are ints in DuckDB's rows."""
    values = column.to_pylist()
    if sql_type in _WIDE_INTEGERS:
        return [None if v is None else int(v) for v in values]
    return values

_SQL_TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INTEGER", "int64": "BIGINT",
              "bool": "BOOLEAN"}


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
