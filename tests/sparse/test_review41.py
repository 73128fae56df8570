"""Adversarial review (stop 41) of the rank-3+ sparse kernels merged at stop 40 (nd40, hyp40b):
each test is a case the review found wrong or worth pinning, checked against NumPy on the
densified inputs (or a dict of entries where the extent is too large to densify)."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb

OPS = {"*": np.multiply, "+": np.add, "-": np.subtract}


def _huge(con, name, ext, first_a, step, value, tile):
    con.execute(f"CREATE TENSOR {name} FROM (SELECT {first_a} + {step} * r AS a, r AS b, "
                f"2 * r AS c, {value} + r AS v FROM range(10) t(r)) INDEX (a, b, c) VALUE v "
                f"SHAPE ({ext}, {ext}, {ext}) TILE ({tile}, {ext}, {ext})")
    return {(first_a + step * r, r, 2 * r): float(value + r) for r in range(10)}


@pytest.mark.parametrize("pieces", ["", " WITH (PIECES a 2)", " WITH (PIECES a 4, b 2)"])
def test_a_join_whose_box_of_one_operand_is_absent_reads_no_zeros(tmp_path, pieces):
    """T's entries in the first stored tile along a, U's in the second: a box where one is
    absent was np.zeros of the box (3.55 PiB: OutOfMemoryError at 1.2 KiB projected)."""
    ext = 10**5
    with tensordb.connect(str(tmp_path / "db"), memory_limit="512MB") as con:
        t = _huge(con, "T", ext, 0, 1, 1.0, ext // 2)
        u = _huge(con, "U", ext, ext - 10, 1, 2.0, ext // 2)
        for fn in OPS:
            q = f"X[a,b,c] = T[a,b,c] {fn} U[a,b,c]{pieces}"
            assert "coo tiles from the kernel" in con.explain(q), q
            con.execute(q)
            want = {k: OPS[fn](t.get(k, 0.0), u.get(k, 0.0)) for k in set(t) | set(u)}
            want = {k: v for k, v in want.items() if v != 0}
            got = {(a, b, c): v for a, b, c, v in con.execute("SELECT * FROM X").fetchall()}
            assert got == want, q
