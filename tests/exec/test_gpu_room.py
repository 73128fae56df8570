"""The room a GPU run is given (exec/gpu.py ``DeviceTiles.room``), on the stand-in for CuPy
(tests/fakecupy): a box cached on one device is no room on another, where the run copies it."""
from __future__ import annotations

import numpy as np

import tensordb
from tensordb.bind import bind_graph
from tensordb.exec.budget import device_upper_bytes
from tensordb.exec.devcache import load_key
from tensordb.exec.gpu import DeviceTiles
from tensordb.exec.pool import LocalExecutor
from tensordb.physical.plan import Load
from tests.exec.test_gpu_cache import A, B, _hand_plan, _loaded
from tests.fakecupy.cupy import DeviceXp


def _copied_in(plan, cache, devices) -> int:
    """The bytes ``plan``'s Loads put on the devices: each box whose key is not cached on the
    device of the worker that loads it (a box on another device is copied from there)."""
    out = 0
    for t in plan.tasks:
        if isinstance(t, Load):
            key = load_key(t, plan.readers[t.tensor])
            if (key, devices[t.worker % len(devices)]) not in cache.entries:
                out += int(np.prod([b - a for a, b in zip(t.starts, t.stops)])) * 8
    return out


def test_a_box_cached_on_another_device_is_not_counted_as_room():
    """A's and B's tiles cached on device 0, then a plan whose Loads all run on device 1 (each
    box copied there from device 0), the devices' capacity the plan's own upper bound: the
    boxes on device 0 are no room for device 1's copies, so ``room`` drops them first (the
    cache and the run together fit), and the answer is A @ B."""
    xp = DeviceXp()
    devices = [0, 1]
    with tensordb.connect() as con:
        _loaded(con)
        g = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C")
        _, planned = con.plan(bind_graph(g, con.store), g.pieces)
        op, readers = planned.ops[0], dict(planned.readers)
        ex = LocalExecutor(2, tiles=DeviceTiles(devices, xp=xp))
        try:
            ex.run(_hand_plan(op, readers, 0), con.store)  # every Load on device 0
            tiles, cache = ex.tiles, ex.tiles.cache
            assert cache.bytes == A.nbytes + B.nbytes
            plan = _hand_plan(op, readers, 1)  # every Load on device 1
            upper = device_upper_bytes(plan)
            # capacity: 3/4 of the devices' memory, summed; here the plan's bound and 24 bytes
            per = (upper * 2) // 3 + 16
            xp.cuda.runtime.memGetInfo = lambda: (per, per)
            cap = tiles.capacity()
            assert upper <= cap < upper + cache.bytes
            tiles.room(plan, None)
            loads = sum(int(np.prod([b - a for a, b in zip(t.starts, t.stops)])) * 8
                        for t in plan.tasks if isinstance(t, Load))
            need = cache.bytes + upper - loads + _copied_in(plan, cache, devices)
            assert need <= cap, (need, cap, cache.bytes)
            second = ex.run(plan, con.store)
        finally:
            ex.close()
    np.testing.assert_allclose(second.tiles[6], A @ B, rtol=1e-12)


def _let_run(con, xp):
    """T (caching X's and W's boxes on the device and T's tiles as its new version), then a
    LET H of X and W read by Y: the run that makes H's tiles, which it keeps on the device."""
    from tests.exec.test_gpu_cache import _gpu
    from tests.exec.test_gpu_lets import LET, X, W, _h, _loaded as _loaded_xw
    _loaded_xw(con)
    tiles = _gpu(con, xp)
    con.execute("T[b,f] = SUM(X[b,h] * W[h,f])")
    np.testing.assert_allclose(con.tensor("T"), X @ W, rtol=1e-12)
    return tiles, LET, X, W, _h


def test_a_let_is_not_kept_where_dropping_the_plans_own_boxes_made_the_room(monkeypatch):
    """No memory_limit, the devices' capacity less than the run and the LET tiles it would keep:
    ``room`` drops the idle cache (T's tiles, then X's and W's boxes the run reads) and, as the
    run copies those boxes back, still finds no room for the LET's tiles; none is kept (the
    bytes dropped of the plan's own boxes are no room: before, they were counted as freed)."""
    from tests.exec.test_gpu_cache import as_opt_einsum_cupy
    xp = as_opt_einsum_cupy(monkeypatch, DeviceXp())
    with tensordb.connect() as con:  # the run's bound, measured on a roomy device
        tiles, let, x, w, h = _let_run(con, xp)
        con.execute(let)
        con.execute("Y[b] = SUM(H[b,f])")
        upper = device_upper_bytes(con.last_plan)
        assert con.last_run.copies["let_tiles_kept"] > 0
    lets = h().nbytes
    resident = x.nbytes + w.nbytes
    cap = upper + lets - resident // 2  # the run and its LET tiles do not fit; the run does
    assert upper < cap < upper + lets
    xp = as_opt_einsum_cupy(monkeypatch, DeviceXp())
    per = -(-cap * 4 // 3)
    xp.cuda.runtime.getDeviceCount = lambda: 1
    xp.cuda.runtime.memGetInfo = lambda: (per, per)
    with tensordb.connect() as con:
        tiles, let, x, w, h = _let_run(con, xp)
        assert tiles.capacity() in (cap, cap + 1)
        con.execute(let)
        con.execute("Y[b] = SUM(H[b,f])")
        np.testing.assert_allclose(con.tensor("Y"), h().sum(1), rtol=1e-12)
        assert con.last_run.copies.get("let_tiles_kept", 0) == 0
