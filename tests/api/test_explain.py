"""EXPLAIN and EXPLAIN ANALYZE on real queries; results unchanged under every strategy."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tensordb
from tensordb.errors import ProgrammingError
from tensordb.explain import render
from tensordb.optimizer import STRATEGIES, Decomposition, price
from tensordb.plan.builder import Graph


@pytest.fixture
def con4():
    with tensordb.connect(workers=4) as c:
        yield c


def mlp(con, b=8, h=256, f=1024):
    rng = np.random.default_rng(0)
    arrays = {"X": rng.standard_normal((b, h)), "W1": rng.standard_normal((h, f)),
              "W2": rng.standard_normal((f, h))}
    for n, a in arrays.items():
        con.load(n, a)
    g = (Graph().einsum("bh,hf->bf", "X", "W1", into="H", store=False)
         .einsum("bf->bf", "H", into="R", join="relu(x0)", store=False)
         .einsum("bf,fh->bh", "R", "W2", into="Y"))
    expect = np.maximum(arrays["X"] @ arrays["W1"], 0) @ arrays["W2"]
    return g, expect


def test_text_has_header_and_one_row_per_operation(con4):
    g, _ = mlp(con4)
    text = con4.explain(g)
    lines = text.splitlines()
    assert lines[0].startswith("EXPLAIN: 3 operation(s) on 4 worker(s), strategy eindecomp")
    assert "flops" in lines[1] and "moved between workers" in lines[1] and "peak tile" in lines[1]
    for expr in ("H[b,f] = SUM(X[b,h] * W1[h,f])", "R[b,f] = RELU(H[b,f])",
                 "Y[b,h] = SUM(R[b,f] * W2[f,h])"):
        assert sum(expr in line for line in lines) == 1
    row = {expr[0]: line for line in lines for expr in ("H[", "Y[") if expr in line.split("=")[0]}
    assert "b=1 f=4 | h=1" in row["H"] and "b=1 h=1 | f=4" in row["Y"]   # the Megatron plan
    assert text.count("runner-ups:") == 3
    assert not con4.store.has("Y")                                  # EXPLAIN runs nothing


def test_json_has_the_documented_fields(con4):
    g, _ = mlp(con4)
    data = json.loads(con4.explain(g, format="json"))
    assert data["workers"] == 4
    assert {"flops", "bytes_moved", "cost"} <= set(data["total"])
    assert [n["output"] for n in data["nodes"]] == ["H", "R", "Y"]
    for n in data["nodes"]:
        assert {"output", "labels", "pieces", "kernel_calls", "aggregated_labels", "flops",
                "bytes_moved"} <= set(n)
        assert set(n["pieces"]) == set(n["labels"])
    y = data["nodes"][2]
    assert y["aggregated_labels"] == ["f"] and y["pieces"]["f"] == 4 and y["fan_in"] == 4
    assert y["bytes_moved"] == 3 * 8 * 256 * 8                       # three partials of b*h move
    assert data["total"]["bytes_moved"] == sum(n["bytes_moved"] for n in data["nodes"])
    assert data["total"]["flops"] == sum(n["flops"] for n in data["nodes"])
    assert all(isinstance(u["cost"], float) for u in y["runner_ups"])


def test_analyze_runs_and_reports_measurements(con4):
    g, expect = mlp(con4)
    data = json.loads(con4.explain(g, format="json", analyze=True))
    np.testing.assert_allclose(con4.tensor("Y"), expect, rtol=1e-10)
    for n in data["nodes"]:
        m = n["measured"]
        assert {"seconds", "kernel_calls", "bytes_moved", "peak_tile_bytes"} <= set(m)
        assert m["kernel_calls"] == n["kernel_calls"]
        assert m["bytes_moved"] == n["bytes_moved"]                   # the plan is followed
    assert data["measured"]["bytes_moved"] == data["total"]["bytes_moved"]
    text = con4.explain(g, analyze=True)                       # runs again, replacing Y
    assert text.startswith("EXPLAIN ANALYZE") and "measured:" in text and "calls*" in text


def test_dot_and_bad_format(con4):
    g, _ = mlp(con4)
    dot = con4.explain(g, format="dot")
    assert dot.startswith("digraph plan {") and '"W1" -> "H";' in dot
    with pytest.raises(ProgrammingError, match="valid formats"):
        con4.explain(g, format="yaml")


def test_a_hand_made_decomposition_is_priced_by_the_optimizer_not_by_explain(con4):
    g, _ = mlp(con4)
    from tensordb.bind import bind_graph as bind
    eg = bind(g, con4.store)
    decomp, plan = con4.plan(eg)
    bare = Decomposition(decomp.workers, decomp.pieces_by_op, "by hand")
    with pytest.raises(ProgrammingError, match="carries no cost") as info:
        render(bare, plan, format="json")
    assert "optimizer.price" in str(info.value)
    grids = {t.name: con4.store.meta(t.name).grid for t in eg.inputs}
    data = json.loads(render(price(eg, bare, input_grids=grids), plan, format="json"))
    assert data["strategy"] == "by hand"
    assert data["total"]["cost"] == pytest.approx(decomp.details["cost"].total)


def test_hints_show_in_explain(con4):
    g, _ = mlp(con4)
    data = json.loads(con4.explain(g, format="json", pieces={"Y": {"b": 2}}))
    assert data["nodes"][2]["pieces"]["b"] == 2


# 512x512 float64: stored tiles are read as views, so a call holds its output tile (512 KiB
# for 4 calls, 256 KiB for 8, 128 KiB for 16) against memory_limit / 4 workers.
@pytest.mark.parametrize("limit,calls", [(None, 4), (3 << 19, 8), (3 << 18, 16)])
def test_memory_limit_end_to_end(limit, calls):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    with tensordb.connect(workers=4, memory_limit=limit) as con:
        con.load("A", a)
        con.load("B", b)
        con.einsum("ij,jk->ik", "A", "B", into="C")
        assert con.last_plan.stats[0].kernel_calls == calls
        con.set("memory_limit", None)   # the dense result is larger than the limit
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-10)


def test_out_of_memory_names_the_operation():
    with tensordb.connect(workers=4, memory_limit=20) as con:   # 5 B a worker: not one float64
        con.load("A", np.ones((64, 64)))
        with pytest.raises(tensordb.OutOfMemoryError, match=r"C\[i,k\] = SUM.*i=64.*8 B per worker.*5 B"):
            con.einsum("ij,jk->ik", "A", "A", into="C")
        assert not con.store.has("C")


CORPUS = [
    ("ij,jk->ik", {"A": (40, 24), "B": (24, 36)}, {}),
    ("ij,jk->ik", {"A": (4, 300), "B": (300, 4)}, {}),
    ("bij,bjk->bik", {"A": (6, 10, 12), "B": (6, 12, 7)}, {}),
    ("ij,jk,kl->il", {"A": (10, 100), "B": (100, 5), "C": (5, 50)}, {}),
    ("ik,kj->ij", {"A": (20, 30), "B": (30, 20)}, {"join": "x0 + x1", "agg": "min"}),
    ("ij->i", {"A": (50, 70)}, {"agg": "max"}),
    ("ij,j->ij", {"A": (33, 17), "B": (17,)}, {"join": "relu(x0 + x1)"}),
]


def _oracle(spec, arrays, join=None, agg="sum"):
    if join is None:
        return np.einsum(spec, *arrays)
    lhs, out = spec.split("->")
    terms = lhs.split(",")
    labels = list(dict.fromkeys("".join(terms)))
    views = [np.einsum(f"{t}->{''.join(l for l in labels if l in t)}", a)
             .reshape([a.shape[t.index(l)] if l in t else 1 for l in labels])
             for t, a in zip(terms, arrays)]
    x = {"x0 + x1": lambda: views[0] + views[1],
         "relu(x0 + x1)": lambda: np.maximum(views[0] + views[1], 0)}[join]()
    axes = tuple(i for i, l in enumerate(labels) if l not in out)
    red = {"sum": np.sum, "min": np.min, "max": np.max}[agg]
    return red(x, axis=axes) if axes else x


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_results_unchanged_under_every_strategy(strategy, workers):
    rng = np.random.default_rng(workers)
    with tensordb.connect(workers=workers) as con:
        con.set("tiling", strategy)
        for n, (spec, shapes, kw) in enumerate(CORPUS):
            arrays = [rng.standard_normal(s) for s in shapes.values()]
            for name, a in zip(shapes, arrays):
                con.load(name, a, replace=True)
            con.einsum(spec, *shapes, into=f"R{n}", **kw)
            expect = _oracle(spec, arrays, kw.get("join"), kw.get("agg", "sum")) if kw.get("join") \
                else (np.einsum(spec, *arrays) if kw.get("agg", "sum") == "sum"
                      else np.max(arrays[0], axis=1))
            np.testing.assert_allclose(con.tensor(f"R{n}"), expect, rtol=1e-9, atol=1e-9,
                                       err_msg=f"{strategy}, {workers} workers: {spec} {kw}")


def test_pieces_for_sql_text_are_refused_not_ignored(con4):
    with pytest.raises(tensordb.ProgrammingError, match="WITH \\(PIECES"):
        con4.explain("Q[i] = SUM(X[i,j])", pieces={"Q": {"j": 2}})


def test_explain_of_a_group_redefining_a_session_let_inlines_it_and_defines_nothing():
    with tensordb.connect(workers=2) as con:
        a = np.arange(16.0).reshape(4, 4)
        con.load("A", a)
        con.execute("LET x[i,j] = A[i,j] * 2;")
        text = con.explain("LET x[i,j] = A[i,j] * 3; LET z[i] = SUM(A[i,j]); Y[i] = SUM(x[i,j]);")
        assert "Y[i]" in text and "* 3" in text
        assert sorted(con.session.lets) == ["x"]  # z is not defined, x is the old one
        con.execute("Y[i] = SUM(x[i,j]);")
        np.testing.assert_array_equal(con.tensor("Y"), (a * 2).sum(axis=1))
        assert not con.store.has("z")
