"""The ``if __name__ == "__main__":`` guard that a local Dask cluster needs.

``dask://local`` starts worker processes with multiprocessing's *spawn*: each new process runs
the ``__main__`` script again from the top. A script that connects without the guard would start
a cluster in every worker, each failing with a page of tracebacks. Before any process starts,
this module finds the line of the ``__main__`` script that is running (the connect, or whatever
led to it) and refuses, in one short error, when that line is not under the guard.

Nothing is checked when spawn does not re-run ``__main__``: it has no file (the REPL, ``python
-c``, Jupyter) or is a package's ``__main__`` (``python -m tensordb``). Nor when Dask forks its
workers, or when the script's source cannot be read.
"""
from __future__ import annotations

import ast
import multiprocessing
import sys
from importlib import import_module

from ..errors import InterfaceError, ProgrammingError

__all__ = ["check_main_guard", "check_packages", "starts_local_processes"]

# The packages an executor imports when it starts, and the extra that installs them.
PACKAGES = {"dask": (("dask", "distributed"), "distributed")}


def check_packages(spec: str) -> None:
    """Raise InterfaceError naming the extra to install when executor ``spec`` needs packages
    that cannot be imported: at connect (or SET executor), not at the first query."""
    scheme = spec.split("://", 1)[0].lower() if "://" in spec else spec.lower()
    modules, extra = PACKAGES.get(scheme, ((), ""))
    for module in modules:
        try:
            import_module(module)
        except ImportError as exc:
            raise InterfaceError(
                f"executor '{spec}' needs the packages {' and '.join(modules)}, and {module} "
                f"cannot be imported ({exc})",
                hint=f"pip install 'tensordb[{extra}]' (docs/distributed.md)") from None

GUARD = 'if __name__ == "__main__":'


def starts_local_processes(spec: str) -> bool:
    """Whether executor ``spec`` starts worker processes on this machine (dask://local...)."""
    if not spec.lower().startswith("dask://"):
        return False
    target = spec.split("://", 1)[1].partition("?")[0]
    return target in ("", "local", "local-cuda")


def check_main_guard(spec: str) -> None:
    """Raise ProgrammingError when starting ``spec``'s worker processes would re-run unguarded
    script code (see the module docstring); return quietly otherwise. First, the executor's
    packages are checked (``check_packages``): both are known before anything starts."""
    check_packages(spec)
    if not starts_local_processes(spec):
        return
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # A worker process re-running the script: the parent's check could not read it.
        raise _guard_error(spec, getattr(sys.modules.get("__main__"), "__file__", "the script"))
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or _start_method() == "fork" or not _rerun_by_spawn(main):
        return
    line = _main_line(main)
    if line is None or _guarded(path, line) is not False:
        return
    raise _guard_error(spec, path)


def _guard_error(spec: str, path: str) -> ProgrammingError:
    return ProgrammingError(
        f"executor '{spec}' starts worker processes, and each one runs {path} again from the "
        f"top: put the script's code under {GUARD}",
        hint=f"{GUARD}\n    con = tensordb.connect(..., executor=\"{spec}\")\n    ...\n"
             "(Python's rule for multiprocessing with spawn; docs/distributed.md)")


def _rerun_by_spawn(main) -> bool:
    """multiprocessing's rule: a package's ``__main__`` (``python -m tensordb``) is not run again
    in the new process; a script, or a module run with ``-m``, is."""
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return not (name is not None and (name == "__main__" or name.endswith(".__main__")))


def _start_method() -> str:
    try:
        import dask.config
    except ImportError:  # no Dask: its executor fails on its own, with its own message
        return "fork"
    return str(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))


def _main_line(main) -> int | None:
    """The line of the ``__main__`` module's top-level code running now, if it is running."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            return frame.f_lineno
        frame = frame.f_back
    return None


def _guarded(path: str, line: int) -> bool | None:
    """Whether ``line`` of ``path`` lies under an ``if __name__ == "__main__":`` (None: cannot
    tell)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
                return True
    return False


def _is_main_test(test) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1
