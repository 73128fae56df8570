"""LETs kept on the devices between statements (exec/devlets.py), and the copies a tight device
budget saves, on the stand-in for CuPy (tests/fakecupy: NumPy arrays tagged with their
device, every copy recorded; here its matrix products are counted too). Answers are checked
against NumPy; "computed once" against the stand-in's record of products and the pool's
kernel calls per operation."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tensordb
from tests.fakecupy.cupy import Dev, DeviceXp
from tests.exec.test_gpu_cache import _gpu, _keys, as_opt_einsum_cupy

RNG = np.random.default_rng(21)
X = RNG.standard_normal((32, 16))
W = RNG.standard_normal((16, 24))


class CountingXp(DeviceXp):
    """The stand-in, counting its matrix products (the contraction kernels' calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.products = 0
        self._count = threading.Lock()

    def matmul(self, *args, **kw):
        with self._count:
            self.products += 1
        out = np.matmul(*args, **kw)
        return out.view(Dev) if type(out) is np.ndarray else out

    def tensordot(self, *args, **kw):
        with self._count:
            self.products += 1
        return self.__getattr__("tensordot")(*args, **kw)


@pytest.fixture
def xp(monkeypatch):
    """The counting stand-in, also as opt_einsum's 'cupy' backend (restored afterwards)."""
    return as_opt_einsum_cupy(monkeypatch, CountingXp())


def _loaded(con, x=X, w=W):
    con.load("X", x, tile=(16, 8))
    con.load("W", w, tile=(8, 12))


def _calls_of(con, name: str) -> int:
    """Kernel calls the last run made for the operations computing ``name`` (its own and its
    temporaries': H and H.t1)."""
    ops = con.last_plan.ops
    return sum(m.kernel_calls for op, m in zip(ops, con.last_run.ops)
               if getattr(op.output, "name", op.output) == name)


LET = "LET H[b,f] = RELU(SUM(X[b,h] * W[h,f]))"


def _h(x=X, w=W):
    return np.maximum(x @ w, 0)


def test_a_let_computed_by_one_statement_is_read_from_the_device_by_the_next(xp):
    with tensordb.connect() as con:
        _loaded(con)
        tiles = _gpu(con, xp)
        con.execute(LET)
        con.execute("Y[b] = SUM(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), _h().sum(1), rtol=1e-12)
        first = con.last_run.copies
        assert xp.products > 0 and _calls_of(con, "H") > 0
        kept = first["let_tiles_kept"]
        assert kept == len(con.last_plan.outputs["H"].tiles)
        for sql, name, want in (("Z[b] = MAX(H[b,f])", "Z", _h().max(1)),
                                ("V[f] = SUM(H[b,f])", "V", _h().sum(0))):
            xp.clear()
            xp.products = 0
            con.execute(sql)
            np.testing.assert_allclose(con.tensor(name), want, rtol=1e-12)
            copies = con.last_run.copies
            # H's tiles came from the device: no product, no kernel of H's, nothing copied in
            assert xp.products == 0 and _calls_of(con, "H") == 0
            assert copies["let_hits"] == kept and xp.h2d == []
            assert xp.d2h == [want.nbytes]  # only the result goes back
        lets = [k for k in _keys(tiles) if k[0].startswith("=")]
        assert len(lets) == kept and len({k[0] for k in lets}) == 1


def test_a_script_computes_its_let_once_and_the_next_statement_reads_it(xp):
    """The issue's script: H is computed once (in the script's one run), and the next
    statement, another execute, reads it from the device."""
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp)
        con.execute(f"{LET}; Y[b] = SUM(H[b,f]); Z[b] = MAX(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), _h().sum(1), rtol=1e-12)
        np.testing.assert_allclose(con.tensor("Z"), _h().max(1), rtol=1e-12)
        h_tiles = len(con.last_plan.outputs["H"].tiles)
        relu = [m.kernel_calls for op, m in zip(con.last_plan.ops, con.last_run.ops)
                if op.output == "H"]
        assert relu == [h_tiles]  # one RELU per tile of H: H computed once for both
        products = xp.products
        assert products == _calls_of(con, "H") - h_tiles  # the contraction's calls, once each
        xp.products = 0
        con.execute("U[b] = MIN(H[b,f])")
        np.testing.assert_allclose(con.tensor("U"), _h().min(1), rtol=1e-12)
        assert xp.products == 0 and con.last_run.copies["let_hits"] == h_tiles
        xp.products = 0  # the same script again: H is the same value, read from the device
        con.execute(f"{LET}; Y[b] = SUM(H[b,f]); Z[b] = MAX(H[b,f])")
        assert xp.products == 0 and con.last_run.copies["let_hits"] == h_tiles
        np.testing.assert_allclose(con.tensor("Z"), _h().max(1), rtol=1e-12)


def test_a_redefined_let_is_computed_again(xp):
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp)
        con.execute(f"{LET}; Y[b] = SUM(H[b,f])")
        xp.products = 0
        con.execute("LET H[b,f] = SUM(X[b,h] * W[h,f]) * 2")  # another definition
        con.execute("Y[b] = SUM(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), (X @ W * 2).sum(1), rtol=1e-12)
        assert xp.products > 0 and con.last_run.copies.get("let_hits", 0) == 0
        xp.products = 0
        con.execute(LET)  # the first definition again: its tiles are still there
        con.execute("Y[b] = SUM(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), _h().sum(1), rtol=1e-12)
        assert xp.products == 0 and con.last_run.copies["let_hits"] > 0


@pytest.mark.parametrize("how", ["statement", "load"])
def test_a_replaced_input_computes_the_let_again(xp, how):
    x2 = X * -0.5 + 1
    with tensordb.connect() as con:
        _loaded(con)
        tiles = _gpu(con, xp)
        con.execute(f"{LET}; Y[b] = SUM(H[b,f])")
        old = {k[0] for k in _keys(tiles) if k[0].startswith("=")}
        if how == "statement":
            con.execute("X[b,h] = X[b,h] * -0.5 + 1")
        else:
            con.load("X", x2, tile=(16, 8), replace=True)
        # the LET's tiles read the old X: they left at the commit that replaced it
        assert not old & {k[0] for k in _keys(tiles)}
        xp.products = 0
        con.execute("Y[b] = SUM(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), _h(x2).sum(1), rtol=1e-12)
        assert xp.products > 0 and con.last_run.copies.get("let_hits", 0) == 0
        xp.products = 0
        con.execute("Z[b] = MAX(H[b,f])")  # the new value is kept in its turn
        np.testing.assert_allclose(con.tensor("Z"), _h(x2).max(1), rtol=1e-12)
        assert xp.products == 0 and con.last_run.copies["let_hits"] > 0


def test_a_let_over_a_result_of_its_own_group_is_read_back_correctly(xp):
    """A LET reading a tensor its group replaces first: its value is that of the new tensor
    (the digest names the operations, not the name), and the next run reads it right."""
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp)
        con.execute(LET)
        con.execute("X[b,h] = X[b,h] + 1; Y[b] = SUM(H[b,f])")
        x1 = X + 1
        np.testing.assert_allclose(con.tensor("Y"), _h(x1).sum(1), rtol=1e-12)
        con.execute("Z[b] = MAX(H[b,f])")
        np.testing.assert_allclose(con.tensor("Z"), _h(x1).max(1), rtol=1e-12)


def test_without_the_cache_a_let_is_computed_by_every_statement(xp):
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp, cache=False)
        con.execute(f"{LET}; Y[b] = SUM(H[b,f])")
        xp.products = 0
        con.execute("Z[b] = MAX(H[b,f])")
        np.testing.assert_allclose(con.tensor("Z"), _h().max(1), rtol=1e-12)
        assert xp.products > 0 and "let_hits" not in con.last_run.copies


@pytest.mark.parametrize("devices", [(0,), (0, 1)])
def test_let_tiles_leave_under_a_tight_budget_and_answers_stay_right(xp, devices):
    """A budget too small to keep everything between statements: LET tiles are kept where the
    run's admission can drop them again, and leave when room is needed; the cache never
    holds more than the limit after a run, and the answers equal NumPy."""
    x = RNG.standard_normal((128, 64))
    w = RNG.standard_normal((64, 128))
    limit = 160 << 10  # X, W and H are 64 + 64 + 128 KiB
    h = np.maximum(x @ w, 0)
    kept = hits = 0
    with tensordb.connect(memory_limit=limit) as con:
        con.load("X", x, tile=(64, 32))
        con.load("W", w, tile=(32, 64))
        tiles = _gpu(con, xp, devices=devices, memory_limit=limit)
        con.execute(LET)
        for sql, name, want in (("Y[b] = SUM(H[b,f])", "Y", h.sum(1)),
                                ("Z[b] = MAX(H[b,f])", "Z", h.max(1)),
                                ("V[f] = SUM(H[b,f])", "V", h.sum(0)),
                                ("Z[b] = MIN(H[b,f])", "Z", h.min(1))):
            con.execute(sql)
            np.testing.assert_allclose(con.tensor(name), want, rtol=1e-10)
            assert tiles.cache.bytes <= limit and con.last_run.over_budget == 0
            kept += con.last_run.copies.get("let_tiles_kept", 0)
            hits += con.last_run.copies.get("let_hits", 0)
        assert kept > 0 and hits > 0


def test_explain_analyze_shows_the_let_tiles_read_from_the_device(xp):
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp)
        con.execute(f"{LET}; Y[b] = SUM(H[b,f])")
        text = con.explain("Z[b] = MAX(H[b,f])", analyze=True)
        h_tiles = len(con.last_plan.outputs["H"].tiles)
        assert f"H (LET) {h_tiles}/{h_tiles} tiles" in text  # resident before the run
        assert f"{h_tiles} LET tile(s) read on the device" in text
        np.testing.assert_allclose(con.tensor("Z"), _h().max(1), rtol=1e-12)


def test_an_output_tile_moved_off_the_device_is_copied_to_the_host_once(xp):
    """Under a tight budget finished output tiles leave the device while later tasks still read
    them: the host copy made for the output's file is the one kept, so every byte of the
    outputs crosses to the host once."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 64)), rng.standard_normal((64, 256))
    limit = 3 << 18  # C alone is 512 KiB, in 64 tiles
    # planned for 2 workers on any machine (on 16 cores the plan's order frees C's tiles before
    # the budget must move any: nothing would be moved to check)
    with tensordb.connect(memory_limit=limit, workers=2) as con:
        con.load("A", a, tile=(32, 64))
        con.load("B", b, tile=(64, 32))
        _gpu(con, xp, memory_limit=limit, cache=False)
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 8, k 8, j 1); "
                    "D[k] = MAX(C[i,k])")
        c = a @ b
        np.testing.assert_allclose(con.tensor("C"), c, rtol=1e-10)
        np.testing.assert_allclose(con.tensor("D"), c.max(0), rtol=1e-10)
        moved = con.last_run.spilled_bytes  # bytes the budget moved off the device
        # C's tiles (8 KiB; A's and B's are 16) crossed once each, whether moved or not...
        assert sum(n for n in xp.d2h if n == 32 * 32 * 8) == c.nbytes
        # ...and some were moved: more bytes left the device than were copied for it
        extra = sum(xp.d2h) - c.nbytes - c.max(0).nbytes  # A's and B's tiles moved to the host
        assert moved > extra >= 0


def test_explain_analyze_shows_the_copies_of_each_operation(xp):
    """Per operation: the bytes its Loads copied host -> device, and its stored result's
    device -> host; they add up to the run's figures."""
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp)
        text = con.explain("C[b,f] = SUM(X[b,h] * W[h,f]); D[f] = MAX(C[b,f])", analyze=True)
        c = X @ W
        np.testing.assert_allclose(con.tensor("D"), c.max(0), rtol=1e-12)
        per_op, run = con.last_run.op_copies, con.last_run.copies
        assert per_op["C"] == {"host_to_device": X.nbytes + W.nbytes,
                               "device_to_host": c.nbytes}
        assert per_op["D"] == {"device_to_host": c.max(0).nbytes}
        for kind in ("host_to_device", "device_to_host"):
            assert sum(p.get(kind, 0) for p in per_op.values()) == run[kind] == \
                sum(getattr(xp, "h2d" if kind == "host_to_device" else "d2h"))
        assert "copied per operation: C: 7.0 KiB host->device, 6.0 KiB device->host; " \
               "D: 192 B device->host" in text
        js = con.explain("D[f] = MAX(C[b,f])", analyze=True, format="json")
        assert '"op_copies"' in js


@pytest.mark.parametrize("devices", [(0,), (0, 1)])
def test_a_let_cut_into_other_tiles_is_assembled_on_the_device(xp, devices):
    """The next plan cuts H another way (here its PIECES, which are not part of its value): each
    of its tiles is assembled on the device from the cached tiles that cover it, with no
    product run again, on uneven boundaries too (3 pieces of 32 and of 24)."""
    h = _h()
    with tensordb.connect() as con:
        _loaded(con)
        _gpu(con, xp, devices=devices)
        con.execute(f"{LET} WITH (PIECES b 4, f 1); Y[b] = SUM(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), h.sum(1), rtol=1e-12)
        for pieces, agg, want in (("b 2, f 2", "MAX", h.max(1)), ("b 3, f 3", "MIN", h.min(1)),
                                  ("b 1, f 2", "SUM", h.sum(1))):
            xp.products = 0
            xp.clear()
            con.execute(f"{LET} WITH (PIECES {pieces}); Z[b] = {agg}(H[b,f])")
            np.testing.assert_allclose(con.tensor("Z"), want, rtol=1e-12)
            copies = con.last_run.copies
            n = len(con.last_plan.outputs["H"].tiles)
            assert xp.products == 0 and xp.h2d == [] and copies["let_hits"] == n
            assert copies["let_assembled"] == n
