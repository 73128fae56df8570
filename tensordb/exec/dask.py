"""The Dask executor: a TilePlan submitted to a Dask distributed cluster as one graph.

    con = tensordb.connect(executor="dask://10.0.0.5:8786")    # an existing scheduler
    con = tensordb.connect(workers=2, executor="dask://local")  # a LocalCluster owned by us

Each Dask worker is one tensordb worker: plan worker ``w`` runs on ``addresses[w % n]`` (the
sorted worker addresses), pinned with ``allow_other_workers=False``. Dask does the scheduling and
moves tiles between workers; each task runs on the shared runtime (``runtime.py``: the task
interpreter, its error translation and the run's byte accounting), so results are the same.
A Dask task combines all its inputs at once, so the executor asks the plan for aggregation
trees of at most ``max_fan_in`` partials per task (``physical/trees.py``, made when planning).
Stored input tiles are read on their worker from the memory-mapped payload where the worker is
known to see the database, else read here and scattered to it. Where the payloads are is
declared (``connect(..., storage=...)``), not guessed from host names: with ``storage='local'``
(the default) each worker is asked once whether it sees this database (its id, storage/identity.py)
at the client's path, and those that do not get their tiles from the client; with
``storage='shared'`` every worker must see it, and one that does not is an OperationalError
naming it and the path, before anything runs. A worker also checks the database's id before it
maps a payload, and every tile's checksum on its first read (storage/verify.py). Only the stored
outputs are gathered; every other key is released when the run ends, so nothing outlives the
query on a worker.

A worker that leaves mid-query (killed, lost) strands the tasks pinned to it. The executor notices,
cancels the run and runs the plan again, once, on the workers alive then; a second loss raises
``OperationalError``. Spec options: ``?retries=N`` (default 1), ``?scatter=auto|always|never``,
``?backend=numpy|cupy`` (CuPy tiles on dask-cuda workers), ``?timeout=S`` (seconds to wait for
workers). ``dask://local-cuda`` starts dask-cuda's LocalCUDACluster (one worker per GPU).
"""
from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict
from urllib.parse import parse_qsl

import numpy as np

from ..errors import Error, NotSupportedError, OperationalError
from ..physical.plan import Kernel, Load, TilePlan
from .dask_worker import Payload, collect, forget, gpu_count, probe_database, run_task, to_host
from .runtime import Ledger, RunResult, op_of, planned_bytes, translate
from .tasks import run_load

__all__ = ["DaskExecutor", "local_cluster"]

AGG_FAN_IN = 8  # partials one aggregation task combines; more become a tree on the same worker
POLL_SECONDS = 0.25  # how often a running query checks that its workers are still alive
# A Dask worker's memory limit bounds its whole process, tensordb's memory_limit only tiles: a
# local cluster's worker gets its share of the budget plus this much for the process itself.
PROCESS_ALLOWANCE = 512 << 20


def local_cluster(n_workers: int = 2, **kwargs):
    """A LocalCluster on 127.0.0.1: worker processes with one thread each, no dashboard.

    >>> cluster = local_cluster(2)                       # doctest: +SKIP
    >>> con = tensordb.connect(executor=f"dask://{cluster.scheduler_address}")  # doctest: +SKIP
    """
    from distributed import LocalCluster
    # No dashboard; the scheduler's small HTTP server (health, metrics) takes any free port
    # rather than 8787, so several clusters can run side by side (tests, notebooks).
    opts = dict(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
    opts.update(kwargs)
    return LocalCluster(**opts)


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
        cluster_opts = {"memory_limit": memory_limit // n + PROCESS_ALLOWANCE} \
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

    # -- the cluster ---------------------------------------------------------------------------
    def addresses(self) -> list[str]:
        """The workers' addresses, sorted: plan worker w runs on addresses()[w % n]. A
        scheduler that cannot be asked is an OperationalError naming it (and the client is
        given up, so that the connection makes a new one for its next statement)."""
        try:
            return sorted(self.client.ncores())  # a light call: the scheduler's address -> threads
        except Exception as exc:  # noqa: BLE001 - connection failures come in many types
            self.close()
            raise OperationalError(f"lost the Dask scheduler of '{self.spec}': "
                                   f"{type(exc).__name__}: {exc}",
                                   hint="restart the scheduler (the next statement connects "
                                        "again), or SET executor = 'local'") from None

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
                answers = self.client.run(probe_database, root, database, workers=ask)
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
        return max(1, len(self.addresses()))

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), self._cluster
        self.client, self._cluster = None, None
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()

    # -- running a plan ------------------------------------------------------------------------
    def run(self, plan: TilePlan, store=None, progress=None, destinations=None,
            finished=None) -> RunResult:
        if not plan.tasks:
            return RunResult({})
        attempts = 0
        while True:
            attempts += 1
            try:
                result = _Attempt(self, plan, progress, store).go()
            except _WorkerLost as lost:
                if attempts > self.retries:
                    raise OperationalError(
                        f"a Dask worker left while the query ran ({lost}); the query was tried "
                        f"{attempts} time(s) and nothing was stored",
                        hint="check the workers' logs (memory limits, crashes) and run it again") \
                        from None
                self._wait_for_any_worker()
                continue
            self.last_run["attempts"] = attempts
            return result

    def _wait_for_any_worker(self) -> None:
        try:
            self.client.wait_for_workers(1, timeout=self.timeout)
        except Exception:  # noqa: BLE001 - a timeout is the only expected failure
            raise OperationalError(f"no Dask worker is left to run the query "
                                   f"(waited {self.timeout:.0f} s)") from None


class _WorkerLost(Exception):
    pass


class _Attempt:
    """One submission of the whole plan, on the workers alive when it starts."""

    def __init__(self, ex: DaskExecutor, plan: TilePlan, progress, store=None) -> None:
        self.ex, self.plan, self.progress, self.store = ex, plan, progress, store
        self.client = ex.client
        self.run_id = uuid.uuid4().hex[:12]
        self.addresses = ex.addresses()
        if not self.addresses:
            raise _WorkerLost("no workers")
        n = len(self.addresses)  # plan worker w runs on the w % n-th address (as the pool's queues)
        self.addr = {t.key: self.addresses[t.worker % n] for t in plan.tasks}

    def dkey(self, key: int, part: str = "") -> str:
        return f"tdb-{self.run_id}-{key}{part}"

    # -- the graph -----------------------------------------------------------------------------
    def go(self) -> RunResult:
        import dask
        t0 = time.perf_counter()
        scattered, scattered_bytes = self._scatter_loads()
        graph, where = self._graph(set(scattered))
        outs = [k for out in self.plan.outputs.values() if out.stored for k in out.tiles.values()]
        out_keys = [self._final_key(k) for k in outs]
        # Dask runs only what the keys asked for need: tasks no stored output reads (a result
        # the same group replaces) are asked for too, so that they run, and fail, as on the
        # local pool. Their values come back and are dropped.
        consumed = {k for t in self.plan.tasks for k in t.inputs} | set(outs)
        dead = [self.dkey(t.key) for t in self.plan.tasks
                if t.key not in consumed and self.dkey(t.key) in graph]
        futures: list = []
        try:
            with dask.annotate(workers=lambda k: [where[k]], allow_other_workers=False):
                futures = self.client.get(graph, out_keys + dead, sync=False)
            values = self._wait(futures)[:len(out_keys)]
        except _WorkerLost:
            self._release(futures, scattered, drop_records=True)
            raise
        except Exception as exc:  # noqa: BLE001 - translated below
            self._release(futures, scattered, drop_records=True)
            if type(exc).__name__ == "KilledWorker":  # Dask gave up on a task's workers
                raise _WorkerLost(str(exc)) from None
            raise _translate(exc) from exc
        tiles = {k: _host(v) for k, v in zip(outs, values)}
        self._release(futures, scattered, drop_records=False)
        del futures, values
        seconds = time.perf_counter() - t0
        return self._result(tiles, seconds, scattered_bytes)

    def _final_key(self, key: int) -> str:
        return self.dkey(key, "-host") if self.ex.backend == "cupy" else self.dkey(key)

    def _graph(self, scattered: set[int]):
        """One Dask task per plan task, on its worker; nothing is added or regrouped here."""
        from dask.task_spec import Task, TaskRef
        plan, run, backend = self.plan, self.run_id, self.ex.backend
        graph, where = {}, {}
        for t in plan.tasks:
            if isinstance(t, Load) and t.key in scattered:
                continue
            dk = self.dkey(t.key)
            source = _sub_reader(plan.readers[t.tensor], t.starts, t.stops) \
                if isinstance(t, Load) else None
            choice = plan.kernels[t.op] if isinstance(t, Kernel) else None
            graph[dk] = Task(dk, run_task, run, backend,
                             Payload(dk, t, op_of(plan, t), source, choice),
                             *[TaskRef(self.dkey(k)) for k in t.inputs])
            where[dk] = self.addr[t.key]
        if backend == "cupy":  # stored outputs come back to the client as NumPy
            for out in plan.outputs.values():
                if out.stored:
                    for k in out.tiles.values():
                        hk = self.dkey(k, "-host")
                        graph[hk] = Task(hk, to_host, TaskRef(self.dkey(k)))
                        where[hk] = self.addr[k]
        return graph, where

    def _scatter_loads(self) -> tuple[dict[int, object], int]:
        """Read here and scatter the Load tiles of workers that cannot read the payload files."""
        if not any(isinstance(t, Load) for t in self.plan.tasks):
            return {}, 0
        local = self._file_readers()
        by_addr: dict[str, dict] = defaultdict(dict)
        keys: dict[str, int] = {}
        nbytes = 0
        for t in self.plan.tasks:
            if isinstance(t, Load) and self.addr[t.key] not in local:
                tile = np.array(run_load(t, self.plan.readers[t.tensor]), order="C")  # 0-d stays 0-d
                by_addr[self.addr[t.key]][self.dkey(t.key)] = tile
                keys[self.dkey(t.key)] = t.key
                nbytes += tile.nbytes
        futures = {}
        for addr, data in by_addr.items():
            for dk, fut in self.client.scatter(data, workers=[addr], broadcast=False).items():
                futures[keys[dk]] = fut
        return futures, nbytes

    def _file_readers(self) -> set[str]:
        """The workers that read the payload files themselves: as declared (``storage``) and,
        for local storage, as each worker answered when asked whether it sees the database."""
        mode, store, everyone = self.ex.scatter, self.store, set(self.addresses)
        if mode in ("never", "always"):
            return everyone if mode == "never" else set()
        if store is None:  # a plan run without its database: the client reads every tile
            return set()
        if getattr(store, "objects", None) is not None:  # an object store: every worker reads
            return everyone  # it, checking the prefix's id before its first read (objreader.py)
        shared = store.storage == "shared"
        if store.database is None:  # an older database opened read-only: no id to ask about
            return everyone if shared else set()
        seen = self.ex.probe(str(store.root), store.database, self.addresses)
        if shared:
            bad = sorted(why for why in seen.values() if why is not None)
            if bad:
                more = f" (and {len(bad) - 1} more worker(s))" if len(bad) > 1 else ""
                raise OperationalError(
                    f"storage='shared' declares that every Dask worker sees the database at "
                    f"{store.root}, but {bad[0]}{more}; nothing was run",
                    hint="mount the database's directory at the same path on every worker, or "
                         "connect with storage='local' (the client then sends the tiles)")
            return everyone
        return {a for a, why in seen.items() if why is None}

    # -- waiting, with an eye on the workers ----------------------------------------------------
    def _wait(self, futures) -> list:
        """Gather the outputs (in a helper thread) while watching that the plan's workers stay."""
        box: dict = {}

        def gather():
            try:
                box["values"] = self.client.gather(futures)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc

        finished = [0]  # outputs gathered so far, for the progress reported while waiting
        if self.progress is not None:  # per-tile callbacks cost a loop wake-up each: CLI only
            count = itertools.count(1)

            def done(_) -> None:  # on Dask's thread: counted, reported by the loop below
                finished[0] = next(count)
            for f in futures:
                f.add_done_callback(done)
        thread = threading.Thread(target=gather, name="tensordb-dask-gather", daemon=True)
        thread.start()
        needed = set(self.addr.values())  # only workers that have tasks of this plan
        while thread.join(POLL_SECONDS) or thread.is_alive():
            if self.progress is not None:  # a few long tasks: the CLI's bar appears anyway
                self.progress(finished[0], len(futures))
            gone = needed - set(self.ex.addresses())
            if gone:
                self.client.cancel(futures, force=True)  # ends the gather
                thread.join()
                raise _WorkerLost(f"worker {', '.join(sorted(gone))} is gone")
        if "error" in box:
            raise box["error"]
        if self.progress is not None:  # done callbacks may still be on their way
            self.progress(len(futures), len(futures))
        return box["values"]

    def _release(self, futures, scattered, *, drop_records: bool) -> None:
        """Drop every key of this run from the cluster (and the workers' records on failure).
        After a run that succeeded the futures are only let go (the scheduler forgets keys
        nobody holds): cancelling finished keys, scattered ones among them, tripped an
        assertion in the scheduler, which then dropped the client."""
        try:
            if drop_records and (futures or scattered):
                self.client.cancel(list(futures) + list(scattered.values()), force=True)
            if drop_records:
                self.client.run(forget, self.run_id)
        except Exception:  # noqa: BLE001 - best effort: the keys die with their futures anyway
            pass

    # -- what happened --------------------------------------------------------------------------
    def _result(self, tiles, seconds, scattered_bytes) -> RunResult:
        plan = self.plan
        try:
            logs = self.client.run(collect, self.run_id)
        except Exception:  # noqa: BLE001 - a worker gone after the run costs measurements only
            logs = {}
        index = {a: i for i, a in enumerate(self.addresses)}
        ledger = Ledger(plan, len(self.addresses))
        ran_on = {}
        for addr, (records, held) in logs.items():
            ledger.peak += held  # Dask's own count of the bytes each worker held, at its most
            for key, dt, nb in records:
                task = plan.task(key)
                ledger.ran(task, index.get(addr, 0), dt)
                ledger.produced(task, 0, nb)  # Dask counts what its workers hold (above)
                ran_on[key] = addr
        # Bytes moved, from the plan: every input tile whose producer ran on another worker.
        for t in plan.tasks:
            for k in t.inputs:
                if self.addr[k] != self.addr[t.key]:
                    ledger.moved(t, planned_bytes(plan, plan.task(k)))
        self.ex.last_run = {"addresses": self.addresses,
                            "planned_on": dict(self.addr),
                            "ran_on": ran_on, "scattered_bytes": scattered_bytes}
        return ledger.result(tiles, seconds)


def _sub_reader(reader, starts, stops):
    """A reader holding only the tiles that overlap the box, so each Load task ships little."""
    try:
        from ..geometry import overlapping
        ranges = [overlapping(b, a, z) for b, a, z in zip(reader.meta.grid, starts, stops)]
        keep = [reader.entries[c] for c in itertools.product(*ranges) if c in reader.entries]
        return reader.with_entries(keep)
    except (AttributeError, TypeError):  # another reader type: ship it whole
        return reader


def _translate(exc: BaseException) -> BaseException:
    """A failed gather as a tensordb error. A task's own failure was translated on its worker
    (by the runtime, naming the operation); what is left is the cluster's."""
    if isinstance(exc, Error):
        return exc
    if isinstance(exc, (OSError, TimeoutError)) or type(exc).__name__ in (
            "CommClosedError", "FutureCancelledError", "CancelledError"):
        return OperationalError(f"the Dask cluster failed the query: {type(exc).__name__}: {exc}")
    return translate(exc)


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


def _host(value):
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def make(spec: str, workers: int, *, memory_limit=None) -> DaskExecutor:
    """The registry's factory for ``dask://...`` (``workers`` sizes a ``dask://local`` cluster)."""
    return DaskExecutor(spec, workers, memory_limit=memory_limit)
