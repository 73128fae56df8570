"""A Dask deployment started by hand, as users start one: ``dask scheduler`` and ``dask worker``
as separate processes on 127.0.0.1 (tests/exec/test_dask_deploy.py, tests/bench/bench_distributed.py).

A worker may run in a mount namespace of its own (``unshare``, root only) that sees the
database's directory only through the declared location: ``hide`` is a directory hidden under
an empty tmpfs, ``show`` a directory of the real file system bind-mounted back at the same path
inside it (the shared storage, mounted where the client sees it)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASK = str(Path(sys.executable).parent / "dask")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "TENSORDB_DEBUG": "", "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}


def can_unshare() -> bool:
    """Whether this process may make a mount namespace (root, with unshare(1) installed)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                          capture_output=True).returncode == 0


class Deployment:
    """A scheduler and workers, each a process of its own; ``close`` ends those it started."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}  # name -> its process
        sfile = self.workdir / "scheduler.json"
        self._start([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(sfile)], "scheduler")
        deadline = time.time() + 60
        while not sfile.exists() or not sfile.read_text().strip():
            if time.time() > deadline or self.procs[0].poll() is not None:
                self.close()
                raise RuntimeError(f"dask scheduler did not start: {self._log('scheduler')}")
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole once the scheduler listens
        self.address = json.loads(sfile.read_text())["address"]

    def _start(self, cmd: list[str], name: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(),
                             cwd=self.workdir, start_new_session=True)
        self.procs.append(p)
        return p

    def _log(self, name: str) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def worker(self, name: str, *, hide: Path | None = None, show: Path | None = None,
               setup: str = "", memory_limit: str = "2GB") -> None:
        """Start worker ``name`` (one thread, no nanny: a SIGKILL ends it for good). With
        ``hide``, in a mount namespace of its own where ``hide`` is an empty tmpfs, then
        ``show`` (under ``hide``) bind-mounted back from the real file system, then the shell
        commands ``setup`` run there."""
        cmd = [DASK, "worker", self.address, "--name", name, "--nthreads", "1", "--no-nanny",
               "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", memory_limit,
               "--local-directory", str(self.workdir / f"w-{name}")]
        if hide is not None:
            stage = self.workdir / f"stage-{name}"
            stage.mkdir(exist_ok=True)
            steps = []
            if show is not None:
                steps.append(f"mount --bind {shlex.quote(str(show))} {shlex.quote(str(stage))}")
            steps.append(f"mount -t tmpfs tmpfs {shlex.quote(str(hide))}")
            if show is not None:
                steps += [f"mkdir -p {shlex.quote(str(show))}",
                          f"mount --bind {shlex.quote(str(stage))} {shlex.quote(str(show))}",
                          f"umount {shlex.quote(str(stage))}"]
            if setup:
                steps.append(setup)
            script = " && ".join(steps) + ' && exec "$@"'
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                   "sh"] + cmd
        self.workers[name] = self._start(cmd, f"worker-{name}")

    def wait(self, n: int, timeout: float = 90) -> list[str]:
        """Wait until ``n`` workers are connected; their addresses, sorted."""
        from distributed import Client
        deadline = time.time() + timeout
        with Client(self.address, timeout=timeout) as c:
            while len(c.scheduler_info(n_workers=-1)["workers"]) < n:
                dead = [w for w, p in self.workers.items() if p.poll() is not None]
                if dead or time.time() > deadline:  # the logs say why
                    logs = "\n".join(self._log(f"worker-{w}") for w in self.workers)
                    raise RuntimeError(f"{n} workers did not connect (ended: {dead})\n{logs}")
                time.sleep(0.1)
            return sorted(c.scheduler_info(n_workers=-1)["workers"])

    def address_of(self, name: str) -> str:
        from distributed import Client
        with Client(self.address, timeout=30) as c:
            info = c.scheduler_info(n_workers=-1)["workers"]
        return next(a for a, w in info.items() if w.get("name") == name)

    def kill(self, name: str) -> None:
        """SIGKILL worker ``name`` (its process: no nanny restarts it)."""
        p = self.workers[name]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)

    def close(self) -> None:
        """Workers first (SIGKILL: a test's workers hold nothing to keep, and one told to stop
        while its scheduler stops too waits for it for seconds), then the scheduler."""
        for p in reversed(self.procs):  # the scheduler is the first started
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL if p is not self.procs[0] else
                              signal.SIGTERM)  # its own session: it and its children
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=20)
        self.procs.clear()

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
