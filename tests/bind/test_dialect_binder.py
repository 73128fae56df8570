"""The binder: statements -> checked steps, and the errors that name position and cause.

These tests use a fake catalog: no storage, no execution.
"""
from __future__ import annotations

import numpy as np
import pytest

from tensordb.bind import GroupBinder, LetDef
from tensordb.dialect.parser import parse
from tensordb.errors import BinderError, CatalogError, Error
from tensordb.plan import scalar

SHAPES = {"A": (2, 3), "B": (3, 4), "C3": (2, 3, 4), "X": (5, 6), "W": (6, 7), "c": (7,),
          "D": (4, 4), "v": (3,), "s0": (), "I": (2, 3)}
DTYPES = {"I": "int32"}


class FakeMeta:
    def __init__(self, name):
        self.name, self.shape, self.dtype = name, SHAPES[name], np.dtype(DTYPES.get(name, "float64"))


class FakeStore:
    def has(self, name):
        return name in SHAPES

    def meta(self, name):
        return FakeMeta(name)

    def list(self):
        return [FakeMeta(n) for n in SHAPES]


def bind(text, **kw):
    g = GroupBinder(FakeStore(), {})
    stmts = parse(text)
    for s in stmts:
        g.add(text, s, **kw)
    return g


def steps(text):
    return [(s.into, s.out_labels, s.inputs, s.agg, s.store) for s in bind(text).steps]


def error(text, cls=Error):
    with pytest.raises(cls) as info:
        g = GroupBinder(FakeStore(), {})
        for s in parse(text):
            try:
                g.add(text, s)
            except Error as exc:
                raise exc.with_source(text, s.span)
    err = info.value
    assert err.statement == text and err.span is not None
    return err, text[err.span.start:err.span.end], str(err)


# -- lowering ----------------------------------------------------------------------------------

def test_matmul_explicit_and_implicit_sum():
    for text in ("Y[i,k] = SUM(A[i,j] * B[j,k])", "Y[i,k] = A[i,j] * B[j,k]"):
        [(into, out, inputs, agg, store)] = steps(text)
        assert (into, out, agg, store) == ("Y", ("i", "k"), "sum", True)
        assert inputs == (("A", ("i", "j")), ("B", ("j", "k")))
        assert bind(text).steps[0].join == scalar.product(2)


def test_row_max_and_min_plus():
    assert steps("M[i] = MAX(X[i,j])") == [("M", ("i",), (("X", ("i", "j")),), "max", True)]
    [step] = bind("P[i,j] = MIN(D[i,k] + D[k,j])").steps
    assert step.agg == "min" and step.join == scalar.Call("+", (scalar.Input(0), scalar.Input(1)))
    assert step.inputs == (("D", ("i", "k")), ("D", ("k", "j")))


def test_nested_aggregate_becomes_a_temporary():
    g = bind("H[b,f] = RELU(SUM(X[b,h] * W[h,f]) + c[f])")
    t, h = g.steps
    assert (t.into, t.out_labels, t.agg, t.store) == ("H.t1", ("b", "f"), "sum", False)
    assert t.inputs == (("X", ("b", "h")), ("W", ("h", "f")))
    assert (h.into, h.out_labels, h.store) == ("H", ("b", "f"), True)
    assert h.inputs == (("H.t1", ("b", "f")), ("c", ("f",)))
    assert h.join == scalar.Call("relu", (scalar.Call("+", (scalar.Input(0), scalar.Input(1))),))
    assert g.known["H"] == ((5, 7), "float64")


def test_softmax_shape_statement():
    # the label of the max is its own (k), so MAX aggregates k and keeps i
    g = bind("E[i,j] = EXP(X[i,j] - MAX(X[i,k]))")
    t, e = g.steps
    assert (t.out_labels, t.agg, t.inputs) == (("i",), "max", (("X", ("i", "k")),))
    assert e.inputs == (("X", ("i", "j")), ("E.t1", ("i",)))


def test_scalar_result_and_repeated_operand_uses_one_slot():
    [step] = bind("s = SUM(X[i,j] * X[i,j])").steps
    assert step.out_labels == () and step.inputs == (("X", ("i", "j")),)
    assert step.join == scalar.Call("*", (scalar.Input(0), scalar.Input(0)))
    assert bind("s = SUM(X[i,j] * X[i,j])").known["s"][0] == ()


def test_constants_functions_and_folding():
    [step] = bind("Y[i,j] = POW(A[i,j], 2) * (1 + 2) - -A[i,j] / 4 + MAX(A[i,j], 0)").steps
    text = scalar.render(step.join, ["a"]).lower()
    assert "3" in text and "pow" in text and "max" in text
    vals = scalar.evaluate(step.join, [np.array([2.0])])
    assert np.allclose(vals, 2 ** 2 * 3 + 2 / 4 + 2)


def test_all_listed_functions_bind():
    for fn in ("exp", "log", "sqrt", "abs", "relu", "tanh", "sigmoid", "sin", "cos", "square"):
        [step] = bind(f"Y[i,j] = {fn.upper()}(A[i,j])").steps
        assert step.join == scalar.Call(fn, (scalar.Input(0),))


def test_prod_aggregate_and_three_operand_product():
    assert steps("p[i] = PROD(A[i,j])")[0][3] == "prod"
    [step] = bind("Y[i,l] = A[i,j] * B[j,k] * D[k,l]").steps
    assert step.join == scalar.product(3) and len(step.inputs) == 3


def test_einsum_form_and_hints():
    g = bind("Y = EINSUM('ij,jk->ik', A, B) WITH (PIECES i 2)")
    [step] = g.steps
    assert step.inputs == (("A", ("i", "j")), ("B", ("j", "k"))) and step.out_labels == ("i", "k")
    assert g.known["Y"][0] == (2, 4) and g.pieces == {"Y": {"i": 2}}
    g = bind("Y = EINSUM('...ij->...ji', C3)")
    assert g.known["Y"][0] == (2, 4, 3)


def test_pieces_fix_labels():
    g = bind("Y[i,k] = A[i,j] * B[j,k] WITH (PIECES i 2, j 3)")
    assert g.pieces == {"Y": {"i": 2, "j": 3}}
    old = bind("Y[i,k] = A[i,j] * B[j,k] WITH (TILE (i 2, j 3))")  # the old spelling
    assert old.pieces == g.pieces


def test_dtype_inference():
    assert bind("Y[i,j] = I[i,j] * 2").known["Y"][1] in ("int32", "int64", "float64")
    assert bind("Y[i,j] = EXP(I[i,j])").known["Y"][1] == "float64"


def test_label_rules_nested_in_nested():
    # j is used outside the MAX (inside the SUM), so MAX aggregates k only; SUM aggregates j
    g = bind("Y[i] = SUM(A[i,j] * MAX(B[j,k]))")
    mx, top = g.steps
    assert mx.out_labels == ("j",) and mx.agg == "max"
    assert top.out_labels == ("i",) and top.agg == "sum"


# -- groups: versions, replacement, LETs ---------------------------------------------------------

def test_group_reassignment_makes_temporaries():
    g = GroupBinder(FakeStore(), {})
    text = "Y[i,j] = A[i,j] + 1; Y[i,j] = Y[i,j] * 2"
    s1, s2 = parse(text)
    g.add(text, s1, last=False)
    g.add(text, s2, last=True)
    names = [(s.into, s.store) for s in g.steps]
    assert names == [("Y.v1", False), ("Y", True)]
    assert g.steps[1].inputs == (("Y.v1", ("i", "j")),)


def test_replacing_a_tensor_the_group_reads_keeps_its_name():
    g = bind("D[i,j] = MIN(D[i,k] + D[k,j])")
    assert g.steps[0].into == "D"
    assert g.steps[0].inputs[0][0] == "D"


def test_create_existing_is_an_error_but_assignment_replaces():
    err, shown, text = error("CREATE TENSOR A[i,j] AS B[j,i] * 1", CatalogError)
    assert "already exists" in err.message and shown == "A" and "CREATE OR REPLACE" in text
    assert steps("CREATE OR REPLACE TENSOR A[i,j] AS A[i,j] * 2")[0][0] == "A"
    assert steps("Y[i] = v[i]")[0][0] == "Y"


def test_let_is_inlined_where_used_and_never_stored():
    lets: dict = {}
    g = GroupBinder(FakeStore(), lets)
    text = "LET H[b,f] = X[b,h] * W[h,f]; Y[b] = SUM(H[b,f] * c[f])"
    let, use = parse(text)
    g.add(text, let)
    assert isinstance(lets["h"], LetDef) and lets["h"].shape == (5, 7) and not g.steps
    g.add(text, use)
    assert [(s.into, s.store) for s in g.steps] == [("H", False), ("Y", True)]


def test_let_name_must_be_new():
    err, shown, _ = error("LET A[i,j] = A[i,j]", CatalogError)
    assert shown == "A"


# -- errors: position and cause -----------------------------------------------------------------

def test_unknown_tensor_caret_at_the_name():
    err, shown, text = error("Y[i,k] = A[i,j] * Nope[j,k]", CatalogError)
    assert "unknown tensor 'Nope'" in err.message and shown == "Nope"
    assert text.splitlines()[2].index("^") == len("LINE 1: ") + len("Y[i,k] = A[i,j] * ")


def test_unknown_function():
    err, shown, _ = error("Y[i,j] = FOO(A[i,j])", BinderError)
    assert "unknown function 'foo'" in err.message and shown == "FOO" and "RELU" in err.hint


def test_label_with_two_sizes_names_both():
    err, shown, _ = error("Y[i,k] = A[i,j] * B[i,k]", BinderError)
    assert err.message == "label 'i' has size 2 in A axis 0 but 3 in B axis 0"
    assert err.span.start == len("Y[i,k] = A[i,j] * B[")


def test_left_label_nowhere_on_the_right():
    err, shown, _ = error("Y[i,q] = A[i,j]", BinderError)
    assert "label 'q' on the left appears nowhere on the right" in err.message and shown == "q"


def test_wrong_number_of_labels():
    err, shown, _ = error("Y[i] = A[i,j,k]", BinderError)
    assert "A has 2 dimension(s) but is indexed with 3 label(s)" in err.message and shown == "A[i,j,k]"
    err, shown, _ = error("Y = v + 1", BinderError)
    assert "indexed with 0 label(s)" in err.message and shown == "v"


def test_aggregate_over_nothing():
    err, shown, _ = error("Y[i,j] = SUM(A[i,j])", BinderError)
    assert "SUM aggregates no label" in err.message and shown == "SUM"
    err, shown, _ = error("Y[i,j] = A[i,j] - MAX(A[i,j])", BinderError)
    assert "MAX aggregates no label" in err.message and shown == "MAX"


def test_type_errors():
    err, shown, _ = error("Y[i,j] = A[i,j] + 'x'", BinderError)
    assert "type error" in err.message and shown == "'x'"


@pytest.mark.parametrize("text, message, shown", [
    ("Y[i,i] = A[i,j]", "label 'i' appears twice on the left", "i"),
    ("Y[i] = SUM(A[i,j], 2)", "SUM takes one argument", "SUM(A[i,j], 2)"),
    ("Y[i,j] = EXP(A[i,j], 2)", "EXP takes 1 argument", "EXP(A[i,j], 2)"),
    ("s = 2 + 3", "uses no tensor", "2 + 3"),
    ("Y[i,k] = A[i,j] * B[j,k] WITH (PIECES q 2)", "PIECES names label 'q'", "q 2"),
    ("Y[i,k] = A[i,j] * B[j,k] WITH (PIECES i 0)", "at least 1 piece", "i 0"),
    ("Y[i,k] = EINSUM('ij,jk->ik', A, B)", "without labels on the left", "Y[i,k]"),
    ("Y = EINSUM('ij,jk->ik', A)", "operand", "'ij,jk->ik'"),
    ("Y = EINSUM('ij,jj->ij', A, B)", "label 'j'", "'ij,jj->ij'"),
    ("Y = EINSUM('ij->ik', A)", "output label 'k'", "'ij->ik'"),
    ("Y = EINSUM(A, B)", "spec string", "EINSUM(A, B)"),
    ("Y = EINSUM('ij', A[i,j])", "tensor names", "A[i,j]"),
    ("Y[i,j] = A[i,j] + EINSUM('ij', A)", "whole right side", "EINSUM"),
])
def test_more_errors(text, message, shown):
    err, got, _ = error(text)
    assert message in err.message and got == shown


def test_implicit_sum_is_per_term_like_einstein():
    # only the product sums over j; the bias term is added once
    g = bind("Y[i,k] = A[i,j] * B[j,k] + 1")
    t, y = g.steps
    assert (t.into, t.out_labels, t.agg, t.store) == ("Y.t1", ("i", "k"), "sum", False)
    assert y.inputs == (("Y.t1", ("i", "k")),)
    # each term is its own scope: MAX aggregates j although another term uses j too
    g = bind("Y[i] = MAX(A[i,j]) - I[i,j]")
    mx, sm, y = g.steps
    assert (mx.agg, mx.out_labels, sm.agg, sm.out_labels) == ("max", ("i",), "sum", ("i",))
    # one term: one step, a contraction the engine can hand to BLAS
    assert len(bind("Y[i,k] = -A[i,j] * B[j,k]").steps) == 1
    # inside a function there are no terms to split: the sum is around RELU
    [step] = bind("Y[i,k] = RELU(A[i,j] * B[j,k])").steps
    assert step.agg == "sum" and step.join.fn == "relu"


def test_did_you_mean():
    err, _, _ = error("Y[i] = vv[i]", CatalogError)
    assert "did you mean 'v'" in err.hint or "stored tensors" in err.hint
    err, _, _ = error("Y[i,j] = RELUU(A[i,j])", BinderError)
    assert err.hint.startswith("did you mean RELU?")
