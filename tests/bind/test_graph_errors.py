"""Errors of the Python Graph API (``Graph``, ``con.run``, ``con.einsum``) come from the one
binder, with a caret under the part of the call that is wrong, and store nothing.

The caret is read off ``str(err)`` (what a user sees), not off the error's span; each refusal is
checked against numpy's own (numpy refuses the same einsum or the same join)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb import Graph
from tensordb.errors import BinderError, CatalogError, DataError, ProgrammingError

A = np.arange(6.0).reshape(2, 3)
B = np.arange(20.0).reshape(4, 5)      # B's first dimension is not A's second
C = np.arange(12.0).reshape(3, 4)      # ...and C's is
M = np.array([[True, False, True], [False, True, True]])


@pytest.fixture
def db(disk_con):
    for name, arr in (("A", A), ("B", B), ("C", C), ("M", M)):
        disk_con.load(name, arr)
    return disk_con


def snapshot(con):
    """What the catalog (its DuckDB tables, read directly) and the database folder hold."""
    duck = con.store.duck
    tensors = duck.execute("SELECT name, version, shape FROM tensordb.tensors ORDER BY ALL").fetchall()
    tiles = duck.execute("SELECT tensor, version, file FROM tensordb.tiles ORDER BY ALL").fetchall()
    root = con.store.root
    files = sorted(os.path.relpath(os.path.join(d, f), root)
                   for d, _, fs in os.walk(root) for f in fs if not f.endswith(".wal"))
    return con.tensors(), tensors, tiles, files


def under_caret(err) -> tuple[str, str]:
    """(the source line shown, the text the caret line points at), read off str(err)."""
    lines = str(err).splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith("LINE 1: "))
    line, caret = lines[k], lines[k + 1]
    start = caret.index("^")
    return line[len("LINE 1: "):], line[start:len(caret.rstrip())]


def refused(con, cls, call):
    """Run ``call``; it must raise ``cls`` and leave the catalog and the files as they were."""
    before = snapshot(con)
    with pytest.raises(cls) as info:
        call()
    assert snapshot(con) == before
    return info.value


# -- unknown tensor ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["graph", "op", "einsum_into", "einsum"])
def test_unknown_tensor_points_at_the_operand(db, how):
    calls = {
        "graph": lambda: db.run(Graph().einsum("ij,jk->ik", "A", "Nope", into="D")),
        "op": lambda: db.run(Graph().op("D", "ik", [("A", "ij"), ("Nope", "jk")])),
        "einsum_into": lambda: db.einsum("ij,jk->ik", "A", "Nope", into="D"),
        "einsum": lambda: db.einsum("ij,jk->ik", "A", "Nope"),
    }
    err = refused(db, CatalogError, calls[how])
    assert err.message == "unknown tensor 'Nope'"
    line, shown = under_caret(err)
    assert shown == "'Nope'"
    assert line.startswith("op('D'" if how == "op" else "einsum('ij,jk->ik', 'A', 'Nope'")
    # con.einsum without into= names its result itself: the source shows the call as made
    assert ("into=" in line) == (how in ("graph", "einsum_into"))
    assert "HINT" in str(err)


def test_a_later_step_reads_an_earlier_result_and_a_typo_gets_a_hint(db):
    g = Graph().einsum("ij,jk->ik", "A", "C", into="AC").einsum("ik->k", "Ac", into="s")
    err = refused(db, CatalogError, lambda: db.run(g))
    assert under_caret(err)[1] == "'Ac'" and "did you mean 'AC'?" in str(err)
    assert "AC" not in {t["name"] for t in db.tensors()}   # the first step is not stored either


# -- labels and shapes ---------------------------------------------------------------------------

def test_label_size_mismatch_in_an_op_points_at_the_label(db):
    with pytest.raises(ValueError):
        np.einsum("ij,jk->ik", A, B)                       # numpy refuses it too
    err = refused(db, BinderError,
                  lambda: db.run(Graph().op("D", "ik", [("A", "ij"), ("B", "jk")])))
    assert err.message == "label 'j' has size 3 in A axis 1 but 4 in B axis 0"
    line, shown = under_caret(err)
    caret_col = str(err).splitlines()[2].index("^") - len("LINE 1: ")
    assert shown == "j" and caret_col == line.index("('B', 'jk')") + len("('B', '")


def test_label_size_mismatch_in_a_spec_points_at_the_spec(db):
    with pytest.raises(ValueError):
        np.einsum("ij,jk->ik", A, B)
    for call in (lambda: db.einsum("ij,jk->ik", "A", "B"),
                 lambda: db.run(Graph().einsum("ij,jk->ik", "A", "B", into="D"))):
        err = refused(db, BinderError, call)
        assert "label 'j' has size 3 in one place but 4 in operand 1 axis 0" in err.message
        assert under_caret(err)[1] == "'ij,jk->ik'"


def test_wrong_number_of_labels_names_the_shape(db):
    err = refused(db, BinderError, lambda: db.run(Graph().op("D", "i", [("A", "i")])))
    assert "A has 2 dimension(s) but is indexed with 1 label(s) [i]" in err.message
    assert "(2, 3)" in str(err) and under_caret(err)[1] == "'i'"


def test_output_labels_must_come_from_the_inputs(db):
    err = refused(db, BinderError, lambda: db.run(Graph().op("D", "iz", [("A", "ij")])))
    assert "output label 'z' appears in no input" in err.message and under_caret(err)[1] == "z"
    err = refused(db, BinderError, lambda: db.run(Graph().op("D", "ii", [("A", "ij")])))
    assert "'i' is repeated in the output" in err.message


@pytest.mark.parametrize("spec, operands, says", [
    ("ij,jk->iz", ("A", "C"), "output label 'z' appears in no input"),
    ("ij->i", ("A", "C"), "has 1 operand term(s) but 2 operand(s)"),
    ("i$,jk->ik", ("A", "C"), "invalid subscript"),
    ("ijk,jk->ik", ("A", "C"), "operand 0 has 2 dimension(s) but subscripts 'ijk' name 3"),
])
def test_a_bad_spec_points_at_the_spec(db, spec, operands, says):
    with pytest.raises(ValueError):
        np.einsum(spec, *[{"A": A, "C": C}[o] for o in operands])
    err = refused(db, BinderError, lambda: db.einsum(spec, *operands, into="D"))
    assert says in err.message and f"'{spec}'" in err.message
    assert under_caret(err)[1] == repr(spec)


# -- joins, aggregates, dtypes -------------------------------------------------------------------

def test_a_join_numpy_refuses_points_at_the_join(db):
    with pytest.raises(TypeError):
        np.subtract(M, M)                                  # numpy refuses - on bools
    for call in (lambda: db.einsum("ij,ij->ij", "M", "M", join="x0 - x1"),
                 lambda: db.run(Graph().op("D", "ij", [("M", "ij"), ("M", "ij")], join="x0 - x1"))):
        err = refused(db, BinderError, call)
        assert "NumPy refuses M - M on bool, bool" in err.message   # the tensors, named
        assert under_caret(err)[1] == "'x0 - x1'"


def test_a_dtype_tensordb_does_not_store_is_refused_at_the_join(db):
    assert np.exp(M).dtype == np.float16                   # numpy's answer, not stored here
    err = refused(db, DataError, lambda: db.einsum("ij->ij", "M", join="exp(x0)", into="D"))
    # the join is shown as tensordb renders it (functions in capitals)
    assert "float16" in err.message and under_caret(err)[1].lower() == "'exp(x0)'"


def test_unknown_aggregate_and_join_inputs_point_at_their_part(db):
    err = refused(db, BinderError, lambda: db.einsum("ij->i", "A", agg="median", into="D"))
    assert "unknown aggregate 'median'" in err.message and under_caret(err)[1] == "'median'"
    err = refused(db, BinderError,
                  lambda: db.einsum("ij,jk->ik", "A", "C", join="x0 * x2", into="D"))
    assert "x2" in err.message and under_caret(err)[1] == "'x0 * x2'"


def test_max_over_an_empty_label_points_at_the_aggregate(db):
    db.load("E", np.zeros((2, 0)))
    with pytest.raises(ValueError):
        np.max(np.zeros((2, 0)), axis=1)
    err = refused(db, DataError, lambda: db.einsum("ij->i", "E", agg="max", into="D"))
    assert "MAX over label 'j' of size 0" in err.message and under_caret(err)[1] == "'max'"


def test_a_name_defined_twice_points_at_the_second(db):
    g = Graph().einsum("ij->i", "A", into="D").einsum("jk->k", "C", into="D")
    err = refused(db, BinderError, lambda: db.run(g))
    line, shown = under_caret(err)
    assert "'D' is defined twice" in err.message and shown == "'D'" and "'jk->k'" in line


def test_errors_are_the_dialects_classes_and_a_valid_graph_still_runs(db):
    for text in ("D = EINSUM('ij,jk->ik', A, Nope)", "D[i,k] = A[i,j] * B[j,k]"):
        with pytest.raises(ProgrammingError) as dialect:
            db.execute(text)
        assert "^" in str(dialect.value)
    db.run(Graph().einsum("ij,jk->ik", "A", "C", into="D").op("E", "i", [("D", "ik")], agg="max"))
    np.testing.assert_allclose(db.tensor("D"), A @ C)
    np.testing.assert_allclose(db.tensor("E"), (A @ C).max(axis=1))
    np.testing.assert_allclose(db.einsum("ij,jk->ik", "A", "C"), np.einsum("ij,jk->ik", A, C))


def test_str_of_a_graph_error_is_message_caret_and_hint():
    with tensordb.connect() as con:
        con.load("A", A)
        with pytest.raises(CatalogError) as info:
            con.einsum("ij->i", "Z")
    text = str(info.value)
    assert "Traceback" not in text and text.splitlines()[1] == "LINE 1: einsum('ij->i', 'Z')"
