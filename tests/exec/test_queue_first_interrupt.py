"""A Ctrl-C as a pooled run queues its first tasks (``_Run._queue_first``): between counting
them as pending and putting them on the workers' queues it left the run waiting for items that
were never queued, forever. The count and the put are now one step for a Ctrl-C (held, then
raised). A real SIGINT (os.kill of this process) sent by a hook at the queues' ``put_many``, that
is in the very window, every time; the run must end with KeyboardInterrupt within seconds
(an alarm ends the test otherwise), and the connection then answers as numpy does."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import tensordb

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread()
                                or not hasattr(signal, "SIGALRM"),
                                reason="a SIGINT raises in the main thread; the guard is an alarm")


class Hung(Exception):
    pass


def test_a_ctrl_c_between_the_count_and_the_put_ends_the_run(monkeypatch):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((768, 512)), rng.standard_normal((512, 384))
    with tensordb.connect(workers=2) as con:
        con.load("A", a, tile=(128, 512))
        con.load("B", b)
        sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
        queues = con.engine.executor().queues
        real = queues.put_many
        fired = []

        def put_many(items):
            if not fired:
                fired.append(len(items))
                os.kill(os.getpid(), signal.SIGINT)  # Python's handler runs at the next bytecode
            return real(items)

        monkeypatch.setattr(queues, "put_many", put_many)

        def hung(signum, frame):
            raise Hung("the run still waited for its first tasks after a Ctrl-C")

        old = signal.signal(signal.SIGALRM, hung)
        signal.alarm(30)
        try:
            with pytest.raises(KeyboardInterrupt):
                con.execute(sql)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        assert fired and fired[0] >= 1
        assert "c" not in {t["name"].lower() for t in con.tensors()}  # nothing committed
        con.execute(sql)  # the pool runs the next statement: nothing of the run left behind
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-12)
