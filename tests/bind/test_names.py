"""One naming scheme for the tensors of a graph (plan/names.py), and numpy specs parsed by
opt_einsum's parser (plan/builder.parse_spec): names carry their parts as data, hints reach every
operation computed under a name, and specs mean what numpy.einsum makes of them."""
from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import tensordb
from tensordb.optimizer.candidates import pieces_per_op
from tensordb.bind import bind_graph as bind
from tensordb.plan.builder import Graph, parse_spec
from tensordb.plan.ir import EinGraph, EinOp, TensorInfo
from tensordb.plan.names import TensorRef


# -- TensorRef ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ref, text", [
    (TensorRef("P"), "P"),
    (TensorRef("P", version=2), "P.v2"),
    (TensorRef("P").temporary(3), "P.t3"),
    (TensorRef("D").pairwise(1), "D.1"),
    (TensorRef("A").internal_copy(), "A'"),
    (TensorRef("A").internal_copy().pairwise(2), "A'.2"),
    (TensorRef("P", version=1).temporary(2).pairwise(4), "P.v1.t2.4"),
])
def test_a_ref_prints_as_before_and_keeps_its_parts(ref, text):
    assert str(ref) == text and ref == text and hash(ref) == hash(text)
    assert {text: 1}[ref] == 1 and {ref: 1}[text] == 1
    assert ref.name == text.split("'")[0].split(".")[0]
    back = pickle.loads(pickle.dumps(ref))  # the Dask executor ships plans
    assert type(back) is TensorRef and back == ref
    assert (back.name, back.version, back.temp, back.step, back.internal) == \
        (ref.name, ref.version, ref.temp, ref.step, ref.internal)
    assert json.loads(json.dumps({"output": ref})) == {"output": text}
    with pytest.raises(AttributeError):
        ref.name = "Q"


def test_within_follows_the_parts_not_the_text():
    p1 = TensorRef("P", version=1)
    assert p1.temporary(1).within("P") and p1.temporary(1).within(p1)
    assert not TensorRef("P").temporary(1).within(p1)          # the last P is not version 1
    assert TensorRef("A").internal_copy().pairwise(1).within("A")
    assert not TensorRef("PQ").within("P") and not TensorRef("P").within("PQ")
    assert TensorRef("D").pairwise(1).within("D.1")             # a hint naming a step itself
    assert not TensorRef("D").pairwise(2).within("D.1")


def test_plain_names_become_refs_in_the_ir():
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 2, "j": 3, "k": 4})
    assert isinstance(op.output, TensorRef) and op.output.name == "C" and op.output.is_result


# -- binding with real catalogs ----------------------------------------------------------------

def _arrays(con, rng, **shapes):
    out = {}
    for name, shape in shapes.items():
        out[name] = rng.standard_normal(shape)
        con.load(name, out[name])
    return out


def test_replacing_a_tensor_it_reads_computes_under_an_internal_name(con):
    rng = np.random.default_rng(0)
    arr = _arrays(con, rng, A=(6, 6))
    g = bind(Graph().op("A", "ik", [("A", "ij"), ("A", "jk")]), con.store)
    (op,) = g.ops
    assert op.output == "A'" and op.output.internal and op.output.name == "A"
    assert g.outputs == ("A'",) and g.stored_name(op.output) == "A"
    con.run(Graph().op("A", "ik", [("A", "ij"), ("A", "jk")]), pieces={"A": {"i": 2}})
    np.testing.assert_allclose(con.tensor("A"), arr["A"] @ arr["A"], rtol=1e-12)
    assert "A'" not in {t["name"] for t in con.tensors()}


def test_hints_on_the_stored_name_reach_the_internal_one(con):
    rng = np.random.default_rng(1)
    _arrays(con, rng, A=(8, 8))
    g = bind(Graph().op("A", "ik", [("A", "ij"), ("A", "jk")]), con.store)
    decomp, _ = con.plan(g, {"A": {"i": 4, "k": 2}})
    assert decomp.pieces("A'")["i"] == 4 and decomp.pieces("A'")["k"] == 2


def test_hints_reach_every_pairwise_step(con):
    rng = np.random.default_rng(2)
    arr = _arrays(con, rng, A=(8, 6), B=(6, 4), C=(4, 8))
    graph = Graph().einsum("ij,jk,kl->il", "A", "B", "C", into="D", pieces={"i": 2})
    g = bind(graph, con.store)
    steps = [op.output for op in g.ops]
    assert len(steps) == 2 and steps[-1] == "D" and steps[0].step == 1 and steps[0].name == "D"
    decomp, _ = con.plan(g, graph.pieces)
    with_i = [s for s, op in zip(steps, g.ops) if "i" in op.labels]
    assert with_i and all(decomp.pieces(s)["i"] == 2 for s in with_i)
    con.run(graph)
    np.testing.assert_allclose(con.tensor("D"), arr["A"] @ arr["B"] @ arr["C"], rtol=1e-12)


def test_a_statement_hint_reaches_its_temporaries_also_when_it_replaces_what_it_reads(con):
    rng = np.random.default_rng(3)
    arr = _arrays(con, rng, X=(8, 6), W1=(6, 5), W2=(5, 6))
    stmt = "X[b,h] = SUM(RELU(SUM(X[b,k] * W1[k,f])) * W2[f,h]) WITH (PIECES b 4)"
    data = json.loads(con.explain(stmt, format="json"))
    outputs = [n["output"] for n in data["nodes"]]
    assert outputs == ["X.t1", "X.t2", "X'"]  # the product, its RELU (a step of its own), X
    assert all(n["pieces"]["b"] == 4 for n in data["nodes"])
    con.execute(stmt)
    want = np.maximum(arr["X"] @ arr["W1"], 0) @ arr["W2"]
    np.testing.assert_allclose(con.tensor("X"), want, rtol=1e-10)


def test_a_hint_on_a_version_reaches_that_version_only():
    v1 = TensorRef("P", version=1)
    sizes = {"i": 8, "k": 8}
    ops = (EinOp.contraction(v1.temporary(1), "i", [("A", "ik")], sizes),
           EinOp.contraction(v1, "ik", [("A", "ik"), (v1.temporary(1), "i")], sizes),
           EinOp.contraction("P", "ik", [(v1, "ik")], sizes))
    graph = EinGraph((TensorInfo("A", (8, 8), "float64"),), ops, ("P",))
    assert pieces_per_op(graph, {v1: {"i": 2}}) == {"P.v1.t1": {"i": 2}, "P.v1": {"i": 2}}
    assert set(pieces_per_op(graph, {"P": {"k": 2}})) == {"P.v1.t1", "P.v1", "P"}


def test_a_group_reassigning_a_name_stores_the_last_version(con):
    rng = np.random.default_rng(4)
    arr = _arrays(con, rng, A=(8, 8))
    script = ("BEGIN; P[i,j] = SUM(A[i,k] * A[k,j]) WITH (PIECES i 2); "
              "P[i,j] = P[i,j] + 1 WITH (PIECES i 4); COMMIT")
    con.execute(script)
    np.testing.assert_allclose(con.tensor("P"), arr["A"] @ arr["A"] + 1, rtol=1e-12)
    assert {t["name"] for t in con.tensors()} == {"A", "P"}


# -- numpy specs through opt_einsum's parser ---------------------------------------------------

SPECS = ["ij,jk->ik", "ij,jk", "ii->i", "ii", "ij->", "...ij,...jk->...ik", "...ij,...jk",
         "i...,i...->...", "bij,bjk", "ijk->kji", "...", "a...b,b...->...a",
         "i,i", "i,j->ij", "Ab,bA->A"]


def _shapes(spec, rng):
    """Shapes for the spec's operands: one size per label, '...' as 2 dimensions of 1 or 3."""
    lhs = spec.split("->")[0]
    size: dict[str, int] = {}
    out = []
    for term in lhs.split(","):
        ell = [int(x) for x in rng.choice([1, 3], size=2)] if "..." in term else []
        head, _, tail = term.partition("...")
        shape = [size.setdefault(c, int(rng.integers(2, 5))) for c in head] + ell + \
            [size.setdefault(c, int(rng.integers(2, 5))) for c in tail]
        out.append(tuple(shape))
    return out


@pytest.mark.parametrize("spec", SPECS)
def test_specs_mean_what_numpy_makes_of_them(con, spec):
    rng = np.random.default_rng(len(spec))
    shapes = _shapes(spec, rng)
    arrays = [rng.standard_normal(s) for s in shapes]
    labels, out, sizes = parse_spec(spec, shapes)
    want = np.einsum(spec, *arrays)
    assert tuple(sizes[l] for l in out) == np.shape(want)
    names = []
    for n, a in enumerate(arrays):
        con.load(f"T{n}", a, replace=True)
        names.append(f"T{n}")
    np.testing.assert_allclose(con.einsum(spec, *names), want, rtol=1e-10, atol=1e-12)


LETTERS = "ijkA"


@st.composite
def spec_and_shapes(draw):
    terms = []
    for _ in range(draw(st.integers(1, 3))):
        t = "".join(draw(st.lists(st.sampled_from(LETTERS), max_size=3)))
        if draw(st.booleans()):
            p = draw(st.integers(0, len(t)))
            t = t[:p] + "..." + t[p:]
        terms.append(t)
    spec = ",".join(terms)
    if draw(st.booleans()):
        out = "".join(draw(st.lists(st.sampled_from(LETTERS + "."), max_size=4)))
        spec += "->" + out.replace(".", "...", 1).replace("..", "")
    size = {c: draw(st.sampled_from([1, 2, 3])) for c in LETTERS}
    shapes = []
    for t in terms:
        head, dots, tail = t.partition("...")
        ell = draw(st.lists(st.sampled_from([1, 2]), max_size=2)) if dots else []
        shape = [size[c] for c in head] + ell + [size[c] for c in tail]
        if draw(st.integers(0, 9)) == 0:   # sometimes a wrong number of dimensions
            shape = shape + [2] if draw(st.booleans()) else shape[1:]
        if draw(st.integers(0, 9)) == 0 and shape:   # sometimes a wrong size
            shape[0] = 4
        shapes.append(tuple(shape))
    return spec, shapes


@example((",k,...kki", [(), (2,), (4, 2, 1, 2)]))  # a diagonal k of sizes 2 and 1: numpy refuses
@settings(max_examples=300, deadline=None)
@given(spec_and_shapes())
def test_a_spec_is_refused_exactly_when_numpy_refuses_it(case):
    spec, shapes = case
    arrays = [np.ones(s) for s in shapes]
    try:
        want = np.einsum(spec, *arrays)
    except ValueError:
        want = None
    try:
        labels, out, sizes = parse_spec(spec, shapes)
    except tensordb.BinderError as exc:
        assert f"'{spec}'" in exc.message
        # numpy broadcasts a label of size 1 in one operand against n in another; tensordb
        # asks for one size per label (ellipsis dimensions broadcast as in numpy)
        assert want is None or re.search(r"has size (1 in one place but \d+|\d+ in one place "
                                         r"but 1) in operand", exc.message), (spec, shapes)
        return
    if want is None:
        # numpy refuses an output without '...' when '...' stands for dimensions; tensordb
        # sums them (as it always has)
        lhs, arrow, rhs = spec.partition("->")
        assert arrow and "..." not in rhs and any(l.startswith("…") for ls in labels for l in ls), \
            (spec, shapes)
        return
    assert tuple(sizes[l] for l in out) == np.shape(want)
    assert [len(ls) for ls in labels] == [len(s) for s in shapes]


def test_what_opt_einsums_parser_refuses_is_a_binder_error_naming_the_spec():
    from tensordb.plan.builder import _parse_numpy
    with pytest.raises(tensordb.BinderError, match=r"einsum 'i\.\.\.jk': .*[Ee]llips"):
        _parse_numpy("i...jk", "i...jk", [(2,)])
