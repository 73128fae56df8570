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
