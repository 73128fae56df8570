"""A run's results straight from the workers that made them: no gather through the scheduler.

Dask tells a client that a task finished through the scheduler (the worker's stream to the
scheduler, then the scheduler's to the client, each batched by a few milliseconds), and a gather
then asks the scheduler, which asks the worker: two hops through the scheduler after the task
ends, on a small query more than the task itself. Here the client, right after it submits a
run, asks each worker that holds keys it gathers, directly (``tdb_collect``, a handler
``Collector``, a WorkerPlugin, installs on every worker), to answer once those keys are in its
memory: the results come back with the tasks' completion, one connection per worker.

The handler is installed on a worker the first time a run uses it (``install``, through
``client.run``: one round trip per worker and connection, none at the worker's start), as a
WorkerPlugin of the worker's own, so that it hears the worker's task transitions. Nothing here
replaces Dask's bookkeeping: the client keeps the run's futures, and a key that is not in the
worker's memory when it answers (its task failed or was cancelled, the key moved to another
worker after a loss, the worker left or has no handler) is gathered the usual way, from its
future (an error raised as Dask raises it). A worker answers within ``POLL_SECONDS`` with what
it has (a key it was never sent leaves no waiter behind), and the client asks again for the
rest, so a query of any length costs a request per worker and per ``POLL_SECONDS``.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

__all__ = ["Collector", "collect", "install", "PLUGIN"]

try:  # the executor's module (dask.py) names the extra to install when distributed is missing
    from distributed.diagnostics.plugin import WorkerPlugin as _Plugin
except ImportError:  # pragma: no cover - no Dask: nothing here is used
    _Plugin = object

PLUGIN = "tdb-collect"  # the plugin's name on a worker
POLL_SECONDS = 5.0      # the longest a worker holds a request before it answers with what it has
_SETTLED = frozenset({"memory", "error", "released", "forgotten", "cancelled", "missing"})


class Collector(_Plugin):
    """The worker side: ``tdb_collect(keys)`` answers with the keys' values once each of them
    is in this worker's memory or will not be (failed, released), or after ``POLL_SECONDS``.
    One per worker process, kept for its life (``install``)."""

    name = PLUGIN

    def setup(self, worker) -> None:
        self.worker = worker
        self.waiting: dict[str, list] = defaultdict(list)  # key -> futures of requests
        worker.handlers["tdb_collect"] = self.collect

    def teardown(self, worker) -> None:
        if worker.handlers.get("tdb_collect") == self.collect:
            del worker.handlers["tdb_collect"]
        self._wake(list(self.waiting))

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish in _SETTLED and key in self.waiting:
            self._wake([key])

    def _wake(self, keys) -> None:
        for key in keys:
            for fut in self.waiting.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    def _settled(self, key) -> bool:
        ts = self.worker.state.tasks.get(key)
        return ts is not None and ts.state in _SETTLED

    async def collect(self, comm=None, keys=(), timeout=POLL_SECONDS, **_) -> dict:
        """{'status': 'OK', 'data': {key: value} of the keys in memory, 'pending': the keys
        still running or not arrived yet}."""
        from distributed.protocol import to_serialize
        loop = asyncio.get_running_loop()
        waits = []
        for key in keys:
            if not self._settled(key):
                fut = loop.create_future()
                self.waiting[key].append(fut)
                waits.append((key, fut))
        if waits:
            await asyncio.wait([f for _, f in waits], timeout=timeout)
            for key, fut in waits:  # drop this request's waiters that did not fire
                if not fut.done():
                    left = [f for f in self.waiting.get(key, ()) if f is not fut]
                    if left:
                        self.waiting[key] = left
                    else:
                        self.waiting.pop(key, None)
        data = self.worker.data
        got = {k: to_serialize(data[k]) for k in keys if self._settled(k) and k in data}
        pending = [k for k in keys if not self._settled(k)]
        return {"status": "OK", "data": got, "pending": pending}


def install(dask_worker=None) -> bool:
    """Run on a worker by ``client.run``: add the handler unless it is there. True once it is."""
    worker = dask_worker
    if PLUGIN not in worker.plugins:
        plugin = Collector()
        plugin.setup(worker)
        worker.plugins[PLUGIN] = plugin
    return "tdb_collect" in worker.handlers


async def collect(client, futures: list, where: dict, values: dict | None = None) -> list:
    """The values of ``futures`` (in their order), each asked of the worker ``where[key]``
    directly where that worker has the handler (``where`` holds only those); what a worker
    does not hand over comes through the scheduler (``client._gather``:
    an error or a cancellation raised as Dask raises it). ``values``: filled, key -> value, as
    they arrive (what a run given up midway keeps)."""
    by_addr: dict[str, list] = defaultdict(list)
    for f in futures:
        by_addr[where.get(f.key)].append(f)
    values = {} if values is None else values

    async def from_worker(addr, futs) -> None:
        want = [f.key for f in futs]
        while want and addr is not None:
            try:
                answer = await client.rpc(addr).tdb_collect(keys=want)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - gone, no handler: the futures say what happened
                break
            if not isinstance(answer, dict) or answer.get("status") != "OK":
                break
            values.update(answer.get("data") or {})
            pending = set(answer.get("pending") or ())
            if not pending:
                break
            want = [k for k in want if k in pending]
        rest = [f for f in futs if f.key not in values]
        if rest:
            values.update(zip([f.key for f in rest], await client._gather(rest)))

    tasks = [asyncio.ensure_future(from_worker(a, fs)) for a, fs in by_addr.items()]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # one failed: the requests still out are dropped (their comms closed)
            if not t.done():
                t.cancel()
    return [values[f.key] for f in futures]
