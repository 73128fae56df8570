"""The cost model (docs/explain.md, "The cost") and its known answers, on graphs built directly."""
from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from tensordb.errors import OutOfMemoryError, ProgrammingError
from tensordb.optimizer import STRATEGIES, decompose, evaluate
from tensordb.optimizer.candidates import candidates
from tensordb.optimizer.cost import OpModel, stored_aligned
from tensordb.plan import scalar
from tensordb.bind import bind_graph as bind
from tensordb.plan.builder import Graph
from tensordb.plan.ir import EinGraph, EinOp, Operand, TensorInfo


def matmul_graph(i, j, k, dtype="float64"):
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": i, "j": j, "k": k},
                           dtype=dtype)
    return EinGraph((TensorInfo("A", (i, j), dtype), TensorInfo("B", (j, k), dtype)), (op,), ("C",))


def mlp_graph(b, h, f, dtype="float32"):
    """Y = RELU(X W1) W2: the Megatron MLP."""
    ins = (TensorInfo("X", (b, h), dtype), TensorInfo("W1", (h, f), dtype),
           TensorInfo("W2", (f, h), dtype))
    h1 = EinOp.contraction("H", "bf", [("X", "bh"), ("W1", "hf")], {"b": b, "h": h, "f": f},
                           dtype=dtype)
    relu = EinOp("R", ("b", "f"), (Operand("H", ("b", "f")),), (("b", b), ("f", f)),
                 scalar.parse_join("relu(x0)"), None, dtype)
    y = EinOp.contraction("Y", "bh", [("R", "bf"), ("W2", "fh")], {"b": b, "h": h, "f": f},
                          dtype=dtype)
    return EinGraph(ins, (h1, relu, y), ("Y",))


class FakeCatalog:
    def __init__(self, **shapes):
        self.shapes = shapes

    def has(self, name):
        return name in self.shapes

    def meta(self, name):
        return SimpleNamespace(shape=self.shapes[name], dtype="float64")


# -- the cost model ------------------------------------------------------------------------------

@pytest.mark.parametrize("i,j,k", [(64, 32, 16), (100, 7, 33), (8, 512, 8)])
def test_matmul_cost_is_the_3d_volume_formula(i, j, k):
    m = OpModel.of(matmul_graph(i, j, k).op("C"), {"A": "float64", "B": "float64"}, 8)
    A, B, C = 8 * i * j, 8 * j * k, 8 * i * k
    for di, dk, dj in itertools.product((1, 2, 4, 8), repeat=3):
        c = m.cost((di, dk, dj))          # labels are (i, k, j): output labels first
        assert c.join + c.aggregation == A * dk + B * di + C * (dj - 1)
        assert c.kernel_calls == di * dj * dk and c.fan_in == dj


def test_cost_is_bytes_of_each_dtype():
    m32 = OpModel.of(matmul_graph(64, 64, 64, "float32").op("C"), {"A": "float32", "B": "float32"}, 4)
    m64 = OpModel.of(matmul_graph(64, 64, 64).op("C"), {"A": "float64", "B": "float64"}, 4)
    assert 2 * m32.cost((2, 2, 1)).bytes == m64.cost((2, 2, 1)).bytes


def test_stored_grid_alignment():
    assert stored_aligned(((0, 512, 1024), (0, 64)), (1024, 64), (2, 1))
    assert stored_aligned(((0, 256, 512, 768, 1024), (0, 64)), (1024, 64), (2, 1))
    assert not stored_aligned(((0, 1024), (0, 64)), (1024, 64), (4, 1))
    assert stored_aligned(None, (1024, 64), (3, 5))


def test_retiling_an_intermediate_costs_its_bytes():
    g = mlp_graph(64, 32, 128)
    base = {"H": {"b": 4}, "R": {"b": 4}, "Y": {"b": 4}}
    cut = {"H": {"b": 4}, "R": {"f": 4}, "Y": {"f": 4}}
    c0, c1 = evaluate(g, base, 4), evaluate(g, cut, 4)
    assert c0.ops["R"].retile == 0
    assert c1.ops["R"].retile == 64 * 128 * 4          # H re-cut from rows to columns
    assert c1.ops["Y"].retile == 0                      # R already split by f


# -- known answers -------------------------------------------------------------------------------

def test_megatron_few_rows_splits_f_in_both_products():
    b, h = 8, 256
    g = mlp_graph(b, h, 4 * h)
    d = decompose(g, 4)
    assert d.pieces("H") == {"b": 1, "f": 4, "h": 1}      # W1 by columns
    assert d.pieces("R") == {"b": 1, "f": 4}              # relu local on the f-shards
    assert d.pieces("Y") == {"b": 1, "h": 1, "f": 4}      # W2 by rows
    cost = d.details["cost"]
    assert cost.ops["H"].aggregation == 0
    assert cost.ops["Y"].aggregation == 3 * b * h * 4     # one aggregation of b*h (4 partials)
    assert cost.ops["R"].retile == cost.ops["Y"].retile == 0


def test_megatron_many_rows_splits_the_rows():
    g = mlp_graph(16384, 256, 1024)
    d = decompose(g, 4)
    assert d.pieces("H") == {"b": 4, "f": 1, "h": 1}
    assert d.pieces("Y") == {"b": 4, "h": 1, "f": 1}


def test_where_megatron_flips_to_data_parallel():
    """Megatron wins while the tokens are few next to the weights; somewhere it must flip."""
    picks = []
    for b in (16, 64, 256, 1024, 4096, 16384):
        picks.append(decompose(mlp_graph(b, 256, 1024), 4).pieces("Y")["f"])
    assert picks[0] == 4 and picks[-1] == 1
    assert picks == sorted(picks, reverse=True)      # one flip, no flapping


@pytest.mark.parametrize("shape,expect", [
    ((1 << 16, 64, 64), {"i": 16, "k": 1, "j": 1}),    # tall and skinny: rows
    ((64, 1 << 16, 64), {"i": 1, "k": 1, "j": 16}),    # inner product: split the sum
])
def test_single_matmul_shapes(shape, expect):
    assert decompose(matmul_graph(*shape), 16).pieces("C") == expect


def test_square_matmul_is_split_in_two_or_three_dimensions():
    d = decompose(matmul_graph(1024, 1024, 1024), 16).pieces("C")
    assert math.prod(d.values()) == 16 and max(d.values()) <= 4
    d64 = decompose(matmul_graph(1024, 1024, 1024), 64).pieces("C")
    assert d64 == {"i": 4, "k": 4, "j": 4}                # the 3-D cube at p = 64


def test_matrix_chain_is_associated_in_the_cheapest_order():
    cat = FakeCatalog(A=(10, 100), B=(100, 5), C=(5, 50))
    g = bind(Graph().einsum("ij,jk,kl->il", "A", "B", "C", into="D"), cat)
    first = g.ops[0]
    assert sorted(o.tensor for o in first.inputs) == ["A", "B"]      # (AB)C
    ab_c = decompose(g, 4).details["cost"]
    a_bc = bind(Graph().einsum("jk,kl->jl", "B", "C", into="T")
                .einsum("ij,jl->il", "A", "T", into="D"), cat)
    alt = decompose(a_bc, 4).details["cost"]
    assert ab_c.flops < alt.flops and ab_c.total < alt.total


def test_longer_chain_costs_less_than_left_to_right():
    shapes = dict(A=(512, 16), B=(16, 512), C=(512, 16), D=(16, 512), E=(512, 8))
    cat = FakeCatalog(**shapes)
    best = bind(Graph().einsum("ab,bc,cd,de,ef->af", *shapes, into="Z"), cat)
    naive = Graph()
    prev = "A"
    for n, (name, spec) in enumerate(zip("BCDE", ["ab,bc->ac", "ac,cd->ad", "ad,de->ae",
                                                  "ae,ef->af"])):
        into = "Z" if name == "E" else f"T{n}"
        naive.einsum(spec, prev, name, into=into, store=name == "E")
        prev = into
    naive_g = bind(naive, cat)
    for p in (4, 16):
        assert decompose(best, p).details["cost"].total < decompose(naive_g, p).details["cost"].total


def test_tiny_operations_are_not_split_across_all_workers():
    op = EinOp("Y", ("i",), (Operand("X", ("i",)),), (("i", 10),), scalar.parse_join("exp(x0)"),
               None, "float64")
    g = EinGraph((TensorInfo("X", (10,), "float64"),), (op,), ("Y",))
    assert decompose(g, 16).pieces("Y")["i"] < 16


def test_labels_smaller_than_workers():
    g = matmul_graph(2, 3, 2)
    d = decompose(g, 64).pieces("C")
    assert all(d[l] <= n for l, n in {"i": 2, "j": 3, "k": 2}.items())


def test_non_power_of_two_workers():
    d = decompose(matmul_graph(3000, 64, 64), 6).pieces("C")
    assert d == {"i": 6, "k": 1, "j": 1}


# -- hints ---------------------------------------------------------------------------------------

def test_hints_are_honoured_and_completed():
    g = matmul_graph(1 << 14, 64, 64)
    d = decompose(g, 16, pieces={"C": {"k": 2}})
    assert d.pieces("C")["k"] == 2 and math.prod(d.pieces("C").values()) == 16
    odd = decompose(g, 16, pieces={"C": {"j": 3}})
    assert odd.pieces("C")["j"] == 3 and math.prod(odd.pieces("C").values()) <= 16
    big = decompose(g, 4, pieces={"C": {"i": 64}})
    assert big.pieces("C") == {"i": 64, "k": 1, "j": 1}
    clamp = decompose(g, 4, pieces={"C": {"k": 1000}})
    assert clamp.pieces("C")["k"] == 64


def test_hints_apply_to_pairwise_steps():
    cat = FakeCatalog(A=(64, 64), B=(64, 64), C=(64, 64))
    g = bind(Graph().einsum("ij,jk,kl->il", "A", "B", "C", into="D"), cat)
    d = decompose(g, 4, pieces={"D": {"i": 2}})
    assert all(d.pieces(op.output)["i"] == 2 for op in g.ops if "i" in op.labels)


def test_bad_hints_fail_clearly():
    g = matmul_graph(64, 64, 64)
    with pytest.raises(ProgrammingError, match="label 'z'"):
        decompose(g, 4, pieces={"C": {"z": 2}})
    with pytest.raises(ProgrammingError, match="no operation produces"):
        decompose(g, 4, pieces={"Q": {"i": 2}})
    with pytest.raises(ProgrammingError, match="at least 1"):
        decompose(g, 4, pieces={"C": {"i": 0}})


def test_every_strategy_honours_hints():
    g = mlp_graph(64, 32, 128)
    for name in STRATEGIES:
        if name == "default":
            continue
        assert decompose(g, 4, strategy=name, pieces={"Y": {"h": 2}}).pieces("Y")["h"] == 2


# -- memory --------------------------------------------------------------------------------------

def test_memory_limit_forces_more_pieces():
    g = matmul_graph(512, 512, 512)                 # each matrix 2 MiB
    free = decompose(g, 4)
    assert math.prod(free.pieces("C").values()) == 4
    budget = 1 << 20                                 # 1 MiB per worker
    d = decompose(g, 4, memory_limit=4 * budget)
    cost = d.details["cost"].ops["C"]
    assert cost.kernel_calls > 4 and cost.kernel_calls % 4 == 0
    assert cost.tile_bytes <= budget
    assert free.details["cost"].ops["C"].tile_bytes > budget


def test_memory_limit_too_small_raises():
    g = matmul_graph(512, 512, 512)
    with pytest.raises(OutOfMemoryError, match=r"C\[i,k\].*i=512.*per worker.*16 B"):
        decompose(g, 4, memory_limit=64)


def test_candidates_respect_sizes_and_workers():
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 4096, "j": 2, "k": 4096})
    m = OpModel.of(op, {"A": "float64", "B": "float64"}, 16)
    cs = candidates(m)
    assert cs and all(math.prod(c) == 16 and c[2] <= 2 for c in cs)


# -- the registry --------------------------------------------------------------------------------

def test_registry_and_unknown_strategy():
    assert {"eindecomp", "default", "data-parallel", "even"} <= set(STRATEGIES)
    with pytest.raises(ProgrammingError, match="valid strategies: .*eindecomp"):
        decompose(matmul_graph(4, 4, 4), 2, strategy="nope")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_gives_every_label(strategy):
    g = mlp_graph(32, 16, 64)
    d = decompose(g, 4, strategy=strategy)
    for op in g.ops:
        pieces = d.pieces(op.output)
        assert set(pieces) == set(op.labels)
        assert all(1 <= pieces[l] <= op.size[l] for l in op.labels)
    assert d.details["cost"].total > 0


def test_default_strategy_is_eindecomp():
    assert decompose(matmul_graph(64, 64, 64), 4).strategy == "eindecomp"


def test_runner_ups_are_recorded():
    d = decompose(mlp_graph(8, 256, 1024), 4)
    ch = d.details["choices"]["Y"]
    costs = [cost for _, cost in ch.runner_ups]
    assert costs and costs == sorted(costs)
    assert all(dict(p) != dict(ch.pieces) for p, _ in ch.runner_ups)
    assert ch.candidates >= len(ch.runner_ups) + 1


def test_numpy_sanity_of_the_test_graphs():
    # the MLP graph's shapes line up (guards the helpers above)
    g = mlp_graph(8, 4, 16)
    assert g.shape_of("Y") == (8, 4) and np.dtype(g.dtype_of("Y")) == np.float32
