"""Connection settings (``SET name = value``) and the TENSORDB_DEBUG stage timer."""
from __future__ import annotations

import gc
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field, fields

from .errors import ProgrammingError

__all__ = ["Settings", "parse_bytes", "format_bytes", "available_memory", "physical_memory",
           "default_memory_limit", "MEMORY_FRACTION", "max_workers", "debug_level", "stage",
           "gc_paused"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value) -> int | None:
    """``'2GB'`` -> 2000000000; ``'512MiB'``, ints and None or ``'none'`` (no limit) are accepted
    too. An empty text is refused: it is more likely a mistake than a wish for no limit."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        return None
    if isinstance(value, str) and not value.strip():
        raise ProgrammingError("memory size is empty",
                               hint="write it like '512MB', '2GB' or '1GiB'; 'none' means no limit")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value != value or value in (float("inf"), float("-inf")):
            raise ProgrammingError(f"memory size must be a finite number of bytes, got {value}")
        if value <= 0:
            raise ProgrammingError(f"memory size must be positive, got {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ProgrammingError(f"cannot read {value!r} as a memory size",
                               hint="write it like '512MB', '2GB' or '1GiB'")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ProgrammingError(f"memory size must be positive, got {value!r}")
    return n


def format_bytes(n: float | None) -> str:
    if n is None:
        return "none"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def available_memory() -> int | None:
    """Bytes of memory the system can give this process now (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


MEMORY_FRACTION = 0.8   # the default memory_limit's share of the machine's memory (DuckDB's)

# Where a container's memory limit is read (cgroup v2, then v1); a file may be absent or "max".
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory() -> int | None:
    """Bytes of memory this process may use: the machine's physical memory, or its container's
    (cgroup) limit when that is smaller; None when neither can be read."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            sizes.append(int(text))
    return min(sizes) if sizes else None


def default_memory_limit() -> int | None:
    """``MEMORY_FRACTION`` of ``physical_memory()``: the memory_limit of a new connection (and of
    ``SET memory_limit = DEFAULT``)."""
    total = physical_memory()
    return None if total is None else max(1, int(total * MEMORY_FRACTION))


def max_workers() -> int:
    """The most workers ``SET workers`` accepts: far more threads than cores only adds
    scheduling, and the optimizer's search grows with the worker count (a bound keeps planning
    quick for every accepted value)."""
    return max(256, 4 * _default_workers())


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Settings:
    """What ``SET`` changes. ``workers``: kernel workers; ``memory_limit``: bytes for all workers
    together (default: ``MEMORY_FRACTION`` of the machine's memory; None: no limit);
    ``executor``: 'local' or 'dask://host:port'; ``tiling``: the registered tiling strategy;
    ``progress``: show progress for long queries in the CLI; ``quiet``: the CLI prints only what
    queries return (rows, EXPLAIN, a tensor printed by name), not the results of assignments nor
    status messages (psql's ``-q``); ``blas_one_call``: let the optimizer
    offer, on the local pool, one BLAS call per operation on every core against split pieces
    (optimizer/threads.py; off by default: on a quiet 2-core machine it measured no faster and
    up to 3x slower for batched products, docs/benchmarks.md); ``pin_workers``: keep each of
    the local pool's worker threads on a core of its own when there are cores enough (exec/pool.py;
    on by default: unpinned, threads woken after a pause shared the caller's core; off lets the
    scheduler move them, for a machine whose cores other work keeps busy).

    ``set(name, 'DEFAULT')`` returns a setting to its default, except ``tiling``, where
    ``default`` names a strategy (an empty value is the default strategy there)."""

    workers: int = 0
    memory_limit: int | None = field(default_factory=default_memory_limit)
    executor: str = "local"
    tiling: str = ""
    progress: bool = True
    quiet: bool = False
    blas_one_call: bool = False
    pin_workers: bool = True

    def __post_init__(self) -> None:
        if not self.workers:
            self.workers = _default_workers()

    @staticmethod
    def is_default(name: str, value) -> bool:
        """True when ``value`` asks for ``name``'s default (``SET name = DEFAULT``)."""
        return name.lower() != "tiling" and isinstance(value, str) and \
            value.strip().lower() == "default"

    def set(self, name: str, value) -> None:
        key = name.lower()
        if key not in {f.name for f in fields(self)}:
            raise ProgrammingError(f"unknown setting '{name}'",
                                   hint=f"settings: {', '.join(f.name for f in fields(self))}")
        if self.is_default(key, value):
            setattr(self, key, getattr(Settings(), key))
            return
        if key == "workers":
            top = max_workers()
            if isinstance(value, float) and value == value and not value.is_integer():
                raise ProgrammingError(f"workers must be an integer from 1 to {top}, got {value!r}")
            try:
                value = int(value)
            except (TypeError, ValueError, OverflowError):
                raise ProgrammingError(f"workers must be an integer from 1 to {top}, "
                                       f"got {value!r}") from None
            if not 1 <= value <= top:
                raise ProgrammingError(f"workers must be an integer from 1 to {top}, got {value!r}",
                                       hint=f"this machine has {_default_workers()} core(s); a "
                                       "worker is a thread, and the optimizer plans for each one")
        elif key == "memory_limit":
            value = parse_bytes(value)
        elif key in ("progress", "quiet", "blas_one_call", "pin_workers"):
            text = str(value).strip().lower()
            if text not in ("1", "true", "on", "yes", "0", "false", "off", "no"):
                raise ProgrammingError(f"{key} must be on or off, got {value!r}")
            value = text in ("1", "true", "on", "yes")
        else:
            value = str(value)
        setattr(self, key, value)

    def items(self) -> list[tuple[str, object]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


# os.environ's own mapping (bytes keys on POSIX), read directly: ``os.environ.get`` encodes
# the key and decodes the value (2 us), and a call asks at each of its stages
_ENV = getattr(os.environ, "_data", None)
_DEBUG_KEY = os.environ.encodekey("TENSORDB_DEBUG") if hasattr(os.environ, "encodekey") \
    else None
_LEVELS: dict = {}  # the raw value -> its level


def debug_level() -> int:
    raw = _ENV.get(_DEBUG_KEY) if _DEBUG_KEY is not None and _ENV is not None else \
        os.environ.get("TENSORDB_DEBUG")
    if not raw:
        return 0
    level = _LEVELS.get(raw)
    if level is None:
        text = raw.decode() if isinstance(raw, bytes) else raw
        try:
            level = int(text or 0)
        except ValueError:
            level = 0
        _LEVELS[raw] = level
    return level


class stage:
    """Time a pipeline stage; printed to stderr when TENSORDB_DEBUG >= 1 (a class, not a
    generator: a call passes through several stages)."""

    __slots__ = ("name", "t0")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if debug_level() >= 1:
            print(f"[tensordb] {self.name:<10} {1e3 * (time.perf_counter() - self.t0):9.2f} ms",
                  file=sys.stderr)


_gc_lock = threading.Lock()
_gc_depth = 0          # gc_paused blocks open, in any thread
_gc_resume = False     # whether the outermost one found the collector enabled


class gc_paused:
    """Python's cyclic garbage collector held off for a burst of allocations that stay alive:
    parsing, binding, planning and rendering a statement group. Its collections would scan the
    objects being built again and again (each generation-2 one all of them): a quarter of the
    CPU time of a 1,000-operation EXPLAIN (docs/benchmarks.md). What reference counting frees
    is freed as usual; garbage in cycles waits for the next collection after the block. Blocks
    nest, in any thread; the collector is enabled again when the last one ends, and only if
    the first found it enabled."""
    __slots__ = ()

    def __enter__(self) -> None:
        global _gc_depth, _gc_resume
        with _gc_lock:
            if _gc_depth == 0:
                _gc_resume = gc.isenabled()
                gc.disable()
            _gc_depth += 1

    def __exit__(self, *exc) -> None:
        global _gc_depth
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_resume:
                gc.enable()
