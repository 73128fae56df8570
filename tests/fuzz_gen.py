"""The random statements of the fuzz test (tests/corpus/test_fuzz.py): stored tensors and statement
descriptions (tests/fuzz_oracle.py's ``Case``), drawn from one numpy Generator."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .fuzz_oracle import UNARY, Case, Operand

LABELS = "ijklm"
DTYPES = ("bool", "int32", "int64", "float32", "float64")
MAX_SPACE = 40_000    # elements in a statement's join space
MAX_PROD = 16         # elements a PROD multiplies (beyond, float products under/overflow by order)

INT_LITERALS = (0, 1, 2, 3, -1, -2, 7, 100)
FLOAT_LITERALS = (0.0, 1.0, 0.5, 2.5, -1.5, 3.0, 1e-05)
RARE_LITERALS = (2**31 - 1, 3_000_000_000, 2**63 - 1, 1e+20, 1e+300, 0.1)


# -- tensors ----------------------------------------------------------------------------------

@dataclass
class Stored:
    name: str
    array: np.ndarray
    how: str          # how it was stored, for failure messages


def _values(rng, shape, dtype) -> np.ndarray:
    n = math.prod(shape)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < rng.choice([0.2, 0.5, 0.9]))
    if dtype.startswith("int"):
        arr = np.asarray(rng.integers(-5, 6, size=shape)).astype(dtype)
        if n and rng.random() < 0.15:  # a few near the dtype's limits: wrapping
            info = np.iinfo(dtype)
            flat = arr.reshape(-1)
            for pos in rng.integers(0, n, size=min(n, 3)):
                flat[pos] = rng.choice([info.max, info.min, info.max // 3])
        return arr
    arr = rng.standard_normal(shape) * rng.choice([1.0, 3.0])
    if rng.random() < 0.3:
        arr = np.round(arr)  # exact zeros and small integers
    # + 0.0 turns -0.0 (from rounding) into 0.0: a skipped kernel call stands for +0 where numpy
    # may give -0.0 (docs/sql.md, "Absent tiles and non-finite values"), and 1 / x of it is inf.
    arr = np.array(np.asarray(arr) + 0.0, dtype=dtype)
    if n and rng.random() < 0.15:
        flat = arr.reshape(-1)
        for pos in rng.integers(0, n, size=min(n, int(rng.integers(1, 4)))):
            flat[pos] = rng.choice([np.nan, np.inf, -np.inf])
    return arr


def _tile_shape(rng, shape) -> tuple[int, ...]:
    """Odd and size-1 tiles; at most about 8 tiles along a long dimension."""
    return tuple(1 if n == 0 else int(rng.integers(1, n + 1)) if n <= 8 else
                 int(rng.integers(-(-n // 8), n + 1)) for n in shape)


def _zero_tiles(rng, arr, tile) -> None:
    """Zero random stored tiles (or all of them): they are absent in the catalog."""
    grid = [range(0, n, t) for n, t in zip(arr.shape, tile)]
    p = rng.choice([0.3, 0.6, 1.0])
    for corner in np.ndindex(*[len(g) for g in grid]):
        if rng.random() < p:
            idx = tuple(slice(g[c], g[c] + t) for g, c, t in zip(grid, corner, tile))
            arr[idx] = 0


_SQL_TYPE = {"bool": "BOOLEAN", "int32": "INTEGER", "int64": "BIGINT", "float32": "REAL",
             "float64": "DOUBLE"}


def _coo_query(arr) -> str:
    """A SQL query listing the nonzeros of ``arr`` as coordinates (d0, d1, ..., v)."""
    cols = [f"d{a}" for a in range(arr.ndim)]
    typ = _SQL_TYPE[arr.dtype.name]
    rows = []
    for idx in zip(*np.nonzero(arr)):
        v = arr[idx]
        text = ("true" if v else "false") if arr.dtype == bool else \
            str(int(v)) if arr.dtype.kind == "i" else repr(float(v))
        rows.append("(" + ", ".join(str(int(i)) for i in idx) + f", CAST('{text}' AS {typ}))")
    if not rows:
        sel = ", ".join(f"0 AS {c}" for c in cols)
        return f"SELECT {sel}, CAST(0 AS {typ}) AS v WHERE FALSE"
    return f"SELECT * FROM (VALUES {', '.join(rows)}) t({', '.join(cols)}, v)"


class Pool:
    """Stored tensors of one batch, reused across its statements."""

    def __init__(self, con, rng) -> None:
        self.con, self.rng = con, rng
        self.by_shape: dict[tuple, list[Stored]] = {}
        self.count = 0

    def get(self, shape: tuple[int, ...], dtype: str) -> Stored:
        rng = self.rng
        have = self.by_shape.get(shape, [])
        if have and rng.random() < 0.8:
            return have[int(rng.integers(len(have)))]
        self.count += 1
        name = f"T{self.count}"
        arr = _values(rng, shape, dtype)
        tile = _tile_shape(rng, shape)
        route = rng.random()
        size = math.prod(shape)
        if shape and route < 0.06 and 0 < size <= 64:  # (DuckDB parses each query: costly)
            arr[np.asarray(rng.random(shape)) < rng.choice([0.7, 0.95, 1.0])] = 0
            query = _coo_query(arr)
            dims = ", ".join(str(n) for n in shape)
            tiles = ", ".join(str(t) for t in tile)
            if rng.random() < 0.5:
                self.con.execute(f"CREATE TENSOR {name} FROM ({query}) INDEX "
                                 f"({', '.join(f'd{a}' for a in range(len(shape)))}) VALUE v "
                                 f"SHAPE ({dims}) TILE ({tiles})")
                how = f"CREATE TENSOR FROM (COO query) TILE ({tiles})"
            else:
                self.con.load(name, None, query=query, index=[f"d{a}" for a in range(len(shape))],
                              value="v", shape=shape, tile=tile)
                how = f"con.load(query=COO, tile={tile})"
        elif route < 0.85:
            if size and rng.random() < 0.45:
                _zero_tiles(rng, arr, tile)
            self.con.load(name, arr, tile=tile)
            how = f"con.load(tile={tile})"
        else:
            self.con.load(name, arr)
            how = "con.load()"
        t = Stored(name, arr, how)
        self.by_shape.setdefault(shape, []).append(t)
        return t

    def index(self, rows: np.ndarray) -> Stored:
        """A stored int64 index tensor of a gather (rows may be negative: numpy's)."""
        self.count += 1
        name = f"I{self.count}"
        self.con.load(name, np.asarray(rows, np.int64))
        return Stored(name, np.asarray(rows, np.int64), "con.load() (a gather's index)")


# -- statements -------------------------------------------------------------------------------

def _literal(rng):
    r = rng.random()
    if r < 0.03:
        return RARE_LITERALS[int(rng.integers(len(RARE_LITERALS)))]
    pool = INT_LITERALS if r < 0.5 else FLOAT_LITERALS
    return pool[int(rng.integers(len(pool)))]


_UNARY = sorted(UNARY)
_BINARY = ("+", "-", "*", "/", "max", "min", "pow")
_BINARY_P = np.array([0.24, 0.18, 0.24, 0.12, 0.09, 0.09, 0.04])


def _join(rng, n: int) -> tuple:
    if rng.random() < 0.35:  # a plain product: np.einsum's case
        nodes = [("in", int(k)) for k in rng.permutation(n)]
        while len(nodes) > 1:
            i = int(rng.integers(len(nodes) - 1))
            nodes[i:i + 2] = [("*", nodes[i], nodes[i + 1])]
        return nodes[0]
    nodes = [("in", int(k)) for k in rng.permutation(n)]
    for _ in range(int(rng.integers(0, 3))):
        nodes.insert(int(rng.integers(len(nodes) + 1)),
                     ("in", int(rng.integers(n))) if rng.random() < 0.3 else ("lit", _literal(rng)))
    nodes = [_maybe_unary(rng, e) for e in nodes]
    while len(nodes) > 1:
        i = int(rng.integers(len(nodes) - 1))
        a, b = nodes[i], nodes[i + 1]
        op = str(rng.choice(_BINARY, p=_BINARY_P))
        if a[0] == "lit" and b[0] == "lit":
            op = "*" if op in ("/", "pow") else op  # no Python 1 / 0 between literals
        if op == "pow" and a[0] != "lit" and rng.random() < 0.7:
            # a power by a literal: wraps one node, merges nothing
            nodes[i] = ("pow", a, ("lit", [0, 1, 2, 3, 0.5, 2.0, -1, -1.0][int(rng.integers(8))]))
            continue
        nodes[i:i + 2] = [_maybe_unary(rng, (op, a, b))]
    join = nodes[0]
    if join[0] == "lit":
        join = ("*", join, ("in", 0))
    return join


def _maybe_unary(rng, e):
    if rng.random() < 0.2:
        return (_UNARY[int(rng.integers(len(_UNARY)))], e)
    if e[0] == "in" and rng.random() < 0.12:  # a comparison of stored values: exact
        other = ("lit", _literal(rng)) if rng.random() < 0.7 else ("in", e[1])
        op = _COMPARE[int(rng.integers(len(_COMPARE)))]
        return (op, e, other) if rng.random() < 0.7 else (op, other, e)
    return e


_COMPARE = ("==", "!=", "<", "<=", ">", ">=")


def _inputs(e) -> set[int]:
    if e[0] == "in":
        return {e[1]}
    if e[0] == "lit":
        return set()
    return set().union(*(_inputs(a) for a in e[1:]))


def labels_of(rng, rank: int) -> tuple[str, ...]:
    labels = list(rng.choice(list(LABELS), size=rank, replace=False)) if rank else []
    if rank >= 2 and rng.random() < 0.15:  # a diagonal
        labels[int(rng.integers(1, rank))] = labels[0]
    return tuple(str(l) for l in labels)


@dataclass
class Statement:
    case: Case
    stored: list[Stored]
    pieces: dict[str, int]


def gen_statement(rng, pool: Pool, sizes: dict[str, int], dtypes: tuple[str, ...]) -> Statement:
    while True:
        n = int(rng.choice([1, 2, 3, 4], p=[0.25, 0.4, 0.2, 0.15]))
        labels = [labels_of(rng, int(rng.choice(5, p=[0.1, 0.3, 0.35, 0.15, 0.1]))) for _ in range(n)]
        used = list(dict.fromkeys(l for ls in labels for l in ls))
        if math.prod(sizes[l] for l in used) > MAX_SPACE:
            continue
        out = [l for l in used if rng.random() < 0.5]
        out = [str(l) for l in rng.permutation(out)] if out else []
        agg_labels = [l for l in used if l not in out]
        agg = str(rng.choice(["sum", "prod", "max", "min", "mean", "argmax", "argmin",
                              "logsumexp"], p=[0.32, 0.16, 0.15, 0.15, 0.06, 0.05, 0.03, 0.08]))
        if agg in ("argmax", "argmin") and len(set(agg_labels)) != 1:
            agg = "max"  # an index aggregates exactly one label
        if not agg_labels:
            agg = "sum"  # nothing is aggregated: the aggregate does not matter
        if agg == "prod" and math.prod(sizes[l] for l in agg_labels) > MAX_PROD:
            continue
        break
    stored, operands = [], []
    for ls in labels:
        dtype = dtypes[int(rng.integers(len(dtypes)))]
        shape = tuple(sizes[l] for l in ls)
        r = rng.random()
        if ls and all(shape) and r < 0.08:  # a slice: a box of a larger stored tensor
            grow = [int(rng.integers(0, 3)) for _ in shape]
            t = pool.get(tuple(n + g for n, g in zip(shape, grow)), dtype)
            box = tuple((lo, lo + n) for n, g in zip(shape, grow)
                        for lo in [int(rng.integers(0, g + 1))])
            operands.append(Operand(t.name, ls, t.array[tuple(slice(a, b) for a, b in box)],
                                    box=box))
        elif ls and r < 0.12 and len(set(ls)) == len(ls):  # a gather: E[tok[l0], rest]
            rows = int(rng.integers(1, 7))
            t = pool.get((rows,) + shape[1:], dtype)
            index = pool.index(rng.integers(-rows, rows, size=shape[:1]))
            operands.append(Operand(t.name, ls, t.array[index.array], gather=index.name,
                                    gather_rank=1))
        else:
            t = pool.get(shape, dtype)
            operands.append(Operand(t.name, ls, t.array))
        stored.append(t)
    join = _join(rng, n)
    assert _inputs(join) == set(range(n)), join
    over = None
    if used and rng.random() < 0.05:  # SOFTMAX over one label, keeping every label
        agg, over = "softmax", str(rng.choice(used))
        out = [str(l) for l in rng.permutation(used)]
    pieces = {}
    if rng.random() < 0.4:
        for l in used:
            if rng.random() < 0.6:
                pieces[l] = int(rng.integers(1, min(max(sizes[l], 1), 5) + 1))
    return Statement(Case(tuple(out), operands, join, agg, over), stored, pieces)
