"""The plan-time memory of hypersparse inputs (every tile COO): an output its sparse inputs
cannot fill (``deg[i] = SUM(G[i,j])`` of a 10^11 x 10^11 G of 5 entries, a dense vector of 800 GB:
more than the machine's memory, with or without ``memory_limit``) is refused at planning, naming the statement, the output, its shape and bytes; the row pointers
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
        qs = ["deg[i] = SUM(G[i,j])", "m[j] = MAX(G[i,j])"] + (["R2[i,k] = SUM(G[i,j] * G[j,k])"] if limit else [])
        for q in qs:
            try:
                con.execute(q)
                got = "ran"
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
        for q, name, shape in [("deg[i] = SUM(G[i,j])", "deg", "(100000000000,)"),
                               ("m[j] = MAX(G[i,j])", "m", "(100000000000,)")]:
            (kind, msg), names = out[f"{limit} {q}"]
            assert kind == "OutOfMemoryError", msg
            assert msg.startswith(q) and f"its output {name} of shape {shape} is dense: 745.1 GiB" \
                in msg and "G: sparse" in msg, msg
            assert names == ["G"]  # nothing stored
        assert out[f"{limit} S"] == float(sum(1.5 + r for r in range(5)))  # a scalar runs
    # planned (a machine of little memory may find no tiling: refused as such, never an
    # InternalError)
    assert out["None explain"] is True or out["None explain"][0] == "OutOfMemoryError", \
        out["None explain"]
    # 10^11 rows of row pointers for G[j,k]'s box: no tiling of 1 GB holds them
    (kind, msg), names = out["1GB R2[i,k] = SUM(G[i,j] * G[j,k])"]
    assert kind == "OutOfMemoryError" and "no tiling fits the memory budget" in msg, msg
    assert names == ["G"]  # nothing stored


@pytest.mark.parametrize("formats,counted", [(("coo",), True), (("csr",), False)])
def test_the_row_pointers_of_coo_boxes_count_in_a_spgemm_calls_memory(formats, counted):
    n = 10**8
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": n, "j": n, "k": n})
    st = StoredStats(formats, 5, 200)
    m = OpModel.of(op, {"A": "float64", "B": "float64"}, 1, stats={"A": st, "B": st})
    assert m.sparse_kernel == ("spmm", 0)  # SpGEMM: spmm with a sparse partner
    for d in [(1, 1, 1), (4, 2, 8), (100, 1000, 1)]:
        tile = [-(-n // p) for p in d]  # i, k, j: output labels first
        ptrs = 8 * (tile[0] + 1) + 8 * (tile[2] + 1)  # A's rows are i, B's are j
        assert m.row_ptr_bytes(tile) == (ptrs if counted else 0)
        # what the optimizer fits to the budget: the call's memory holds them
        assert m.call_memory(d).inputs >= (ptrs if counted else 0)
    # a reduction of a COO matrix works on its occupied rows: nothing counted
    red = EinOp.contraction("r", "i", [("A", "ij")], {"i": n, "j": n})
    mr = OpModel.of(red, {"A": "float64"}, 1, stats={"A": st})
    assert mr.row_ptr_bytes([n, n]) == 0
