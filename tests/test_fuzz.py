"""Seeded fuzzing of extended einsums against an independent numpy oracle (tests/fuzz_oracle.py).

Each seed is one batch: one in-memory connection, label sizes of its own, a pool of stored tensors
(every dtype, NaN and inf, odd and size-1 stored tiles, absent tiles from zeroed blocks and from
COO queries) and ``CASES`` random statements over them, each run through the dialect, ``con.einsum``
or the ``Graph`` API, with random ``WITH (TILE ...)`` pieces. A failure names the seed, the case and
the statement; rerun it with ``pytest 'tests/test_fuzz.py::test_fuzz_einsums[seed17]'``.
``--runslow`` adds ten times as many seeds. docs/architecture.md ("Testing") describes it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import pytest

import tensordb
from tensordb.plan.builder import Graph

from .fuzz_oracle import (UNARY, Answer, Case, Operand, answer, compare, is_plain_product,
                          render_python, render_sql)

SEEDS = 36            # the default run: SEEDS * CASES statements
CASES = 60
SLOW_SEEDS = 400      # --runslow
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
    # + 0.0 turns -0.0 (from rounding) into 0.0: a zero is stored without its sign (docs/sql.md,
    # "Absent tiles and non-finite values"), so 1 / x of a stored -0.0 is inf, not numpy's -inf.
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
    return e


def _inputs(e) -> set[int]:
    if e[0] == "in":
        return {e[1]}
    if e[0] == "lit":
        return set()
    return set().union(*(_inputs(a) for a in e[1:]))


def _labels(rng, rank: int) -> tuple[str, ...]:
    labels = list(rng.choice(list(LABELS), size=rank, replace=False)) if rank else []
    if rank >= 2 and rng.random() < 0.15:  # a diagonal
        labels[int(rng.integers(1, rank))] = labels[0]
    return tuple(str(l) for l in labels)


@dataclass
class Statement:
    case: Case
    stored: list[Stored]
    hints: dict[str, int]


def gen_statement(rng, pool: Pool, sizes: dict[str, int], dtypes: tuple[str, ...]) -> Statement:
    while True:
        n = int(rng.choice([1, 2, 3, 4], p=[0.25, 0.4, 0.2, 0.15]))
        labels = [_labels(rng, int(rng.choice(5, p=[0.1, 0.3, 0.35, 0.15, 0.1]))) for _ in range(n)]
        used = list(dict.fromkeys(l for ls in labels for l in ls))
        if math.prod(sizes[l] for l in used) > MAX_SPACE:
            continue
        out = [l for l in used if rng.random() < 0.5]
        out = [str(l) for l in rng.permutation(out)] if out else []
        agg_labels = [l for l in used if l not in out]
        agg = str(rng.choice(["sum", "prod", "max", "min"], p=[0.4, 0.2, 0.2, 0.2]))
        if not agg_labels:
            agg = "sum"  # nothing is aggregated: the aggregate does not matter
        if agg == "prod" and math.prod(sizes[l] for l in agg_labels) > MAX_PROD:
            continue
        break
    stored = []
    for ls in labels:
        dtype = dtypes[int(rng.integers(len(dtypes)))]
        stored.append(pool.get(tuple(sizes[l] for l in ls), dtype))
    join = _join(rng, n)
    assert _inputs(join) == set(range(n)), join
    operands = [Operand(t.name, ls, t.array) for t, ls in zip(stored, labels)]
    hints = {}
    if rng.random() < 0.4:
        for l in used:
            if rng.random() < 0.6:
                hints[l] = int(rng.integers(1, min(max(sizes[l], 1), 5) + 1))
    return Statement(Case(tuple(out), operands, join, agg), stored, hints)


# -- running ----------------------------------------------------------------------------------

def _ref(op: Operand) -> str:
    return f"{op.name}[{','.join(op.labels)}]" if op.labels else op.name


def sql_text(into: str, st: Statement, rng) -> str:
    c = st.case
    target = f"{into}[{','.join(c.out)}]" if c.out else into
    hint = ""
    if st.hints:
        hint = " WITH (TILE (" + ", ".join(f"{l} {p}" for l, p in st.hints.items()) + "))"
    if is_plain_product(c.join, len(c.operands)) and c.agg == "sum" and rng.random() < 0.3:
        spec = ",".join("".join(op.labels) for op in c.operands) + "->" + "".join(c.out)
        return f"{into} = EINSUM('{spec}', {', '.join(op.name for op in c.operands)}){hint}"
    body = render_sql(c.join, [_ref(op) for op in c.operands])
    used = {l for op in c.operands for l in op.labels}
    # A single term (no + or - at the top) sums its free labels by Einstein's convention.
    implicit = c.agg == "sum" and c.join[0] not in ("+", "-", "neg") and rng.random() < 0.3
    if used - set(c.out) and not implicit:
        body = f"{c.agg.upper()}({body})"
    return f"{target} = {body}{hint}"


def _api_join(st: Statement, rng) -> str | None:
    c = st.case
    # join=None is x0 * x1 * ... in that order: the same as any plain product only under SUM
    # (np.einsum's case); under MAX, MIN, PROD NumPy's order of the products matters.
    plain = is_plain_product(c.join, len(c.operands)) and c.agg == "sum"
    return None if plain and rng.random() < 0.5 else render_python(c.join)


def run_unit(con, unit: list[tuple[str, Statement]], rng) -> tuple[str, list]:
    """Run statements by a random route: several dialect statements in one ``execute`` (one
    unit, planned as one graph), several operations in one ``Graph``, or one ``con.einsum``.
    Returns (what was run, per statement the result array or the exception)."""
    route = rng.random()
    text = ""
    try:
        if route < 0.5:
            text = ";\n".join(sql_text(into, st, rng) for into, st in unit)
            last = con.execute(text).tensor()
            return text, [con.tensor(into) for into, _ in unit[:-1]] + [last]
        if route < 0.75 or len(unit) == 1 and route < 0.85:
            got = []
            for into, st in unit:
                c = st.case
                spec = ",".join("".join(op.labels) for op in c.operands) + "->" + "".join(c.out)
                join, names = _api_join(st, rng), [op.name for op in c.operands]
                text = (f"con.einsum({spec!r}, {', '.join(map(repr, names))}, into={into!r}, "
                        f"join={join!r}, agg={c.agg!r}, tile={st.hints!r})")
                try:
                    con.einsum(spec, *names, into=into, join=join, agg=c.agg,
                               tile=st.hints or None)
                    got.append(con.tensor(into))
                except tensordb.Error as exc:
                    got.append(exc)
            return text, got
        g, lines = Graph(), []
        for into, st in unit:
            c = st.case
            inputs = [(op.name, list(op.labels)) for op in c.operands]
            join = _api_join(st, rng)
            lines.append(f".op({into!r}, {list(c.out)!r}, {inputs!r}, join={join!r}, "
                         f"agg={c.agg!r}, tile={st.hints!r})")
            g.op(into, list(c.out), inputs, join=join, agg=c.agg, tile=st.hints or None)
        text = "con.run(Graph()" + "\n    ".join(lines) + ")"
        con.run(g)
        return text, [con.tensor(into) for into, _ in unit]
    except tensordb.Error as exc:
        return text, [exc] * len(unit)


def _describe(st: Statement) -> str:
    sizes = {l: n for op in st.case.operands for l, n in zip(op.labels, op.array.shape)}
    lines = [f"  label sizes {sizes}"]
    for t, op in zip(st.stored, st.case.operands):
        lines.append(f"  {t.name}[{','.join(op.labels)}] {t.array.dtype} {t.array.shape} "
                     f"{t.how}: {np.array2string(t.array, threshold=40, edgeitems=2)}")
    return "\n".join(lines)


def run_batch(seed: int, cases: int = CASES, directory=None) -> list[str]:
    """Run one seed's statements; the failures, as messages. With a ``directory``, some seeds
    use a database on disk there (payload files, memory-mapped reads) instead of memory."""
    rng = np.random.default_rng(seed)
    sizes = {l: int(rng.choice([0, 1, 2, 3, 4, 5, 7], p=[0.04, 0.16, 0.2, 0.2, 0.15, 0.15, 0.1]))
             for l in LABELS}
    if rng.random() < 0.5:  # one large-ish label
        sizes[str(rng.choice(list(LABELS)))] = int(rng.choice([16, 31, 64, 100, 255]))
    if rng.random() < 0.2:  # an empty label
        sizes[str(rng.choice(list(LABELS)))] = 0
    mode = rng.random()
    dtypes = DTYPES if mode < 0.6 else (str(rng.choice(DTYPES)),)
    failures = []
    on_disk = directory is not None and rng.random() < 0.3
    path = os.path.join(directory, f"fuzz{seed}.tdb") if on_disk else None
    with tensordb.connect(path, workers=int(rng.integers(1, 4))) as con:
        con.set("tiling", str(rng.choice(["eindecomp", "eindecomp", "data-parallel", "even"])))
        pool = Pool(con, rng)
        k = 0
        while k < cases:
            # A unit of statements that numpy answers runs together; one numpy refuses, alone.
            unit = []
            for _ in range(int(rng.integers(1, 5))):
                st = gen_statement(rng, pool, sizes, dtypes)
                unit.append((f"O{k}", st, answer(st.case)))
                k += 1
            alone = [u for u in unit if u[2].error is not None]
            groups = [[u] for u in alone] + ([[u for u in unit if u[2].error is None]]
                                             if len(alone) < len(unit) else [])
            for group in groups:
                chained = _chain(rng, group)
                text, results = run_unit(con, [(into, st) for into, st, _ in group], rng)
                # A statement that reads an earlier one's output is checked against the output
                # the engine gave (that output is checked against numpy on its own).
                for t, p, u in chained:
                    into, st, _ = group[t]
                    if isinstance(results[u], np.ndarray):
                        st.case.operands[p].array = st.stored[p].array = results[u]
                        group[t] = (into, st, answer(st.case))
                for (into, st, want), got in zip(group, results):
                    problem = _check(con, into, want, got)
                    if problem:
                        failures.append(f"seed {seed} {into}: {problem}\n  {text}\n{_describe(st)}")
    return failures


def _chain(rng, group: list) -> list[tuple[int, int, int]]:
    """Let some statements of a unit read the output of an earlier one of the same unit (an
    intermediate of the graph the unit is planned as): operand p of statement t becomes the
    output of statement u, when the shapes agree and numpy still accepts the statement with
    its dtype. Returns the (t, p, u) made."""
    made = []
    for t in range(1, len(group)):
        into, st, want = group[t]
        # POW of ints fails on negative exponents in the data, which the output's values (not
        # known before the unit runs) may hold: such a statement reads stored tensors only.
        if rng.random() < 0.5 or "'pow'" in repr(st.case.join):
            continue
        for p, op in enumerate(st.case.operands):
            earlier = [u for u in range(t) if group[u][2].value.shape == op.array.shape]
            if not earlier:
                continue
            u = earlier[int(rng.integers(len(earlier)))]
            name, value = group[u][0], group[u][2].value
            old_op, old_stored = op, st.stored[p]
            st.case.operands[p] = Operand(name, op.labels, np.zeros_like(value))
            st.stored[p] = Stored(name, st.case.operands[p].array,
                                  f"the output of {name}, earlier in the unit")
            again = answer(st.case)
            if again.error is None:
                group[t] = (into, st, again)
                made.append((t, p, u))
            else:
                st.case.operands[p], st.stored[p] = old_op, old_stored
            break
    return made


def _check(con, into, want, got) -> str | None:
    if want.error is not None:
        if not isinstance(got, tensordb.Error):
            return f"numpy refuses ({want.why}) but the engine answered {got!r}"
        if want.error == "data" and not isinstance(got, tensordb.DataError):
            return f"expected a DataError ({want.why}), got {type(got).__name__}: {got}"
        try:
            con.tensor(into)
        except tensordb.CatalogError:
            return None
        return f"{into} was stored although the statement failed"
    if isinstance(got, BaseException):
        return f"the engine raised {type(got).__name__}: {got}"
    return compare(got, want)


@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed{s}")
def test_fuzz_einsums(seed, tmp_path):
    failures = run_batch(seed, directory=tmp_path)
    assert not failures, f"{len(failures)} failure(s), rerun with pytest " \
        f"'tests/test_fuzz.py::test_fuzz_einsums[seed{seed}]':\n" + "\n".join(failures[:5])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(SEEDS, SEEDS + SLOW_SEEDS), ids=lambda s: f"seed{s}")
def test_fuzz_einsums_slow(seed, tmp_path):
    failures = run_batch(seed, directory=tmp_path)
    assert not failures, f"{len(failures)} failure(s), rerun with pytest --runslow " \
        f"'tests/test_fuzz.py::test_fuzz_einsums_slow[seed{seed}]':\n" + "\n".join(failures[:5])


# -- the oracle itself --------------------------------------------------------------------------

def _case(out, ops, join, agg="sum"):
    return Case(tuple(out), [Operand(f"T{k}", tuple(ls), a) for k, (ls, a) in enumerate(ops)],
                join, agg)


def test_the_oracle_agrees_with_np_einsum_on_finite_products():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = {l: int(rng.integers(0, 4)) for l in LABELS}
        n = int(rng.integers(1, 4))
        labels = [_labels(rng, int(rng.integers(0, 4))) for _ in range(n)]
        used = list(dict.fromkeys(l for ls in labels for l in ls))
        out = [l for l in used if rng.random() < 0.5]
        arrays = [rng.standard_normal(tuple(sizes[l] for l in ls)) for ls in labels]
        join = ("in", 0)
        for k in range(1, n):
            join = ("*", join, ("in", k))
        got = answer(_case(out, list(zip(labels, arrays)), join))
        spec = ",".join("".join(ls) for ls in labels) + "->" + "".join(out)
        want = np.einsum(spec, *arrays)
        assert compare(np.asarray(want), got) is None, spec
        assert compare(got.value, Answer(value=np.asarray(want), err=np.abs(want) * 1e-12)) is None


def test_the_oracle_follows_numpy_dtype_rules_and_empty_aggregates():
    i32 = np.array([[1, 2], [3, 2**31 - 1]], np.int32)
    b = np.array([True, False])
    e = np.zeros((2, 0))
    # int32 * 2 stays int32 (and wraps); 2.5 * int32 is float64; sum keeps the join's dtype
    r = answer(_case("ij", [("ij", i32)], ("*", ("in", 0), ("lit", 2))))
    assert r.value.dtype == np.int32 and r.value[1, 1] == np.int32(-2)
    assert answer(_case("i", [("ij", i32)], ("*", ("lit", 2.5), ("in", 0)))).value.dtype == np.float64
    assert answer(_case("i", [("ij", i32)], ("in", 0))).value.dtype == np.int32
    # bool: a sum is an OR, RELU is MAX(x, 0) (int64), - is refused, EXP is float16 (refused)
    assert answer(_case("", [("i", b)], ("in", 0))).value == np.True_
    assert answer(_case("i", [("i", b)], ("relu", ("in", 0)))).value.dtype == np.int64
    assert answer(_case("i", [("i", b)], ("neg", ("in", 0)))).error == "any"
    assert answer(_case("i", [("i", b)], ("exp", ("in", 0)))).error == "data"
    # over an empty label: SUM 0, PROD 1, MAX and MIN a DataError
    assert np.array_equal(answer(_case("i", [("ij", e)], ("in", 0))).value, [0.0, 0.0])
    assert np.array_equal(answer(_case("i", [("ij", e)], ("in", 0), "prod")).value, [1.0, 1.0])
    assert answer(_case("i", [("ij", e)], ("in", 0), "max")).error == "data"
    # a sum of products next to an inf is the sum of the products (not np.einsum's grouping)
    a, inf = np.array([2.0, -1.0]), np.array([np.inf])
    assert np.isnan(answer(_case("", [("i", a), ("k", inf)], ("*", ("in", 0), ("in", 1)))).value)


def test_compare_finds_wrong_values_dtypes_nans_and_infinities():
    want = answer(_case("i", [("ij", np.array([[1.0, 2.0], [np.inf, 1.0], [np.nan, 0.0]]))],
                        ("in", 0)))
    good = np.array([3.0, np.inf, np.nan])
    assert compare(good, want) is None
    assert compare(good.astype(np.float32), want).startswith("dtype")
    assert "tolerance" in compare(np.array([3.0001, np.inf, np.nan]), want)
    assert "NaN" in compare(np.array([3.0, np.inf, 1.0]), want)
    assert "infinities" in compare(np.array([3.0, -np.inf, np.nan]), want)
    ints = answer(_case("i", [("ij", np.array([[1, 2]], np.int64))], ("in", 0)))
    assert compare(np.array([3], np.int64), ints) is None
    assert "exact" in compare(np.array([4], np.int64), ints)
