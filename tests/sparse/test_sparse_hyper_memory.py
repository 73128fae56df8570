"""The plan-time memory of hypersparse inputs (every tile COO): an output its sparse inputs
cannot fill (``R3i[a,b,k] = SUM(T[a,b,c] * Wi[c,k])`` of a 10^6 x 10^6 x 4 T of 5 entries and a
Wi holding inf, a dense tensor of 14.6 TiB: more than the machine's memory, with or without
``memory_limit``) is refused
at planning, naming the statement, the output, its shape and bytes, where the kernel's output is
sparse it runs (``deg[i] = SUM(G[i,j])`` of a 10^11-row G: a sparse vector; ``R[a,b] =
SUM(T[a,b,c] * x[c])``: CSR of T's occupied rows; ``R3`` with a finite W: COO tiles of its
entries); the row pointers
a kernel builds over a COO box's rows (SpGEMM, spjoin) count in the plan's projected peak, so a
plan that would build 80 GB of them is refused at planning under ``memory_limit`` (and placed
without an overflow without one). Each runs in a child under an RLIMIT_AS, so a regression fails
the test instead of exhausting the machine's memory."""
from __future__ import annotations

import json

import pytest

import tensordb
from tensordb.optimizer.cost import OpModel
from tensordb.optimizer.sparse_cost import StoredStats
from tensordb.plan.ir import EinOp
from tests.harness import run_script

CHILD = r"""
import json, resource, sys, tempfile, os
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import tensordb
d = tempfile.mkdtemp(dir=sys.argv[1])
n, out = 10**11, {}
for limit in [None, "1GB"]:
    with tensordb.connect(os.path.join(d, f"db{limit}"), **({"memory_limit": limit} if limit else {})) as con:
        con.execute(f"CREATE TENSOR G FROM (SELECT r * 1000000007 AS a, r * 999999937 AS b, "
                    f"1.5 + r AS v FROM range(5) t(r)) INDEX (a, b) VALUE v SHAPE ({n}, {n})")
        con.execute("CREATE TENSOR T FROM (SELECT r * 100003 AS a, r * 99991 AS b, r % 4 AS c, "
                    "1.5 + r AS v FROM range(5) t(r)) INDEX (a, b, c) VALUE v "
                    "SHAPE (1000000, 1000000, 4)")
        con.execute("CREATE TENSOR x FROM (SELECT r AS c, 2.0 + r AS v FROM range(4) t(r)) "
                    "INDEX (c) VALUE v SHAPE (4)")
        con.execute("CREATE TENSOR W FROM (SELECT r // 2 AS c, r % 2 AS k, 1.0 + r AS v "
                    "FROM range(8) t(r)) INDEX (c, k) VALUE v SHAPE (4, 2)")
        con.execute("CREATE TENSOR Wi FROM (SELECT r // 2 AS c, r % 2 AS k, CASE WHEN r = 3 "
                    "THEN 'inf'::DOUBLE ELSE 1.0 + r END AS v FROM range(8) t(r)) INDEX (c, k) "
                    "VALUE v SHAPE (4, 2)")
        qs = ["R3i[a,b,k] = SUM(T[a,b,c] * Wi[c,k])", "R3[a,b,k] = SUM(T[a,b,c] * W[c,k])",
              "deg[i] = SUM(G[i,j])", "m[j] = MAX(G[i,j])",
              "R[a,b] = SUM(T[a,b,c] * x[c])"] + \
            (["R2[i,k] = SUM(G[i,j] * G[j,k])"] if limit else [])
        for q in qs:
            try:
                con.execute(q)
                name = q.split("[")[0]
                S = con.sparse(name)
                got = ["ran", [[int(c) for c in cs] for cs in S.coords], S.data.tolist()] \
                    if hasattr(S, "coords") else ["ran", [], []]
                if not hasattr(S, "coords"):
                    C = S.tocoo()
                    got = ["ran", [C.row.tolist(), C.col.tolist()], C.data.tolist()]
            except tensordb.Error as e:
                got = [type(e).__name__, str(e)]
            out[f"{limit} {q}"] = [got, sorted(t["name"] for t in con.tensors())]
        con.execute(f"CREATE TENSOR G10 FROM (SELECT r * 1000000007 AS a, r * 999999937 AS b, "
                    f"1.5 + r AS v FROM range(5) t(r)) INDEX (a, b) VALUE v SHAPE ({10**10}, {10**10})")
        try:  # planned and placed: its tiles' dense bytes pass int64 (no OverflowError)
            out[f"{limit} explain"] = "spmm" in con.explain("R2[i,k] = SUM(G10[i,j] * G10[j,k])")
        except tensordb.Error as e:
            out[f"{limit} explain"] = [type(e).__name__, str(e)]
        out[f"{limit} S"] = (con.execute("S = SUM(G[i,j])"), float(con.tensor("S")))[1]
print(json.dumps(out))
"""


def test_outputs_hypersparse_inputs_cannot_fill_are_refused_at_planning(tmp_path):
    proc = run_script(CHILD, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    for limit in ["None", "1GB"]:
        # Wi holds an inf: T's absent 0s times it are NaN, the product is dense: refused
        q = "R3i[a,b,k] = SUM(T[a,b,c] * Wi[c,k])"
        (kind, msg), names = out[f"{limit} {q}"]
        assert kind == "OutOfMemoryError", msg
        assert msg.startswith(q), msg
        if limit == "None" or "no tiling fits" not in msg:  # under 1 GB the optimizer may refuse first
            assert "its output R3i of shape (1000000, 1000000, 2) is dense: 14.6 TiB" in msg \
                and "T: sparse" in msg, msg
        assert "R3i" not in names  # nothing stored
        # W finite: COO tiles of T's 5 entries times W's 2 columns (lim41), not 14.6 TiB
        (kind, coords, data), names = out[f"{limit} R3[a,b,k] = SUM(T[a,b,c] * W[c,k])"]
        w = {(r // 2, r % 2): 1.0 + r for r in range(8)}
        want = sorted(((r * 100003, r * 99991, k), (1.5 + r) * w[(r % 4, k)])
                      for r in range(5) for k in range(2))
        assert kind == "ran" and sorted(zip(zip(*coords), data)) == want, (coords, data)
        # a reduction into a vector of the hypersparse rows: a sparse vector, its 5 entries
        for q, agg in [("deg[i] = SUM(G[i,j])", 0), ("m[j] = MAX(G[i,j])", 1)]:
            (kind, coords, data), names = out[f"{limit} {q}"]
            want = sorted((r * (1000000007, 999999937)[agg], 1.5 + r) for r in range(5))
            assert kind == "ran" and sorted(zip(coords[0], data)) == want, (q, coords, data)
        # T's rows times x: CSR of T's 5 occupied (a, b) elements, not a 7.3 TiB dense matrix
        (kind, coords, data), names = out[f"{limit} R[a,b] = SUM(T[a,b,c] * x[c])"]
        want = sorted(((r * 100003, r * 99991), (1.5 + r) * (2.0 + r % 4)) for r in range(5))
        got = sorted(((a, b), v) for a, b, v in zip(coords[0], coords[1], data))
        assert kind == "ran" and [g for g in got if g[1]] == [w for w in want if w[1]], got
        assert out[f"{limit} S"] == float(sum(1.5 + r for r in range(5)))  # a scalar runs
    # planned (a machine of little memory may find no tiling: refused as such, never an
    # InternalError)
    assert out["None explain"] is True or out["None explain"][0] == "OutOfMemoryError", \
        out["None explain"]
    # 10^11 rows of row pointers for its CSR output: refused at planning
    (kind, msg), names = out["1GB R2[i,k] = SUM(G[i,j] * G[j,k])"]
    assert kind == "OutOfMemoryError" and ("no tiling fits the memory budget" in msg or
                                           "its output R2 of shape" in msg), msg
    assert "R2" not in names  # nothing stored


@pytest.mark.parametrize("formats,counted", [(("coo",), True), (("csr",), False)])
def test_the_row_pointers_of_coo_boxes_count_in_a_semirings_calls_memory(formats, counted):
    n = 10**8
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": n, "j": n, "k": n},
                           agg="max")
    st = StoredStats(formats, 5, 200)
    m = OpModel.of(op, {"A": "float64", "B": "float64"}, 1, stats={"A": st, "B": st})
    assert m.sparse_kernel == ("semiring", 0)  # max-times of two sparse matrices
    for d in [(1, 1, 1), (4, 2, 1), (100, 1000, 7)]:
        tile = [-(-n // p) for p in d]
        ptrs = 8 * (tile[0] + 1) + 8 * (tile[2] + 1)  # A CSR over its rows i, B over its j
        assert m.row_ptr_bytes(tile) == (ptrs if counted else 0)
        # what the optimizer fits to the budget: the call's memory holds them
        assert m.call_memory(d).inputs >= (ptrs if counted else 0)
    # an elementwise join of COO boxes runs on their entries (exec/sparse_hyper.py): none
    join = EinOp.contraction("C", "ij", [("A", "ij"), ("B", "ij")], {"i": n, "j": n})
    mj = OpModel.of(join, {"A": "float64", "B": "float64"}, 1, stats={"A": st, "B": st})
    assert mj.sparse_kernel == ("spjoin", 0) and mj.row_ptr_bytes([n, n]) == 0
    # SpGEMM of COO boxes works on the occupied ids (sparse_kernels._spgemm_coo): none counted
    mm = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": n, "j": n, "k": n})
    mg = OpModel.of(mm, {"A": "float64", "B": "float64"}, 1, stats={"A": st, "B": st})
    assert mg.sparse_kernel == ("spmm", 0) and mg.row_ptr_bytes([n, n, n]) == 0
    # a reduction of a COO matrix works on its occupied rows: nothing counted
    red = EinOp.contraction("r", "i", [("A", "ij")], {"i": n, "j": n})
    mr = OpModel.of(red, {"A": "float64"}, 1, stats={"A": st})
    assert mr.row_ptr_bytes([n, n]) == 0
