"""The one harness for tests that run a child process: its anonymous memory sampled while it
works, and kill -9 at a chosen moment.

Memory: ``rss_anon(pid)`` is RssAnon of /proc/<pid>/status (heap and numpy buffers: what a
memory budget bounds; memory-mapped file pages are the page cache's), the figure
/work/shared/tools/peak-mem reports for one process. ``SampledChild`` runs a child that speaks
a small protocol on its pipes: it warms up, prints ``{"idle": rss_anon()}`` on a line, waits for
a ``go`` line on stdin (and reads whatever follows, to its end), does its work and prints its
answer last; the parent samples the child every ~2 ms from the go on, and ``grew`` is the peak
above the idle value. ``serve_sampled`` is the child's side of it.

kill -9: a child script arms a crash with ``die_before`` / ``die_after`` (the process sends
itself SIGKILL when a function of tensordb is called or has returned); the parent checks the
exit with ``assert_killed`` or kills from outside with ``kill9``. ``child_env`` makes a child
import this checkout (tensordb and tests). ``assert_payloads_referenced`` is the check every
reopen after a crash makes: the payload files are exactly those the catalog names.

Linux only (``HAS_PROC``: tests that sample skip elsewhere).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
HAS_PROC = Path("/proc/self/status").exists()


def child_env(**extra: str) -> dict:
    """The environment of a child that imports this checkout's tensordb and tests."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), **extra}


# -- anonymous memory -----------------------------------------------------------------------------

def rss_anon(pid: int | str = "self") -> int | None:
    """RssAnon of process ``pid`` in bytes; None when it is gone (or /proc has no such line)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) << 10
    except OSError:
        return None
    return None


def serve_sampled(con, errors: tuple = ()) -> None:
    """A ``SampledChild``'s side of the protocol, once it has warmed up ``con``: print the idle
    RssAnon, wait for the parent's go, run the script that follows it on stdin, and print what
    the run measured (``con.last_run``), then close ``con``. An error of a class in ``errors``
    is printed as ``{"error": class name, "message": ...}`` instead (``con`` is left open)."""
    idle = rss_anon()
    if idle is None:
        raise RuntimeError("no RssAnon in /proc/self/status")
    print(json.dumps({"idle": idle}), flush=True)
    go = sys.stdin.readline()  # the parent samples from now on
    script = sys.stdin.read()
    assert go.strip() == "go", go
    try:
        con.execute(script)
    except errors as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return
    r = con.last_run
    print(json.dumps({"result": {"spilled_bytes": r.spilled_bytes, "peak_bytes": r.peak_bytes,
                                 "over_budget": r.over_budget}}), flush=True)
    con.close()


class Sampler:
    """Samples ``rss_anon(pid)`` every ``interval`` seconds on a thread, keeping the peak;
    ``watch`` (if given) is called at each sample too (e.g. to see files appear)."""

    def __init__(self, pid: int, watch: Callable[[], None] | None = None,
                 interval: float = 0.002) -> None:
        self.pid, self.watch, self.interval = pid, watch, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_anon(self.pid)
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            if self.watch is not None:
                self.watch()
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        return self.peak


class SampledChild:
    """A child on the idle/go protocol (module docstring), sampled from the go on.

    ``SampledChild(argv, after_go="script")`` starts it, reads its idle line, starts sampling and
    sends ``go`` and ``after_go`` (stdin is closed then); ``finish()`` waits and returns the last
    line of its stdout as JSON (asserting a clean exit); ``kill()`` ends it with SIGKILL."""

    def __init__(self, argv: list[str], after_go: str = "", *, watch: Callable[[], None] | None = None,
                 env: dict | None = None, cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd or ROOT,
                                     env=env or child_env())
        try:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the child failed: {self.proc.stderr.read()}")
            self.idle = json.loads(line)["idle"]
            self.sampler = Sampler(self.proc.pid, watch).start()
            self.proc.stdin.write("go\n" + after_go)
            self.proc.stdin.close()
        except BaseException:
            self._reap()
            raise
        self.proc.stdin = None  # communicate() must not flush it

    @property
    def peak(self) -> int:
        return self.sampler.peak

    @property
    def grew(self) -> int:
        """The peak of anonymous memory above the idle value."""
        return self.sampler.peak - self.idle

    def finish(self, timeout: float = 300) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.sampler.stop()
            self._reap()
        self.out, self.err = out, err
        assert self.proc.returncode == 0, err
        lines = out.strip().splitlines()
        assert lines, f"the child printed nothing after its idle line: {err}"
        return json.loads(lines[-1])

    def kill(self) -> None:
        kill9(self.proc)
        self.sampler.stop()

    def _reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


# -- kill -9 --------------------------------------------------------------------------------------

def die(*args, **kwargs) -> None:
    """Send this process SIGKILL (what kill -9 from outside, or the OOM killer, does)."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_before(owner, name: str) -> None:
    """Replace ``owner.name`` (a function of a module or class): calling it kills the process."""
    setattr(owner, name, die)


def die_after(owner, name: str, when: Callable[[], bool] = lambda: True) -> None:
    """Wrap ``owner.name``: the process is killed once a call has returned and ``when()`` holds."""
    orig = getattr(owner, name)

    def wrapped(*args, **kwargs):
        out = orig(*args, **kwargs)
        if when():
            die()
        return out
    setattr(owner, name, wrapped)


def nth_call(n: int) -> Callable[[], bool]:
    """A ``when`` for ``die_after``: true on the n-th call (from 1)."""
    count = [0]

    def nth() -> bool:
        count[0] += 1
        return count[0] == n
    return nth


def run_script(script: str, *args, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    """Run ``python -c script args...`` with this checkout importable; stdout and stderr caught."""
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          timeout=timeout, env=child_env(), **popen)


def start_script(script: str, *args, **popen) -> subprocess.Popen:
    """``run_script`` without waiting: stdout and stderr are pipes."""
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), **popen)


def assert_killed(returncode: int, stderr: bytes | str = b"") -> None:
    """The child ended by SIGKILL (not by an exception or a clean exit)."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    assert returncode == -signal.SIGKILL, f"exit {returncode}, not SIGKILL: {stderr}"


def kill9(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Kill ``proc`` from outside with SIGKILL and reap it."""
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=timeout)
    assert_killed(proc.returncode)


def assert_payloads_referenced(con) -> None:
    """The payload files in the database are exactly those the catalog's tiles name (a reopen
    after a crash removed the orphans)."""
    referenced = {r[0] for r in con.store.duck.execute(
        "SELECT DISTINCT file FROM tensordb.tiles").fetchall()}
    assert set(os.listdir(con.store.tiles_dir)) == referenced


def tile_products(a, b, tile: int):
    """The block-sparse oracle: each present (not all-zero) ``tile`` x ``tile`` tile of ``a``
    times its rows of ``b`` by numpy's matmul, summed into its row tile (the pool's tile
    products one by one, as the pre-cut, tail-cut and serving tests compare bytes with)."""
    import numpy as np
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    for i in range(0, a.shape[0], tile):
        for j in range(0, a.shape[1], tile):
            if a[i:i + tile, j:j + tile].any():
                c[i:i + tile] += a[i:i + tile, j:j + tile] @ b[j:j + tile]
    return c
