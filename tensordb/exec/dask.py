"""The Dask executor: a TilePlan submitted to a Dask distributed cluster as one graph.

    con = tensordb.connect(executor="dask://10.0.0.5:8786")    # an existing scheduler
    con = tensordb.connect(workers=2, executor="dask://local")  # a LocalCluster owned by us

Each Dask worker is one tensordb worker: plan worker ``w`` runs on ``addresses[w % n]`` (the
sorted worker addresses), pinned with ``allow_other_workers=False``. Each worker's tile tasks of
one stage are one Dask task (``dask_fuse.py``: a few Dask tasks a query, not one per tile);
Dask moves tiles between workers; each tile task runs on the shared runtime (``runtime.py``: the
task interpreter, its error translation and the run's byte accounting), so results are the
same.
A Dask task combines all its inputs at once, so the executor asks the plan for aggregation
trees of at most ``max_fan_in`` partials per task (``physical/trees.py``, made when planning).
Stored input tiles are read on their worker from the memory-mapped payload where the worker is
known to see the database, else read here and scattered to it. Where the payloads are is
declared (``connect(..., storage=...)``), not guessed from host names: with ``storage='local'``
(the default) each worker is asked once whether it sees this database (its id, storage/identity.py)
at the client's path, and those that do not get their tiles from the client; with
``storage='shared'`` every worker must see it, and one that does not is an OperationalError
naming it and the path, before anything runs. A worker also checks the database's id before it
maps a payload, and every tile's checksum on its first read (storage/verify.py). The stored
outputs go to the run's sink (exec/contract.py): with ``storage='shared'`` each worker writes
its tiles into the new payload files itself and only their facts come back; else they are
gathered here. Every other key is released when the run ends, so nothing outlives the query on
a worker. One run is ``dask_run.Attempt``.

A worker that leaves mid-query (killed, lost) strands the tasks pinned to it. The executor notices
and pins them to the workers left, on the scheduler, while the run goes on: Dask recomputes only
what was lost (``dask_run.Attempt._relocate``). Where the scheduler cannot be told (or the lost
worker held tiles the client sent, or parts of output objects not uploaded yet), it keeps the
stored output tiles already finished on the workers left (written, or gathered), cancels the
rest and runs again on the workers alive then only what those tiles do not cover. Each loss uses
one of ``retries``; one more raises ``OperationalError``. Spec options: ``?retries=N`` (default 1), ``?scatter=auto|always|never``,
``?backend=numpy|cupy`` (CuPy tiles on dask-cuda workers), ``?timeout=S`` (seconds to wait for
workers). ``dask://local-cuda`` starts dask-cuda's LocalCUDACluster (one worker per GPU).
"""
from __future__ import annotations

import time
from urllib.parse import parse_qsl

from ..errors import Error, NotSupportedError, OperationalError
from ..physical.plan import TilePlan
from ..shares import Shares
from .contract import Capabilities, as_sink
from .dask_collect import install
from .dask_run import Attempt, WorkerLost
from .dask_worker import gpu_count, probe_database
from .runtime import RunResult

__all__ = ["DaskExecutor", "local_cluster", "static_capabilities"]

ADDRESSES_SECONDS = 1.0  # how long the scheduler's list of workers is taken as it is
STREAM_INTERVAL = 0.001  # the client's stream to the scheduler batches this long (Dask: 10 ms)
AGG_FAN_IN = 8  # partials one aggregation task combines; more become a tree on the same worker
# A Dask worker's memory limit bounds its whole process, tensordb's memory_limit only tiles: a
# local cluster's worker gets its share of the budget plus this much for the process itself.
PROCESS_ALLOWANCE = 512 << 20


def local_cluster(n_workers: int = 2, **kwargs):
    """A LocalCluster on 127.0.0.1: worker processes with one thread each; the scheduler's
    HTTP server (Dask's dashboard, where bokeh is installed) on a free port.

    >>> cluster = local_cluster(2)                       # doctest: +SKIP
    >>> con = tensordb.connect(executor=f"dask://{cluster.scheduler_address}")  # doctest: +SKIP
    """
    from distributed import LocalCluster
    # The scheduler's HTTP server (health, metrics, and the dashboard where bokeh is installed:
    # DaskExecutor.dashboard_link) takes any free port rather than 8787, so several clusters
    # can run side by side (tests, notebooks); the workers serve none.
    opts = dict(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
    opts.update(kwargs)
    return LocalCluster(**opts)


def static_capabilities(spec: str, workers: int, memory_limit=None) -> Capabilities:
    """What planning reads of ``spec`` without a cluster: a ``dask://local`` cluster is ours
    to make (``workers`` processes, each with its share of ``memory_limit``); another one is
    known only when asked (``DaskExecutor.capabilities``): these are the settings' guesses."""
    n = max(1, int(workers))
    return Capabilities(n, AGG_FAN_IN, Shares(memory_limit or None, n).worker)


def parse_spec(spec: str) -> tuple[str, dict]:
    """'dask://host:port?retries=0' -> ('host:port', {'retries': '0'})."""
    rest = spec.split("://", 1)[1] if "://" in spec else ""
    target, _, query = rest.partition("?")
    return target, dict(parse_qsl(query))


class DaskExecutor:
    """Runs tile plans on a Dask cluster; ``workers`` is the cluster's worker count."""

    name = "dask"
    max_fan_in = AGG_FAN_IN  # the plan's aggregations come as trees of at most this many partials
    other_processes_read_files = True  # workers map payload files themselves (storage/spares.py)

    def __init__(self, spec: str = "dask://local", workers: int = 2, *, memory_limit=None) -> None:
        from distributed import Client
        target, opts = parse_spec(spec)
        self.spec = spec
        self.memory_limit = memory_limit  # Dask workers enforce their own (--memory-limit)
        n = max(1, int(workers))
        # a cluster we make: each worker's limit is its share of the budget (docs/distributed.md)
        cluster_opts = {"memory_limit": Shares(memory_limit, n).worker + PROCESS_ALLOWANCE} \
            if memory_limit else {}
        self.retries = int(opts.get("retries", 1))
        self.scatter = opts.get("scatter", "auto")
        self.backend = opts.get("backend", "numpy")
        self.timeout = float(opts.get("timeout", 30))
        if self.scatter not in ("auto", "always", "never"):
            raise NotSupportedError(f"unknown scatter mode '{self.scatter}'",
                                    hint="scatter=auto, always or never")
        self._cluster = None
        self._sees: dict[tuple, set] = {}  # (root, database id) -> workers that see it
        self._addresses = None  # (when, the workers' addresses) as the scheduler last said
        self._info = None  # (when, the workers' facts) as the scheduler last gave them
        self._epoch = 0  # workers joined or left since the client connected, as it was told
        self.listening = False  # told when a worker joins or leaves (the caches stand till then)
        self._collectors: set[str] = set()  # workers that answer tdb_collect (dask_collect.py)
        try:
            if target in ("", "local"):
                self._cluster = local_cluster(n, **cluster_opts)
                target = self._cluster.scheduler_address
            elif target == "local-cuda":
                self._cluster = _local_cuda_cluster()
                self.backend = "cupy"
                target = self._cluster.scheduler_address
            self.client = Client(target if "://" in target else f"tcp://{target}",
                                 set_as_default=False, timeout=self.timeout)
            self.client.wait_for_workers(1, timeout=self.timeout)
            self._prepare_client()
            if self.backend == "cupy":
                _check_gpu_workers(self.client)
        except Error:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - connection failures come in many types
            self.close()
            raise OperationalError(f"cannot reach the Dask scheduler for '{spec}': {exc}",
                                   hint="start one with `dask scheduler` and `dask worker ADDRESS`,"
                                        " or use executor='dask://local'") from None
        self.last_run: dict = {}
        self.storage_shared = False  # the last run's store declared storage='shared'

    # -- the cluster ---------------------------------------------------------------------------
    def _prepare_client(self) -> None:
        """What saves a query its round trips to the scheduler: the client listens for workers
        joining and leaving (the scheduler's "all" events), so that the worker set and facts
        are asked for only when they changed; and the client's stream to the scheduler
        sends at once rather than batching for 10 ms (a query sends a few messages, and the
        graph of the next one would otherwise wait behind the releases of the last)."""
        client = self.client
        try:
            client.subscribe_topic("all", self._cluster_event)
            self.listening = True
        except Exception:  # noqa: BLE001 - an older scheduler: the caches expire by the clock
            self.listening = False
        comm = getattr(client, "scheduler_comm", None)
        if comm is not None and hasattr(comm, "interval"):
            comm.interval = STREAM_INTERVAL

    def _cluster_event(self, event) -> None:
        """On the client's event loop: a worker joined or left, so the caches are dropped."""
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(msg, dict) and msg.get("action") in ("add-worker", "remove-worker"):
            self._epoch += 1  # an answer asked for before this is not kept (below)
            self._addresses = self._info = None
            self._collectors.discard(msg.get("worker"))  # one back at that address: a new one

    def _fresh(self, cached) -> bool:
        """Whether a cache ``(when, value)`` stands: till a worker joins or leaves where the
        client listens, else for ``ADDRESSES_SECONDS``."""
        return cached is not None and (
            self.listening or time.monotonic() - cached[0] < ADDRESSES_SECONDS)

    def addresses(self, fresh: bool = False) -> list[str]:
        """The workers' addresses, sorted: plan worker w runs on addresses()[w % n]. The
        scheduler is asked once and again only after a worker joined or left (the client
        listens: ``_cluster_event``; else at most once per ``ADDRESSES_SECONDS``), unless
        ``fresh``; a query that notices a worker gone asks afresh. A scheduler that cannot
        be asked is an OperationalError naming it (and the client is given up, so that the
        connection makes a new one for its next statement)."""
        now, epoch = time.monotonic(), self._epoch
        cached = self._addresses
        if not fresh and self._fresh(cached):
            return list(cached[1])
        try:
            found = sorted(self.client.ncores())  # a light call: the address -> threads
        except Exception as exc:  # noqa: BLE001 - connection failures come in many types
            self.close()
            raise OperationalError(f"lost the Dask scheduler of '{self.spec}': "
                                   f"{type(exc).__name__}: {exc}",
                                   hint="restart the scheduler (the next statement connects "
                                        "again), or SET executor = 'local'") from None
        if epoch == self._epoch:  # else a worker joined or left meanwhile: ask again next time
            self._addresses = (now, found)
        return list(found)

    def collectors(self, addresses: list[str]) -> set[str]:
        """Those of ``addresses`` that hand a run's results straight to the client
        (dask_collect.py): the handler is installed on a worker the first time a run uses it,
        one round trip for the workers new to this client, none for the others."""
        new = [a for a in addresses if a not in self._collectors]
        if new:
            try:
                answers = self.client.run(install, workers=new, on_error="return")
            except Exception:  # noqa: BLE001 - their results come through the scheduler
                answers = {}
            self._collectors.update(a for a, ok in answers.items() if ok is True)
        return self._collectors.intersection(addresses)

    def probe(self, root: str, database: str, addresses: list[str]) -> dict[str, str | None]:
        """{address: None where that worker sees database ``database`` at ``root``, else why
        not}. A worker that sees it is asked once per database (it checks again before each
        file it maps); one that does not is asked again on the next query (a file system
        mounted since then counts)."""
        sees = self._sees.setdefault((root, database), set())
        ask = [a for a in addresses if a not in sees]
        answers = {}
        if ask:
            try:
                # each worker's own answer: one that left says so, the others still answer
                answers = self.client.run(probe_database, root, database, workers=ask,
                                          on_error="return")
                answers = {a: why if why is None or isinstance(why, str) else
                           f"Dask worker {a} did not answer: {type(why).__name__}: {why}"
                           for a, why in answers.items()}
            except Exception as exc:  # noqa: BLE001 - a worker that cannot answer does not see it
                answers = {a: f"Dask worker {a} did not answer: {type(exc).__name__}: {exc}"
                           for a in ask}
            sees.update(a for a in ask if a in answers and answers[a] is None)
        return {a: None if a in sees else answers.get(a, f"Dask worker {a} did not answer")
                for a in addresses}

    @property
    def alive(self) -> bool:
        """Whether the client still stands: a closed one is replaced by the connection."""
        return self.client is not None

    @property
    def workers(self) -> int:
        return max(1, len(self.addresses(fresh=True)))  # planning asks; the run reuses it

    def capabilities(self) -> Capabilities:
        """What planning reads of the cluster, as its workers report it: their count, the
        least memory one may fill with tiles (its own limit less what its process needs,
        within this connection's share of ``memory_limit``) and the fewest threads. The
        driver plans a worker per thread, each with its share (driver/engine.py)."""
        cached = self._info
        if self._fresh(cached):
            info = cached[1]
        else:
            now, epoch = time.monotonic(), self._epoch
            try:
                info = self.client.scheduler_info(n_workers=-1)["workers"]
            except TypeError:  # an older client: every worker is listed anyway
                info = self.client.scheduler_info()["workers"]
            except Exception:  # noqa: BLE001 - the scheduler gone: addresses() says so clearly
                self.addresses(fresh=True)
                raise
            info = {a: {"memory_limit": w.get("memory_limit"), "nthreads": w.get("nthreads")}
                    for a, w in info.items()}
            if epoch == self._epoch:
                self._info = (now, info)
        n = max(1, len(info))
        limits = [int(w.get("memory_limit") or 0) for w in info.values()]
        per = min(limits) - PROCESS_ALLOWANCE if limits and min(limits) > 0 else None
        if self.memory_limit:
            share = Shares(self.memory_limit, n).worker
            per = share if per is None else min(per, share)
        threads = min((int(w.get("nthreads") or 1) for w in info.values()), default=1)
        return Capabilities(n, AGG_FAN_IN, None if per is None or per <= 0 else per, threads,
                            workers_write=self.storage_shared)

    def resident(self, plan):
        """Not a question for a cluster: its workers read the storage for each query."""
        return None

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard of the cluster (``dask://local`` starts one on a free port)."""
        client = self.client
        try:
            return client.dashboard_link if client is not None else None
        except Exception:  # noqa: BLE001 - a scheduler without its HTTP server
            return None

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), self._cluster
        self.client, self._cluster = None, None
        if client is not None:
            if self.listening:  # else the scheduler sends this client's own leaving to it, closed
                try:
                    client.unsubscribe_topic("all")
                except Exception:  # noqa: BLE001 - a client already closed hears nothing
                    pass
            client.close()
        if cluster is not None:
            cluster.close()

    # -- running a plan ------------------------------------------------------------------------
    def run(self, plan: TilePlan, store=None, progress=None, destinations=None,
            finished=None, *, sink=None) -> RunResult:
        """Run ``plan``; its stored output tiles go to ``sink`` (exec/contract.py). With
        ``storage='shared'`` the workers write them into their places in the new payload
        files themselves and only their facts come back (``sink.slot``, ``sink.wrote``);
        otherwise they are gathered here and handed to ``sink.finished``."""
        if not plan.tasks:
            return RunResult({})
        sink = as_sink(sink, destinations, finished)
        self.storage_shared = store is not None and store.storage == "shared"
        # the workers write (and upload) their own outputs where the storage is theirs too:
        # declared shared, or an object store that takes parts (storage/objparts.py)
        objects = getattr(store, "objects", None)
        workers_write = sink is not None and self.scatter != "always" and (
            self.storage_shared or (objects is not None and objects.multipart))
        if sink is not None:
            sink.open(workers_write)
        # Each worker lost mid-run uses one of ``retries``: first by moving its tasks to the
        # workers left while the run goes on (Attempt._relocate); where that cannot be done,
        # by a new attempt that keeps the outputs already finished.
        attempts, done, losses = 0, {}, 0
        while True:
            attempts += 1
            attempt = None
            try:
                attempt = Attempt(self, plan, progress, store, sink, workers_write, done,
                                  relocations=self.retries - losses)
                result = attempt.go()
            except WorkerLost as lost:
                self._addresses = self._info = None  # the next attempt asks the scheduler
                losses += (len(attempt.relocated) if attempt is not None else 0) + 1
                # stored output tiles finished on the workers left: kept (sink.kept: those whose
                # bytes are stored, for an object written in parts)
                done = sink.kept(lost.done) if hasattr(sink, "kept") else lost.done
                if losses > self.retries:
                    raise OperationalError(
                        f"a Dask worker left while the query ran ({lost}); the query was tried "
                        f"{attempts} time(s), {losses} worker(s) lost, and nothing was stored",
                        hint="check the workers' logs (memory limits, crashes) and run it again") \
                        from None
                self._wait_for_any_worker()
                continue
            self.last_run["attempts"] = attempts
            self.last_run["workers_lost"] = losses + len(attempt.relocated)
            return result

    def _wait_for_any_worker(self) -> None:
        try:
            self.client.wait_for_workers(1, timeout=self.timeout)
        except Exception:  # noqa: BLE001 - a timeout is the only expected failure
            raise OperationalError(f"no Dask worker is left to run the query "
                                   f"(waited {self.timeout:.0f} s)") from None


def _local_cuda_cluster():
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise NotSupportedError("dask://local-cuda needs dask-cuda, which is not installed",
                                hint="pip install 'dask-cuda[cu12]' on a machine with NVIDIA GPUs")
    from .kernels import get_backend
    get_backend("cupy")  # a clear message when CuPy or a GPU is missing
    return LocalCUDACluster(host="127.0.0.1", dashboard_address=None)


def _check_gpu_workers(client) -> None:
    answers = client.run(gpu_count)
    bad = {a: m for a, m in answers.items() if isinstance(m, str)}
    if bad:
        addr, msg = sorted(bad.items())[0]
        raise NotSupportedError(f"backend=cupy needs a GPU on every Dask worker; {addr}: {msg}")


def make(spec: str, workers: int, *, memory_limit=None) -> DaskExecutor:
    """The registry's factory for ``dask://...`` (``workers`` sizes a ``dask://local`` cluster)."""
    return DaskExecutor(spec, workers, memory_limit=memory_limit)
