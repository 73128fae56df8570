"""The planner knows memory (issue 11): the projected peak of a plan against the tiles its lowered
plan has, the search refining tilings under a tight memory_limit, OutOfMemoryError before
anything runs, kernel chunks sized from the budget, and the default memory_limit."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import tensordb
from tensordb.config import Settings, default_memory_limit, format_bytes
from tensordb.exec.runtime import held_bytes
from tensordb.optimizer import decompose
from tensordb.physical.plan import Aggregate, Assemble, Kernel, Load
from tensordb.bind import bind_graph as bind
from tensordb.plan.builder import Graph
from tensordb.plan.kernel import TEMPORARY_SHARE, element_bytes


def plan_of(con, g: Graph):
    eg = bind(g, con.store)
    decomp, plan = con.plan(eg, g.pieces)
    return eg, decomp, plan


def tile_bytes(plan, task) -> int:
    """The bytes of the tile a task produces, from its shape and dtype in the plan."""
    if isinstance(task, Kernel):
        op = plan.ops[task.op]
        return math.prod(task.out_shape) * np.dtype(op.dtype).itemsize
    return math.prod(task.shape) * np.dtype(task.dtype).itemsize


def held_per_op(plan) -> dict[str, dict[str, int]]:
    """Per operation, the most any of its kernel calls holds of each part, read off the lowered
    plan: input tiles that are copies (a Load by what the reader really hands out), the output
    tile, and the accumulator of the Aggregate it feeds."""
    by_key = {t.key: t for t in plan.tasks}
    consumers = plan.consumers()
    out: dict[str, dict[str, int]] = {}
    for t in plan.tasks:
        if not isinstance(t, Kernel):
            continue
        copied = 0
        for a in t.args:
            if a is None:
                continue
            src = by_key[a]
            if isinstance(src, Load):
                copied += held_bytes(src, plan.readers[src.tensor].read_box(src.starts, src.stops))
            else:
                assert isinstance(src, (Assemble, Kernel, Aggregate))
                copied += tile_bytes(plan, src)
        acc = max((tile_bytes(plan, by_key[c]) for c in consumers[t.key]
                   if isinstance(by_key[c], Aggregate) and plan.owner[c] == t.op), default=0)
        rec = out.setdefault(plan.ops[t.op].output, {"inputs": 0, "output": 0, "accumulator": 0})
        for part, v in (("inputs", copied), ("output", tile_bytes(plan, t)), ("accumulator", acc)):
            rec[part] = max(rec[part], v)
    return out


@pytest.fixture
def con(tmp_path):
    with tensordb.connect(tmp_path / "db", workers=2) as c:
        yield c


def arrays(con):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((96, 80))
    b = rng.standard_normal((80, 64))
    c = rng.standard_normal((64, 48))
    con.load("A", a, tile=(48, 80))    # row slabs: a box of whole rows is a view
    con.load("B", b, tile=(40, 32))    # a 2x2 grid: only boxes inside one tile are views
    con.load("C", c)
    s = np.zeros((80, 64))
    s[:40, :32], s[40:, 32:] = b[:40, :32], b[40:, 32:]
    con.load("S", s, tile=(40, 32))    # block-diagonal: two of its four tiles are absent
    assert con.store.meta("S").tile_count == 2
    return a, b, c


CASES = {
    # a sliced contraction (j in 2 pieces: an accumulator); B's boxes cross its stored tiles
    "matmul": lambda: Graph().op("M", "ik", [("A", "ij"), ("B", "jk")], pieces={"i": 2, "j": 2}),
    # a chain: the intermediate re-tiled (Assemble) for a min-plus product
    "chain": lambda: (Graph().op("T", "ik", [("A", "ij"), ("B", "jk")], store=False,
                                 pieces={"i": 2})
                      .op("U", "il", [("T", "ik"), ("C", "kl")], join="x0 + x1", agg="min",
                          pieces={"i": 3, "k": 2})),
    # a block-sparse operand: a box over present and absent tiles is a copy
    "sparse": lambda: Graph().op("Q", "ik", [("A", "ij"), ("S", "jk")],
                                 pieces={"i": 2, "j": 1, "k": 1}),
    # elementwise over stored tiles cut in their own grid: all views
    "elementwise": lambda: Graph().op("E", "ij", [("A", "ij"), ("A", "ij")], join="x0 * x1 + 1",
                                      pieces={"i": 2}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("limit", [None, "4MB"])
def test_projection_equals_what_the_lowered_plan_holds(con, case, limit):
    arrays(con)
    con.set("memory_limit", limit)
    eg, decomp, plan = plan_of(con, CASES[case]())
    mem = decomp.details["memory"]
    held = held_per_op(plan)
    assert set(held) == {op.output for op in eg.ops}
    for i, op in enumerate(eg.ops):
        proj = mem.ops[op.output]
        assert (proj.inputs, proj.output, proj.accumulator) == \
            (held[op.output]["inputs"], held[op.output]["output"], held[op.output]["accumulator"])
        kernel = plan.kernels[i]
        if kernel.method == "broadcast":
            # chunks sized from the budget: their temporaries stay within a quarter of it
            assert proj.temporaries > 0
            if mem.budget is not None:
                assert kernel.chunk_elements * element_bytes(op) <= mem.budget // TEMPORARY_SHARE
        elif kernel.method == "matmul" and kernel.layout.perm_first == (0, 1):
            assert proj.temporaries == 0   # BLAS writes into its output
    assert mem.peak == max(m.total for m in mem.ops.values())
    assert mem.budget == (None if limit is None else 4 * 10 ** 6 // 2)
    # the intermediates projected as "may spill": the unstored results, at their full size
    assert dict(mem.may_spill) == {op.output: math.prod(op.out_shape) * np.dtype(op.dtype).itemsize
                                   for op in eg.ops if op.output not in eg.outputs}


def test_the_matmul_case_has_views_copies_and_an_accumulator(con):
    """The corpus above exercises each part of the projection (not all zero)."""
    arrays(con)
    _, decomp, plan = plan_of(con, CASES["matmul"]())
    m = decomp.details["memory"].ops["M"]
    assert decomp.pieces("M") == {"i": 2, "j": 2, "k": 1}
    # A's 48x40 box lies in one 48x80 row slab (a view); B's 40x64 box spans two 40x32 tiles
    assert m.inputs == 40 * 64 * 8
    assert m.accumulator == m.output == 48 * 64 * 8
    assert any(isinstance(t, Aggregate) for t in plan.tasks)



def test_a_wide_matrix_in_column_tiles_is_read_as_views(con):
    """An inner product A (rows x many columns, stored in column tiles) @ B: every tiling of
    two kernel calls would copy A's pieces (each spans several column tiles); the planner takes
    the tiling on A's stored grid instead, whose pieces are views, and the answer is numpy's."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((64, 4096)), rng.standard_normal((4096, 32))
    con.load("W", a, tile=(64, 512))    # 8 column tiles
    con.load("V", b)
    g = Graph().op("P", "ik", [("W", "ij"), ("V", "jk")])
    eg, decomp, plan = plan_of(con, g)
    assert decomp.pieces("P") == {"i": 1, "j": 8, "k": 1}
    assert held_per_op(plan)["P"]["inputs"] == 0    # no copy of W (nor of V's row runs)
    assert decomp.details["memory"].ops["P"].inputs == 0
    con.run(g)
    np.testing.assert_allclose(con.tensor("P"), a @ b, rtol=1e-12, atol=1e-12)
    # with the pieces fixed to two calls, W's pieces are copies, as the cost model charges
    g2 = Graph().op("P2", "ik", [("W", "ij"), ("V", "jk")], pieces={"j": 2})
    eg2, decomp2, plan2 = plan_of(con, g2)
    assert held_per_op(plan2)["P2"]["inputs"] > 0
    cost = decomp2.details["cost"].ops["P2"]
    assert cost.retile >= 0.25 * a.nbytes   # W's pieces charged as the copies they are

def chain_graph():
    return (Graph().op("Y", "ij", [("X", "ij")], join="x0 * 2", store=False)
            .op("Z", "i", [("Y", "ij")]))


def test_a_tight_limit_gets_a_finer_plan_and_no_limit_the_same_plan(con):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 20000))
    con.load("X", x)
    eg = bind(chain_graph(), con.store)
    free = con.plan(eg)[0]
    con.set("memory_limit", 10 ** 12)    # far above anything this plan holds: the same plan
    assert con.plan(eg)[0].pieces_by_op == free.pieces_by_op
    assert free.details["memory"].peak > 200_000
    con.set("memory_limit", "200KB")     # 100 kB a worker: Z's input (Y, a copy) must be sliced
    tight = con.plan(eg)[0]
    mem = tight.details["memory"]
    assert mem.fits and mem.peak <= mem.budget == 100_000
    z = tight.pieces("Z")
    assert math.prod(z.values()) > math.prod(free.pieces("Z").values())
    assert z["j"] > 1                    # a contracted label sliced: partials folded into an accumulator
    assert mem.ops["Z"].accumulator > 0
    con.run(chain_graph())
    con.set("memory_limit", None)
    np.testing.assert_allclose(con.tensor("Z"), (x * 2).sum(axis=1), rtol=1e-12)


def test_the_optimizer_alone_refines_until_the_peak_fits():
    from tensordb.plan.ir import EinGraph, EinOp, TensorInfo
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 512, "j": 512, "k": 512})
    g = EinGraph((TensorInfo("A", (512, 512), "float64"), TensorInfo("B", (512, 512), "float64")),
                 (op,), ("C",))
    free = decompose(g, 4)
    assert decompose(g, 4, memory_limit=1 << 40).pieces_by_op == free.pieces_by_op
    tight = decompose(g, 4, memory_limit=4 << 20)   # 1 MiB a worker
    assert tight.details["memory"].peak <= 1 << 20 < free.details["memory"].peak
    assert tight.details["cost"].ops["C"].kernel_calls > free.details["cost"].ops["C"].kernel_calls


def snapshot(path):
    return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                  for d, _, files in os.walk(path) for f in files if not f.endswith(".wal"))


def test_out_of_memory_before_running_names_the_statement_and_figures(tmp_path):
    with tensordb.connect(tmp_path / "db", workers=4) as con:
        con.load("A", np.ones((64, 64)))
        con.execute("SET memory_limit = 20")     # 5 B a worker: not one float64 element
        tensors = con.tensors()
        files = snapshot(tmp_path / "db")
        with pytest.raises(tensordb.OutOfMemoryError) as info:
            con.execute("C[i,k] = A[i,j] * A[j,k]")
        msg = str(info.value)
        # the operation, its smallest possible peak (one float64 output element: the inputs are
        # views of the stored tile, a matmul allocates nothing) and the budget, with the caret
        assert "C[i,k] = SUM(A[i,j] * A[j,k])" in msg
        assert f"{format_bytes(8)} per worker" in msg and format_bytes(5) in msg
        # the share, not a memory_limit made up from it (1 B over 2 workers read '2 B')
        assert "share of memory_limit among 4 worker(s)" in msg
        assert "LINE 1: C[i,k] = A[i,j] * A[j,k]" in msg and "^" in msg and "HINT:" in msg
        assert con.tensors() == tensors and not con.store.has("C")
        assert snapshot(tmp_path / "db") == files


def test_kernel_chunks_are_sized_from_the_budget_and_shown(con):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((64, 512)), rng.standard_normal((512, 64))
    con.load("A", a)
    con.load("B", b)
    stmt = "P[i,k] = MIN(A[i,j] + B[j,k])"
    con.set("memory_limit", "1MB")
    text = con.explain(stmt)
    con.execute(stmt)
    choice = con.last_plan.kernels[0]
    budget = 10 ** 6 // 2
    assert choice.method == "broadcast"
    assert 1 <= choice.chunk_elements * 16 <= budget // TEMPORARY_SHARE
    assert f"chunks of {choice.chunk_elements}" in text
    assert "memory: projected peak" in text and f"of {format_bytes(budget)}" in text
    con.set("memory_limit", None)
    np.testing.assert_allclose(con.tensor("P"), (a[:, :, None] + b[None]).min(axis=1))
    assert "chunks of" not in con.explain(stmt)   # no limit: the default chunk


def expected_default() -> int:
    sizes = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit():
            sizes.append(int(text))
    return int(0.8 * min(sizes))


def test_the_default_memory_limit_is_most_of_physical_memory():
    assert default_memory_limit() == expected_default() == Settings().memory_limit
    with tensordb.connect() as con:
        assert con.settings.memory_limit == expected_default()
        con.execute("SET memory_limit = '1GB'")
        assert con.settings.memory_limit == 10 ** 9
        con.execute("SET memory_limit = DEFAULT")
        assert con.settings.memory_limit == expected_default()
        shown = dict(con.execute("SHOW memory_limit").fetchall())
        assert shown == {"memory_limit": format_bytes(expected_default())}
        con.set("memory_limit", None)     # no limit at all
        assert con.settings.memory_limit is None
        con.set("memory_limit", "default")
        assert con.settings.memory_limit == expected_default()
        con.execute("SET workers = 1")
        con.execute("SET workers = DEFAULT")
        assert con.settings.workers == Settings().workers
        con.execute("SET tiling = default")   # the strategy named 'default', as before
        assert con.settings.tiling == "default"
    with tensordb.connect(memory_limit="none") as con:
        assert con.settings.memory_limit is None
