"""Bad input gets a tensordb error and the machine stays responsive (issue 9, items 11-13).

Every bad input here used to raise a plain Python exception (IndexError, RecursionError,
ValueError, MemoryError) or hang; Ctrl-C used to wait for the whole query. Results are checked
against numpy, stored state against a reopened database.
"""
from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb.config import format_bytes, max_workers
from tensordb.dialect.ast import CHAIN_LIMIT
from tensordb.plan.scalar import MAX_EXPRESSION_DEPTH
from tensordb.storage import directory

ROOT = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- item 11: no Python exception other than tensordb.Error ----------------------------------

def test_a_join_naming_a_missing_operand_is_a_binder_error(con, snapshot):
    con.load("A", np.ones((2, 3)))
    con.load("B", np.ones((3, 2)))
    before = snapshot(con)
    with pytest.raises(tensordb.BinderError, match=r"x5.*2 operand\(s\): x0\.\.x1"):
        con.einsum("ij,jk->ik", "A", "B", into="C", join="x5")
    with pytest.raises(tensordb.BinderError, match="x2"):
        con.run(tensordb.Graph().op("C", "ik", [("A", "ij"), ("B", "jk")], join="x0 * x2"))
    assert snapshot(con) == before
    con.einsum("ij,jk->ik", "A", "B", into="C", join="x0 + x1", agg="max")  # still usable
    np.testing.assert_array_equal(con.tensor("C"), np.full((2, 2), 2.0))


def _nested_chains(levels: int) -> str:
    text = "v[i]"
    for _ in range(levels):  # each level: a 100-operator chain around the one inside
        text = " + ".join(["v[i]"] * CHAIN_LIMIT) + " + (" + text + ")"
    return "C[i] = " + text


TOO_DEEP = {
    "3000 parentheses": "C[i] = " + "(" * 3000 + "v[i]" + ")" * 3000,
    "long chains nested in each other": _nested_chains(3),
    "3000 nested calls": "C[i] = " + "RELU(" * 3000 + "v[i]" + ")" * 3000,
    "3000 signs": "C[i] = " + "- " * 3000 + "v[i]",
    "deep inside an aggregate": "C[i] = SUM(" + "(" * 3000 + "M[i,j]" + ")" * 3000 + ")",
}


@pytest.mark.parametrize("text", TOO_DEEP.values(), ids=TOO_DEEP.keys())
def test_expressions_nested_too_deeply_are_parser_errors_with_a_caret(con, snapshot, text):
    con.load("v", np.arange(3.0))
    con.load("M", np.ones((3, 3)))
    before = snapshot(con)
    with pytest.raises(tensordb.ParserError, match="nested too deeply") as info:
        con.execute(text)
    err = info.value
    assert err.statement == text and err.span is not None
    assert "LINE 1:" in str(err) and "^" in str(err)
    with pytest.raises(tensordb.ParserError, match="nested too deeply"):
        con.explain(text)
    assert snapshot(con) == before


def test_expressions_just_inside_the_depth_bound_compute_numpys_answer(con):
    rng = np.random.default_rng(7)
    v, m = rng.standard_normal(5), rng.standard_normal((5, 5))
    con.load("v", v)
    con.load("M", m)
    n = MAX_EXPRESSION_DEPTH - 5  # a flat sum: one level per '+'
    con.execute("C[i] = " + " + ".join(f"v[i] * {k}" for k in range(n)))
    expect = v * 0
    for k in range(n):  # numpy, left to right as written
        expect = expect + v * k
    np.testing.assert_allclose(con.tensor("C"), expect, rtol=1e-12)
    depth = MAX_EXPRESSION_DEPTH - 10
    con.execute("D[i] = SUM(" + "(" * depth + "M[i,j] * v[j]" + ")" * depth + ")")
    np.testing.assert_allclose(con.tensor("D"), m @ v, rtol=1e-12)
    con.execute("E[i] = " + "RELU(" * (depth // 2) + "v[i]" + ")" * (depth // 2))
    np.testing.assert_array_equal(con.tensor("E"), np.maximum(v, 0))


def test_a_20000_term_sum_computes_numpys_answer_left_to_right(con):
    """A flat chain has no depth limit: it is computed in parts of CHAIN_LIMIT operands, in
    numpy's order (and dtype) for the whole chain."""
    rng = np.random.default_rng(8)
    v, m = rng.standard_normal(7), rng.standard_normal((7, 7))
    iv = rng.integers(-1000, 1000, 7).astype(np.int32)
    con.load("v", v)
    con.load("M", m)
    con.load("I", iv)
    con.execute("C[i] = " + " + ".join(["v[i]"] * 20000))
    expect = v
    for _ in range(19999):
        expect = expect + v
    np.testing.assert_array_equal(con.tensor("C"), expect)
    text, expect = "D[i] = 0.25 * v[i]", 0.25 * v  # mixed signs, products and quotients
    for k in range(1, 350):
        sign, (term, x) = "-" if k % 3 else "+", \
            (f"v[i] / {k + 1}", v / (k + 1)) if k % 2 else (f"v[i] * {k % 5}", v * (k % 5))
        text += f" {sign} {term}"
        expect = expect - x if sign == "-" else expect + x
    con.execute(text)
    np.testing.assert_array_equal(con.tensor("D"), expect)
    con.execute("E[i] = " + " + ".join(["I[i]"] * 700))
    expect = iv
    for _ in range(699):
        expect = expect + iv
    assert con.tensor("E").dtype == expect.dtype == np.int32
    np.testing.assert_array_equal(con.tensor("E"), expect)
    con.execute("F[i] = SUM(" + " + ".join(["M[i,j] * v[j]"] * 250) + ")")  # in one aggregate
    expect = m * v
    for _ in range(249):
        expect = expect + m * v
    np.testing.assert_allclose(con.tensor("F"), expect.sum(axis=1), rtol=1e-12)
    con.execute("G[i] = " + " + ".join(["M[i,j] * v[j]"] * 250))  # Einstein: each term summed
    np.testing.assert_allclose(con.tensor("G"), 250 * (m @ v), rtol=1e-12)


@pytest.mark.parametrize("join", ["+".join(["x0"] * 20000), "(" * 3000 + "x0" + ")" * 3000,
                                  "- " * 3000 + "x0", "+".join(["x0"] * 300)],
                         ids=["20000 terms", "3000 parentheses", "3000 signs", "300 terms"])
def test_python_joins_nested_too_deeply_are_binder_errors(con, join):
    con.load("A", np.ones((2, 2)))
    with pytest.raises(tensordb.BinderError, match="nested too deeply"):
        con.einsum("ij->ij", "A", into="B", join=join)
    assert not con.store.has("B")
    con.einsum("ij->ij", "A", into="B", join="+".join(["x0"] * 100))
    np.testing.assert_array_equal(con.tensor("B"), np.full((2, 2), 100.0))


def _npy_bytes(header: str, payload: bytes = b"\0" * 800) -> bytes:
    header = header + " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + payload


BAD_HEADERS = {
    "negative shape": ("{'descr': '<f8', 'fortran_order': False, 'shape': (-1, 100), }",
                       r"shape \(-1, 100\)"),
    "huge shape": ("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }",
                   "truncated"),
    "bool in shape": ("{'descr': '<f8', 'fortran_order': False, 'shape': (True, 2), }", "shape"),
    "float in shape": ("{'descr': '<f8', 'fortran_order': False, 'shape': (2.5, 1), }", "shape"),
    "shape not a tuple": ("{'descr': '<f8', 'fortran_order': False, 'shape': 7, }", "shape"),
    "bad descr": ("{'descr': 'zz9', 'fortran_order': False, 'shape': (2, 2), }", "descr"),
    "wrong keys": ("{'a': 1}", "keys"),
    "not a dict": ("not a header at all", "header"),
}


@pytest.mark.parametrize("suffix", ["npy", "npz"])
@pytest.mark.parametrize("header,match", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_corrupt_npy_headers_are_data_errors(con, snapshot, tmp_path, suffix, header, match):
    path = tmp_path / f"bad.{suffix}"
    if suffix == "npy":
        path.write_bytes(_npy_bytes(header))
    else:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("a.npy", _npy_bytes(header))
    before = snapshot(con)
    with pytest.raises(tensordb.DataError, match=match) as info:
        con.load("T", str(path))
    assert str(path) in str(info.value)
    with pytest.raises(tensordb.DataError, match=match):
        con.execute(f"LOAD TENSOR T FROM '{path}'")
    assert snapshot(con) == before


def test_a_tensor_too_large_for_memory_is_refused_before_allocating(con):
    con.execute("CREATE TENSOR Big (1000000, 1000000) FLOAT64")  # 8e12 bytes, all absent tiles
    with pytest.raises(tensordb.OutOfMemoryError) as info:
        con.tensor("Big")
    msg = str(info.value)
    assert "'Big'" in msg and "(1000000, 1000000)" in msg and format_bytes(8 * 10 ** 12) in msg
    con.execute("CREATE TENSOR S (1000, 1000) FLOAT64")
    con.set("memory_limit", "1MB")  # 8 MB do not fit a 1 MB budget
    with pytest.raises(tensordb.OutOfMemoryError, match=r"memory_limit.*976\.6 KiB"):
        con.tensor("S")
    con.set("memory_limit", None)
    np.testing.assert_array_equal(con.tensor("S"), np.zeros((1000, 1000)))


@pytest.mark.parametrize("value", ["100000", "0", "-3", "1e400", "'many'"])
def test_workers_out_of_range_are_refused_with_the_range(con, value):
    before = con.settings.workers
    with pytest.raises(tensordb.ProgrammingError, match=f"from 1 to {max_workers()}"):
        con.execute(f"SET workers = {value}")
    assert con.settings.workers == before
    with pytest.raises(tensordb.ProgrammingError, match=f"from 1 to {max_workers()}"):
        tensordb.connect(workers=100000)


def test_the_largest_worker_count_plans_and_runs_a_matmul():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((400, 400))
    with tensordb.connect() as con:
        con.execute(f"SET workers = {max_workers()}")
        con.load("A", a)
        con.execute("C[i,k] = A[i,j] * A[j,k]")
        np.testing.assert_allclose(con.tensor("C"), a @ a, rtol=1e-9, atol=1e-9)


WARNING_QUERIES = [  # (statement, numpy's answer from the arrays X and I)
    ("S[i,k] = SUM(X[i,j] * X[j,k])", lambda X, I: X @ X),
    ("S[i,j] = X[i,j] * 1e300", lambda X, I: X * 1e300),
    ("S[i,j] = X[i,j] / X[j,i]", lambda X, I: X / X.T),
    ("S[i] = SUM(X[i,j] / 0)", lambda X, I: (X / 0).sum(axis=1)),
    ("S[i,j] = LOG(X[i,j])", lambda X, I: np.log(X)),
    ("S[i,j] = SQRT(X[i,j] - 1e308)", lambda X, I: np.sqrt(X - 1e308)),
    ("S[i] = PROD(X[i,j] * 1e200)", lambda X, I: (X * 1e200).prod(axis=1)),
    ("S[i] = MAX(X[i,j] / X[i,j])", lambda X, I: (X / X).max(axis=1)),
    ("S[i,k] = SUM(I[i,j] * I[j,k])", lambda X, I: I @ I),
]


@pytest.mark.parametrize("stmt,oracle", WARNING_QUERIES, ids=[q for q, _ in WARNING_QUERIES])
def test_kernels_give_numpys_answer_without_runtime_warnings(stmt, oracle):
    X = np.array([[1e308, 1e308, 0.0, -1e308], [0, 1, np.inf, -np.inf],
                  [np.nan, 1, 2, 3], [0, -1, 0, 5]])
    I = np.full((4, 4), 2 ** 62, dtype=np.int64)
    with np.errstate(all="ignore"):
        expect = oracle(X, I)
    with tensordb.connect(workers=2) as con, warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning anywhere (workers too) would raise
        con.load("X", X, tile=(2, 2))
        con.load("I", I, tile=(2, 2))
        con.execute(stmt)
        np.testing.assert_allclose(con.tensor("S"), expect, rtol=1e-12)


API_MISUSE = {
    "pieces= not a mapping": lambda con: con.einsum("ij,jk->ik", "A", "B", into="C", pieces=5),
    "join= not a string": lambda con: con.einsum("ij,jk->ik", "A", "B", into="C", join=5),
    "query not a string": lambda con: con.sql(5),
    "export path not a path": lambda con: con.export("A", 5),
    "memory_limit NaN": lambda con: con.set("memory_limit", float("nan")),
    "memory_limit infinite": lambda con: con.set("memory_limit", float("inf")),
    "workers 2.5": lambda con: con.set("workers", 2.5),
}


@pytest.mark.parametrize("call", API_MISUSE.values(), ids=API_MISUSE.keys())
def test_python_api_misuse_is_a_programming_error(con, snapshot, call):
    con.load("A", np.ones((2, 3)))
    con.load("B", np.ones((3, 2)))
    before, settings = snapshot(con), con.settings.items()
    with pytest.raises(tensordb.ProgrammingError):
        call(con)
    assert snapshot(con) == before and con.settings.items() == settings


# -- item 12: Ctrl-C stops a running query ----------------------------------------------------

N = 2000  # a 2000^3 min-plus product: many seconds of kernel time in one tile


def _big(con):
    con.load("D", np.random.default_rng(0).random((N, N)), tile=(N, N))


def _cpu_seconds_over(interval: float) -> float:
    c0 = time.process_time()
    time.sleep(interval)
    return time.process_time() - c0


class _Stop(Exception):
    pass


@pytest.mark.parametrize("kind", ["min-plus", "elementwise"])
def test_non_blas_kernels_check_for_cancellation_between_chunks(kind):
    """A kernel calls ``check`` at least once per chunk of CHUNK_ELEMENTS (a min-plus tile in
    cache-sized blocks, more often) and stops when it raises; with a check that never raises,
    the chunked answer is numpy's."""
    from tensordb.exec.kernels import CHUNK_ELEMENTS, KernelSpec
    from tensordb.plan.ir import EinOp
    from tensordb.plan.scalar import parse_join
    rng = np.random.default_rng(5)
    if kind == "min-plus":
        n = 300  # a 300^3 join space: 27M elements, several chunks
        a, b = rng.random((n, n)), rng.random((n, n))
        op = EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], {"i": n, "j": n, "k": n},
                               join=parse_join("x0 + x1"), agg="min")
        expect = (a[:, :, None] + b[None, :, :]).min(axis=1)
        space = n ** 3
    else:
        n = 2100  # one tile of 4.4M elements; the join ignores a label of x1 (a broadcast)
        a, b = rng.standard_normal((n, n)), rng.standard_normal(n)
        op = EinOp.contraction("Y", "ij", [("A", "ij"), ("b", "j")], {"i": n, "j": n},
                               join=parse_join("relu(x0 - x1) * 2"))
        expect = np.maximum(a - b, 0) * 2
        space = n * n
    spec = KernelSpec(op)
    chunks = -(-space // CHUNK_ELEMENTS)
    calls = []
    out = spec([a, b], [a.shape, b.shape], expect.shape, check=lambda done=None: calls.append(done))
    np.testing.assert_allclose(out, expect, rtol=1e-12)
    assert len(calls) >= chunks  # at least once per chunk
    # between chunks, the fraction of the call done so far (the CLI's progress): 0 up to below 1
    done = [d for d in calls if d is not None]
    assert len(done) >= chunks and done[0] == 0 and done == sorted(done) and done[-1] < 1

    def stop_at_the_third(done=None):
        calls.append(1)
        if len(calls) == 3:
            raise _Stop
    calls.clear()
    with pytest.raises(_Stop):
        spec([a, b], [a.shape, b.shape], expect.shape, check=stop_at_the_third)
    assert len(calls) == 3  # it stopped there, with chunks left


def test_a_large_elementwise_tile_computes_numpys_answer(con):
    rng = np.random.default_rng(6)
    x, c = rng.standard_normal((2100, 2100)).astype(np.float32), rng.standard_normal(2100)
    con.load("X", x, tile=(2100, 2100))
    con.load("c", c)
    con.execute("Y[i,j] = RELU(X[i,j] - c[j]) / X[i,j] WITH (PIECES i 1, j 1)")
    with np.errstate(all="ignore"):
        expect = np.maximum(x - c, 0) / x
    got = con.tensor("Y")
    assert got.dtype == expect.dtype
    np.testing.assert_allclose(got, expect, rtol=1e-12)


@pytest.mark.parametrize("how", ["python", "dialect"])
def test_keyboard_interrupt_stops_a_query_and_leaves_the_connection_usable(db_path, how):
    with tensordb.connect(db_path) as con:
        _big(con)
        files = sorted(os.listdir(db_path / "tiles"))
        timer = threading.Timer(1.0, _thread.interrupt_main)
        t0 = time.perf_counter()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            if how == "python":
                con.einsum("ik,kj->ij", "D", "D", into="P", join="x0 + x1", agg="min")
            else:
                con.execute("P[i,j] = MIN(D[i,k] + D[k,j])")
        assert time.perf_counter() - t0 < 5.0
        assert _cpu_seconds_over(0.5) < 0.25  # the workers are idle, not finishing the query
        assert not con.store.has("P")
        assert sorted(os.listdir(db_path / "tiles")) == files
        a = np.arange(12.0).reshape(3, 4)
        con.load("A", a)
        con.execute("B[i,k] = A[i,j] * A[k,j]")
        np.testing.assert_allclose(con.tensor("B"), a @ a.T)
    with tensordb.connect(db_path) as con:
        assert sorted(t["name"] for t in con.tensors()) == ["A", "B", "D"]


def test_a_real_sigint_stops_a_python_script_and_stores_nothing(db_path):
    with tensordb.connect(db_path) as con:
        _big(con)
    files = sorted(os.listdir(db_path / "tiles"))
    script = textwrap.dedent(f"""
        import sys, tensordb
        con = tensordb.connect({str(db_path)!r})
        print("running", flush=True)
        try:
            con.einsum("ik,kj->ij", "D", "D", into="P", join="x0 + x1", agg="min")
        except KeyboardInterrupt:
            print("cancelled", flush=True)
            con.close()
            sys.exit(3)
        print("finished", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout.readline().strip() == "running"
        time.sleep(1.0)  # well inside the kernel
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert time.perf_counter() - t0 < 5.0, err
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 3, err
    assert out.strip() == "cancelled"
    with tensordb.connect(db_path) as con:
        assert [t["name"] for t in con.tensors()] == ["D"]
    assert sorted(os.listdir(db_path / "tiles")) == files


# -- item 13: smaller wrong messages ------------------------------------------------------------

@pytest.mark.parametrize("holder", ["duckdb read-only", "writer"])
def test_the_lock_holder_is_described_by_how_it_has_the_database_open(db_path, holder,
                                                                      monkeypatch):
    tensordb.connect(db_path).close()
    if holder == "writer":
        script = (f"import tensordb, time; c = tensordb.connect({str(db_path)!r}); "
                  "print('open', flush=True); time.sleep(60)")
    else:  # DuckDB itself holding the catalog read-only (a tensordb reader holds no lock)
        script = (f"import duckdb, time; c = duckdb.connect({str(db_path / 'catalog.duckdb')!r}, "
                  "read_only=True); print('open', flush=True); time.sleep(60)")
    monkeypatch.setattr(directory, "READER_GRACE", 0.2)  # how long a writer waits for a reader
    holder_proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                   text=True, env=_env())
    try:
        assert holder_proc.stdout.readline().strip() == "open"
        with pytest.raises(tensordb.OperationalError) as info:
            tensordb.connect(db_path)
    finally:
        holder_proc.kill()
        holder_proc.wait()
    msg = str(info.value)
    assert f"process {holder_proc.pid}" in msg
    if holder != "writer":
        assert "has it open read-only" in msg and "for writing" not in msg
    else:
        assert "has it open for writing" in msg


def test_a_tensordb_reader_holds_no_lock_a_writer_meets(db_path):
    with tensordb.connect(db_path) as con:
        con.load("A", np.arange(4.0))
    script = (f"import tensordb, time; c = tensordb.connect({str(db_path)!r}, read_only=True); "
              "c.tensor('A'); print('open', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout.readline().strip() == "open"
        with tensordb.connect(db_path) as con:  # opens at once beside the reader
            con.load("A", np.arange(4.0) * 2, replace=True)
            np.testing.assert_array_equal(con.tensor("A"), np.arange(4.0) * 2)
    finally:
        holder.kill()
        holder.wait()


FROM_QUERIES = {
    "comment on the last line": "SELECT i, i * 1.5 AS value FROM range(4) t(i)\n  -- the last line\n",
    "comment right after the query": "SELECT i, i * 2.5 AS value FROM range(3) t(i) -- note\n",
    "dollar quotes": "SELECT i, length($$a)b'c$$) * 1.0 + i AS value FROM range(3) t(i)",
    "tagged dollar quotes": "SELECT i, length($x$))$x$) * 1.0 AS value FROM range(2) t(i)",
}


@pytest.mark.parametrize("query", FROM_QUERIES.values(), ids=FROM_QUERIES.keys())
def test_from_subqueries_with_comments_and_dollar_quotes(con, query):
    rows = con.sql(query).fetchall()  # DuckDB's own answer
    expect = np.zeros(max(i for i, _ in rows) + 1)
    for i, v in rows:
        expect[i] = v
    con.execute(f"CREATE TENSOR T FROM ({query}) INDEX (i)")
    np.testing.assert_array_equal(con.tensor("T"), expect)
    con.execute(f"LOAD OR REPLACE TENSOR T FROM (\n{query}) INDEX (i) VALUE value")
    np.testing.assert_array_equal(con.tensor("T"), expect)


def test_explain_analyze_reports_the_measured_peak_of_the_run(con):
    a = np.random.default_rng(2).standard_normal((300, 300))
    con.load("A", a)
    data = json.loads(con.explain("C[i,k] = A[i,j] * A[j,k]", format="json", analyze=True))
    out_bytes = a.nbytes
    # A result tile counts while it is computed; once in its output file's mapping its pages
    # are the page cache's (exec/pool.py), so the peak is at least the largest tile.
    pieces = data["nodes"][0]["pieces"]
    assert data["measured"]["peak_bytes"] >= out_bytes // (pieces["i"] * pieces["k"]) > 0
    # the stored inputs are read through the page cache: they add nothing
    assert data["measured"]["peak_bytes"] <= out_bytes + a.nbytes
    text = con.explain("E[i,k] = A[i,j] * A[j,k]", analyze=True)
    assert "peak tile memory 0 B (tiles alive at once)" not in text
    np.testing.assert_allclose(con.tensor("E"), a @ a, rtol=1e-10, atol=1e-10)


# -- found by review: more inputs that must give tensordb errors -----------------------------------

def test_huge_literals_are_refused_or_computed_like_numpy():
    with tensordb.connect() as con:
        A = np.arange(6.0).reshape(2, 3)
        con.load("A", A)
        with pytest.raises(tensordb.ParserError, match="integer literal of 5001 digits") as e:
            con.execute("C[i] = SUM(A[i,j] * 1" + "0" * 5000 + ")")
        assert "LINE 1" in str(e.value)
        with pytest.raises(tensordb.BinderError, match="more than 1024 bits"):
            con.einsum("ij->i", "A", join="x0 * 10 ** 10 ** 4", into="C")
        with pytest.raises(tensordb.BinderError, match="more than 1024 bits"):
            con.einsum("ij->i", "A", join="x0 * 10 ** 10 ** 10", into="C")  # not computed
        con.execute("C[i] = SUM(A[i,j] * 10000000000000000000000)")  # 10**22: a float for A
        np.testing.assert_array_equal(con.tensor("C"), np.einsum("ij->i", A * 10**22))
        assert con.tensors()[0]["name"] == "A" and len(con.tensors()) == 2


def test_python_api_arguments_are_checked():
    with tensordb.connect() as con:
        con.load("A", np.eye(2))
        with pytest.raises(tensordb.ProgrammingError, match="format must be a string"):
            con.export("A", "a.npy", format=3)
        with pytest.raises(tensordb.ProgrammingError, match="parameters must be a list"):
            con.execute("SELECT ?", 5)
        with pytest.raises(tensordb.ProgrammingError, match="unknown tiling strategy 'weird'"):
            con.set("tiling", "weird")
        with pytest.raises(tensordb.ProgrammingError, match="unknown executor"):
            con.set("executor", "nope://x")
        with pytest.raises(tensordb.ProgrammingError, match="tuple of integers"):
            con.load("B", np.ones((4, 4)), tile=(1.5, 2))
        assert con.settings.tiling == "" and con.settings.executor == "local"
        assert [t["name"] for t in con.tensors()] == ["A"]
        assert con.execute("SELECT ?", [3]).fetchall() == [(3,)]


DUCK_STATEMENTS = {  # statements whose time is DuckDB's: a query, and a tensor streamed to it
    "create from a query": "CREATE TENSOR Q FROM (SELECT range % 1000 AS i, sum(range) AS v "
                           "FROM range(400000000) GROUP BY 1) INDEX (i) VALUE v",
    "copy a tensor to csv": "COPY D TO '{out}'",
}


@pytest.mark.parametrize("what", DUCK_STATEMENTS)
def test_ctrl_c_in_a_statement_duckdb_runs_is_an_interrupt(db_path, tmp_path, what):
    """Ctrl-C while DuckDB runs a statement is the KeyboardInterrupt it was, as for an einsum
    (the command line prints "interrupted"): it once arrived as an internal error (DuckDB's
    RuntimeError "Query interrupted") or as "Current transaction is aborted" (the interrupt
    raised inside the Python stream of a tensor that DuckDB was reading). Nothing is stored,
    no file written, and the connection works. When it stops is DuckDB's: its 2.0 client
    sometimes notices the interrupt only when the query ends (seen here in plain DuckDB too),
    so the time is not asserted."""
    out = tmp_path / "d.csv"
    with tensordb.connect(db_path) as con:
        _big(con)
        tensors = con.tensors()
        timer = threading.Timer(0.4, _thread.interrupt_main)
        timer.start()
        finished = False
        with pytest.raises(KeyboardInterrupt):
            con.execute(DUCK_STATEMENTS[what].format(out=out))
            finished = True
            time.sleep(5)  # where the interrupt lands if the statement was too quick for it
        assert not finished, "the statement ended before the interrupt: make it longer"
        assert con.tensors() == tensors and not out.exists()
        assert con.execute("SELECT 42").fetchall() == [(42,)]
        con.execute("E[i] = SUM(D[i,j])")
        np.testing.assert_allclose(con.tensor("E"), con.tensor("D").sum(axis=1))
