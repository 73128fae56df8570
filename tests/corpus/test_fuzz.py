"""Seeded fuzzing of extended einsums against an independent numpy oracle (tests/fuzz_oracle.py).

Each seed is one batch: one in-memory connection, label sizes of its own, a pool of stored tensors
(every dtype, NaN and inf, odd and size-1 stored tiles, absent tiles from zeroed blocks and from
COO queries) and ``CASES`` random statements over them, each run through the dialect, ``con.einsum``
or the ``Graph`` API, with random ``WITH (PIECES ...)`` pieces. A failure names the seed, the case and
the statement; rerun it with ``pytest 'tests/corpus/test_fuzz.py::test_fuzz_einsums[seed17]'``.
``--runslow`` adds ten times as many seeds. ``TENSORDB_TEST_EXECUTOR=gpu`` runs it on the GPU
executor (CuPy). docs/architecture.md ("Testing") describes it.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from conftest import corpus_executor
from tensordb.plan.builder import Graph

from tests.fuzz_gen import DTYPES, LABELS, Pool, Statement, Stored, gen_statement, labels_of
from tests.fuzz_oracle import (Answer, Case, Operand, answer, compare, is_plain_product, render_python,
                          render_sql)

SEEDS = 36            # the default run: SEEDS * CASES statements
CASES = 60
SLOW_SEEDS = 400      # --runslow


# -- running ----------------------------------------------------------------------------------

def _ref(op: Operand) -> str:
    """The operand in the dialect: ``T[i,j]``, a slice ``T[i 1:4, j 0:2]``, a gather
    ``E[I[i], j]``."""
    if op.box is not None:
        return f"{op.name}[{', '.join(f'{l} {a}:{b}' for l, (a, b) in zip(op.labels, op.box))}]"
    if op.gather is not None:
        k = op.gather_rank
        return f"{op.name}[{op.gather}[{','.join(op.labels[:k])}]" + \
            "".join(f", {l}" for l in op.labels[k:]) + "]"
    return f"{op.name}[{','.join(op.labels)}]" if op.labels else op.name


def _api_name(op: Operand) -> str:
    """The operand in the Python API: ``'T'``, ``'T[1:4, 0:2]'``, ``'E[I]'``."""
    if op.box is not None:
        return f"{op.name}[{', '.join(f'{a}:{b}' for a, b in op.box)}]"
    if op.gather is not None:
        return f"{op.name}[{op.gather}]"
    return op.name


def sql_text(into: str, st: Statement, rng) -> str:
    c = st.case
    target = f"{into}[{','.join(c.out)}]" if c.out else into
    hint = ""
    if st.pieces:
        hint = " WITH (PIECES " + ", ".join(f"{l} {p}" for l, p in st.pieces.items()) + ")"
    plain_refs = all(op.box is None and op.gather is None for op in c.operands)
    if is_plain_product(c.join, len(c.operands)) and c.agg == "sum" and plain_refs and \
            rng.random() < 0.3:
        spec = ",".join("".join(op.labels) for op in c.operands) + "->" + "".join(c.out)
        return f"{into} = EINSUM('{spec}', {', '.join(op.name for op in c.operands)}){hint}"
    body = render_sql(c.join, [_ref(op) for op in c.operands])
    used = {l for op in c.operands for l in op.labels}
    # A single term (no + or - at the top) sums its free labels by Einstein's convention.
    implicit = c.agg == "sum" and c.join[0] not in ("+", "-", "neg") and rng.random() < 0.3
    if c.agg == "softmax":  # the dialect's only: the statement keeps every label
        body = f"SOFTMAX({body}, {c.over})"
    elif used - set(c.out) and not implicit:
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
    if any(st.case.agg == "softmax" for _, st in unit):
        route = 0.0  # SOFTMAX is the dialect's
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
                join, names = _api_join(st, rng), [_api_name(op) for op in c.operands]
                text = (f"con.einsum({spec!r}, {', '.join(map(repr, names))}, into={into!r}, "
                        f"join={join!r}, agg={c.agg!r}, pieces={st.pieces!r})")
                try:
                    con.einsum(spec, *names, into=into, join=join, agg=c.agg,
                               pieces=st.pieces or None)
                    got.append(con.tensor(into))
                except tensordb.Error as exc:
                    got.append(exc)
            return text, got
        g, lines = Graph(), []
        for into, st in unit:
            c = st.case
            inputs = [(_api_name(op), list(op.labels)) for op in c.operands]
            join = _api_join(st, rng)
            lines.append(f".op({into!r}, {list(c.out)!r}, {inputs!r}, join={join!r}, "
                         f"agg={c.agg!r}, pieces={st.pieces!r})")
            g.op(into, list(c.out), inputs, join=join, agg=c.agg, pieces=st.pieces or None)
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


def run_batch(seed: int, cases: int = CASES, directory=None, memory_limit=None) -> list[str]:
    """Run one seed's statements; the failures, as messages. With a ``directory``, some seeds
    use a database on disk there (payload files, memory-mapped reads) instead of memory; with a
    ``memory_limit``, the executor runs under it (tests/exec/test_memory_budget.py: it spills, waits
    and runs over it all the time)."""
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
    with tensordb.connect(path, workers=int(rng.integers(1, 4)), executor=corpus_executor()) as con:
        if memory_limit is not None:  # the executor's budget only: planning and reading
            con._get_executor().memory_limit = memory_limit  # results keep theirs
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
        f"'tests/corpus/test_fuzz.py::test_fuzz_einsums[seed{seed}]':\n" + "\n".join(failures[:5])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(SEEDS, SEEDS + SLOW_SEEDS), ids=lambda s: f"seed{s}")
def test_fuzz_einsums_slow(seed, tmp_path):
    failures = run_batch(seed, directory=tmp_path)
    assert not failures, f"{len(failures)} failure(s), rerun with pytest --runslow " \
        f"'tests/corpus/test_fuzz.py::test_fuzz_einsums_slow[seed{seed}]':\n" + "\n".join(failures[:5])


# -- the oracle itself --------------------------------------------------------------------------

def _case(out, ops, join, agg="sum"):
    return Case(tuple(out), [Operand(f"T{k}", tuple(ls), a) for k, (ls, a) in enumerate(ops)],
                join, agg)


def test_the_oracle_agrees_with_np_einsum_on_finite_products():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = {l: int(rng.integers(0, 4)) for l in LABELS}
        n = int(rng.integers(1, 4))
        labels = [labels_of(rng, int(rng.integers(0, 4))) for _ in range(n)]
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
