"""What a Load of a box of sparse tiles holds while it is read (storage/sparse.read_sparse_box)
stays within what the memory budget counts for it (exec/budget.load_bytes, exec/sizes
.sparse_box_bytes): since issue 26 a box that only sparse kernels read counts its entries, not
its dense bytes, so a box cut from several tiles must not hold several times its entries while
it is put together (it held four times them, through COO). Measured by tracemalloc (NumPy's
allocations: scipy's arrays are NumPy's); the box's values checked against scipy's slice of
the same matrix."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec.budget import load_bytes
from tensordb.physical.plan import Load
from tensordb.storage.sparse import Filled, densify, read_sparse_box

N, T = 1200, 300


def _matrix(rng, dtype, holes: bool):
    G = sp.random_array((N, N), density=0.01, format="csr", rng=rng, dtype=np.float64)
    G = G.toarray().astype(dtype)
    if holes:  # whole tiles absent: a block-sparse matrix
        G[:T, T:3 * T] = 0
        G[2 * T:3 * T, :] = 0
    return G


BOXES = [((0, 0), (N, N)), ((50, 70), (1150, 1130)), ((0, 0), (T, N)), ((10, 0), (290, N)),
         ((0, 100), (N, 200)), ((250, 250), (650, 950)), ((0, 0), (N, T))]


@pytest.mark.parametrize("dtype, holes, fill", [(np.float64, False, 0.0),
                                                (np.float32, True, 0.0),
                                                (np.float64, False, np.inf)])
def test_a_sparse_box_holds_no_more_than_counted(tmp_path, dtype, holes, fill):
    rng = np.random.default_rng(5)
    G = _matrix(rng, dtype, holes)
    stored = G if fill == 0 else np.where(G == 0, fill, G).astype(dtype)
    with tensordb.connect(tmp_path / "g.tdb", workers=1) as con:
        if fill == 0:
            con.load("G", sp.csr_array(G), tile=(T, T))
        else:
            con.load("G", sp.csr_array(G), tile=(T, T), fill_value=fill)
        con.load("x", np.ones(N, dtype))
        con.execute("y[i] = MIN(G[i,j] + x[j])" if fill else "y[i] = SUM(G[i,j] * x[j])")
        plan = con.engine.last_plan
        reader = plan.readers["G"]
        assert reader.has_sparse
        for starts, stops in BOXES:
            task = Load(0, "G", starts, stops)
            counted = load_bytes(plan, task)
            tracemalloc.start()
            try:
                box = read_sparse_box(reader, starts, stops)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert box is not None
            assert isinstance(box, Filled) == (fill != 0)
            want = stored[starts[0]:stops[0], starts[1]:stops[1]]
            np.testing.assert_array_equal(densify(box), want)
            assert peak <= counted, (starts, stops, peak, counted)


@pytest.mark.parametrize("n, m, tile", [(400, 3000, None), (600, 6000, (200, 200))])
def test_a_graphblas_kernels_copy_of_a_box_is_counted(tmp_path, n, m, tile):
    """A shortest-path step's kernel copies the stored graph's box into GraphBLAS while the box
    is held (the graph cache keeps the copy after the run): the run's upper bound, which
    decides whether it runs unbudgeted (the straight line), counts both. The cache is empty
    before the step: the GraphBLAS matrices it holds after are what the run made."""
    pytest.importorskip("graphblas")
    from tensordb.exec.budget import _read_sparse, upper_bytes
    from tensordb.exec.graphcache import GRAPHS
    from tests.sparse.test_sparse_fixed_cost import STEP, _graph
    D, loops = _graph(n, m, 7)
    with tensordb.connect(tmp_path / "g.tdb", workers=2) as con:
        if tile is None:
            con.load("D", loops, fill_value=np.inf)
        else:
            con.load("D", loops, fill_value=np.inf, tile=tile)
        con.load("dist", np.zeros(n))
        GRAPHS.clear()
        try:
            con.execute(STEP)
            want = np.full(n, np.inf)
            c = loops.tocoo()
            np.minimum.at(want, c.col, c.data)  # dist is 0 everywhere: the cheapest in-edge
            np.testing.assert_array_equal(con.tensor("dist"), want)
            plan = con.engine.last_plan
            read = _read_sparse(plan)
            boxes = sum(load_bytes(plan, t, t.key in read) for t in plan.tasks
                        if isinstance(t, Load) and t.tensor == "D")
            made = sum(v.ss.nbytes for e in GRAPHS.entries.values()
                       for k, v in e.array.slot.items() if k[0] == "gb")
            assert made > 0
            assert upper_bytes(plan, sparse=True) >= boxes + made
        finally:
            GRAPHS.clear()
