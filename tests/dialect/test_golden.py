"""Golden tests: tests/sql/*.test, in sqllogictest style.

Records are separated by blank lines:

    statement ok                  the statement(s) that follow must succeed
    statement error <regex>       ... must fail with a tensordb.Error whose text matches <regex>
    query [rowsort]               a query; its rows follow '----', one per line, cells separated
                                  by spaces (numbers compared to 6 significant digits)
    load NAME <numpy expression>  store a tensor computed by numpy (np, rng are available)
    check NAME <numpy expression> the stored tensor NAME equals the numpy expression, in which
                                  stored tensors are available by name: results are checked
                                  against numpy, never copied numbers
    unchanged begin / unchanged   the database (tensors and contents) is as at 'unchanged begin'
    # ...                         a comment

Each file runs in a fresh in-memory database with a temporary working directory.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import tensordb

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"
FILES = sorted(SQL_DIR.glob("*.test"))


class _Tensors(dict):
    """Names in check expressions: stored tensors, fetched when used."""

    def __init__(self, con):
        super().__init__()
        self.con = con

    def __missing__(self, key):
        if not self.con.store.has(key):
            raise KeyError(key)
        value = self.con.tensor(key)
        self[key] = value
        return value


def _cell(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_cell(v) for v in value) + ")"
    if value is None:
        return "NULL"
    return str(value)


def _same_token(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-9) or (math.isnan(x) and math.isnan(y))


def _records(path: Path):
    """(line number, header, body lines, expected lines) per record."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        start, header = i + 1, lines[i].strip()
        body: list[str] = []
        expected: list[str] | None = None
        i += 1
        while i < len(lines) and lines[i].strip():
            if lines[i].strip() == "----" and expected is None:
                expected = []
            elif expected is not None:
                expected.append(lines[i])
            else:
                body.append(lines[i])
            i += 1
        yield start, header, "\n".join(body), expected


def _snapshot(con):
    return {t["name"]: con.tensor(t["name"]).tobytes() for t in con.tensors()}


def run_file(path: Path) -> int:
    """Run one golden file; returns the number of records checked."""
    count = 0
    rng = np.random.default_rng(0)
    with tensordb.connect() as con:
        saved = None
        for line, header, body, expected in _records(path):
            where = f"{path.name}:{line}"
            words = header.split(maxsplit=2)
            kind = words[0]
            count += 1
            if kind == "statement" and words[1] == "ok":
                try:
                    con.execute(body)
                except tensordb.Error as exc:
                    pytest.fail(f"{where}: statement failed:\n{exc}")
            elif kind == "statement" and words[1] == "error":
                pattern = header.split(maxsplit=2)[2] if len(words) > 2 else ""
                try:
                    con.execute(body)
                except tensordb.Error as exc:
                    assert re.search(pattern, str(exc), re.S), \
                        f"{where}: error does not match /{pattern}/:\n{exc}"
                    assert exc.span is not None or exc.statement is not None, \
                        f"{where}: error has no position:\n{exc}"
                else:
                    pytest.fail(f"{where}: statement should have failed: {body}")
            elif kind == "query":
                try:
                    rows = con.execute(body).fetchall()
                except tensordb.Error as exc:
                    pytest.fail(f"{where}: query failed:\n{exc}")
                got = [" ".join(_cell(v) for v in r) for r in rows]
                if "rowsort" in header:
                    got.sort()
                want = [" ".join(x.split()) for x in expected or []]
                ok = len(got) == len(want) and all(
                    len(g.split()) == len(w.split()) and all(map(_same_token, g.split(), w.split()))
                    for g, w in zip(got, want))
                assert ok, f"{where}: query result differs\n--- expected\n" + "\n".join(want) + \
                    "\n--- got\n" + "\n".join(got)
            elif kind == "load":
                name, expr = words[1], words[2]
                value = eval(expr, {"np": np, "rng": rng}, _Tensors(con))  # noqa: S307
                con.load(name, value, replace=True)
            elif kind == "check":
                name, expr = words[1], words[2]
                expect = np.asarray(eval(expr, {"np": np}, _Tensors(con)))  # noqa: S307
                got_t = con.tensor(name)
                assert got_t.shape == expect.shape, f"{where}: shape {got_t.shape} != {expect.shape}"
                assert np.allclose(got_t, expect, rtol=1e-4, atol=1e-6), \
                    f"{where}: {name} differs from {expr}\n{got_t}\n{expect}"
            elif kind == "unchanged":
                if len(words) > 1 and words[1] == "begin":
                    saved = _snapshot(con)
                else:
                    assert saved is not None and _snapshot(con) == saved, \
                        f"{where}: the database changed"
            else:
                pytest.fail(f"{where}: unknown record '{header}'")
    return count


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_file(path) > 0


def test_golden_files_exist():
    stems = {p.stem for p in FILES}
    assert {"create", "einsum", "errors", "load_copy", "blocks", "settings", "explain", "sql",
            "workloads"} <= stems
