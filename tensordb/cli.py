"""The command line: ``tensordb [DB] [-c SQL]... [-f FILE]...``, and a REPL without -c/-f.

Scripts and commands run in the order given; each is one unit (nothing is stored if a statement in
it fails), and the first failure ends the run with exit status 1 and a message naming the
statement (file:line) with a caret line. Errors never print a traceback unless TENSORDB_DEBUG is set.
The REPL, its dot commands and reading script files are in cli_repl.py (a mixin ``Shell`` inherits).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import threading
import time
import traceback
import warnings
from contextlib import nullcontext

from . import __version__
from .errors import Error, Span, Warning
from .result import Result, format_cell
from .cli_repl import HELP, Repl, _isatty, read_script, run_file  # noqa: F401 (HELP, read_script: cli's names)
from .terminal import Abandon

__all__ = ["main", "Shell"]

PROGRESS_DELAY = 0.5   # seconds before a progress bar appears: quick work prints nothing extra
                       # (TENSORDB_PROGRESS_DELAY overrides it)
MAX_ROWS = 40          # rows printed; the middle of longer results is elided
MAX_PRINTED_ELEMENTS = 1_000_000  # larger tensors are described, not read


class _Progress:
    """A rich progress bar that appears only when a statement runs longer than a moment."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.started = 0.0
        self.bar = None
        self.task = None
        self.done = 0.0

    def reset(self) -> None:
        with self.lock:
            self.started = time.perf_counter()
            self._stop()

    def __call__(self, done: int, total: int) -> None:
        with self.lock:
            if self.bar is None:
                if time.perf_counter() - self.started < _progress_delay() or not _isatty(self.stream):
                    return
                from rich.console import Console
                from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn,
                                           TimeElapsedColumn)
                # A share of the work, not "4/6" tasks: a plan's last tasks may be its long
                # kernels, whose progress comes as fractions of a task (kernels.py).
                self.bar = Progress(TextColumn("running"), BarColumn(), TaskProgressColumn(),
                                    TimeElapsedColumn(), console=Console(file=self.stream),
                                    transient=True)
                self.bar.start()
                self.task = self.bar.add_task("tasks", total=total)
                self.done = 0.0
            # workers report their fractions as they go: shown, the work never goes backwards
            self.done = max(self.done, min(done, total))
            self.bar.update(self.task, completed=self.done, total=total)

    def stop(self) -> None:
        with self.lock:
            self._stop()

    def _stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _progress_delay() -> float:
    try:
        return float(os.environ.get("TENSORDB_PROGRESS_DELAY", PROGRESS_DELAY))
    except ValueError:
        return PROGRESS_DELAY



class Shell(Repl):
    """Runs text against a connection and prints results (rich tables, numpy-style tensors)."""

    def __init__(self, con, out=None, err=None, where: str | None = None) -> None:
        self.con = con
        self.where = where
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.timer = False
        self.failed = False  # a statement, script or command failed (a piped REPL then exits 1)
        self.abandon: Abandon | None = None  # a second Ctrl-C's way out (main() sets it up)
        self._matches: list[str] = []
        self.progress = _Progress(self.err)
        con.progress_callback = self._on_progress

    def _on_progress(self, done: int, total: int) -> None:
        if getattr(self.con.settings, "progress", True):
            self.progress(done, total)

    # -- running -------------------------------------------------------------------------------
    def run_text(self, text: str, source: str, first_line: int = 1) -> bool:
        """Run every statement of ``text``; False (and a message on stderr) if one failed or
        was interrupted (only a failure counts for a piped REPL's exit status: Ctrl-C is the
        user's choice). ``first_line``: the line of ``source`` that ``text`` starts on."""
        self.progress.reset()
        shown, kept, boundary = 0, 0, None

        def show(result) -> None:
            nonlocal shown, kept, boundary
            shown += 1
            if result.commits:  # what ran before a BEGIN or COMMIT is stored once it shows
                boundary = result.message if shown > 1 else boundary
                kept = shown
            self.show(result)

        try:
            with self.abandon.statement() if self.abandon is not None else nullcontext(), \
                    warnings.catch_warnings():
                warnings.simplefilter("always", Warning)
                warnings.showwarning = self._show_warning
                self.con.execute_script(text, on_result=show)
            return True
        except Error as exc:
            self.failed = True
            self.progress.stop()
            self.print_error(exc, text, source, first_line)
            self._say_what_was_kept(source, shown - kept, boundary)
            return False
        except KeyboardInterrupt:
            self.progress.stop()
            print("interrupted", file=self.err)
            self._say_what_was_kept(source, shown - kept, boundary)
            return False
        except BrokenPipeError:  # `tensordb ... | head`: the reader left
            raise
        except Exception as exc:  # a bug: one line, unless debugging
            self.failed = True
            self.progress.stop()
            if os.environ.get("TENSORDB_DEBUG"):
                traceback.print_exc(file=self.err)
            print(f"internal error: {type(exc).__name__}: {exc}", file=self.err)
            self._say_what_was_kept(source, shown - kept, boundary)
            return False

    def _show_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """tensordb's warnings as ``warning: ...`` lines on stderr (with their caret); any
        other as Python shows it."""
        if issubclass(category, Warning):
            print(f"warning: {message}", file=self.err)
        else:
            print(warnings.formatwarning(message, category, filename, lineno, line),
                  file=self.err, end="")

    def _say_what_was_kept(self, source: str, undone: int, boundary: str | None) -> None:
        """After a failure: results were printed as statements ran, but the failed unit is undone
        as a whole. A BEGIN or COMMIT inside the text ended a unit, which stays stored."""
        if not undone:  # nothing printed was undone: nothing to correct
            return
        if boundary is None:
            print(f"nothing of {source} was stored: the statements before the error were "
                  "rolled back too", file=self.err)
        else:
            print(f"{source}: the statements after its last {boundary} were rolled back; those "
                  "before it were stored", file=self.err)

    def print_error(self, exc: Error, text: str, source: str, first_line: int = 1) -> None:
        where = source
        if exc.statement == text and exc.span is not None:
            where = f"{source}:{text.count(chr(10), 0, exc.span.start) + first_line}"
            if first_line > 1:  # the caret's LINE counts the source's lines too
                pad = "\n" * (first_line - 1)
                exc = copy.copy(exc)
                exc.statement = pad + text
                exc.span = Span(exc.span.start + len(pad), exc.span.end + len(pad))
        if os.environ.get("TENSORDB_DEBUG") and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__, file=self.err)
        print(f"{where}: {type(exc).__name__}: {exc}", file=self.err)

    # -- printing ------------------------------------------------------------------------------
    @property
    def quiet(self) -> bool:
        """``SET quiet = on`` (``-q``, ``.quiet on``): print only what queries return."""
        return bool(getattr(self.con.settings, "quiet", False))

    def show(self, result: Result) -> None:
        self.progress.stop()
        if self.quiet and not _asked_for(result):
            self.progress.reset()
            return
        if result.kind == "rows":
            self._table(result)
        elif result.kind == "tensor":
            self._tensor(result)
        elif result.kind == "explain":
            self._print(result.text or "")
        else:
            self._print(result.message or "OK", style="dim")
        if self.timer and result.elapsed is not None:
            self._print(f"Run Time: {result.elapsed:.3f} s", style="dim")
        if result.kind != "status":
            print(file=self.out)  # a blank line between larger outputs
        self.progress.reset()

    def _console(self):
        from rich.console import Console
        return Console(file=self.out, highlight=False, soft_wrap=True,
                       width=None if _isatty(self.out) else 120)

    def _print(self, text: str, style: str | None = None) -> None:
        self._console().print(text, style=style, markup=False)

    def _table(self, result: Result) -> None:
        from rich import box
        from rich.table import Table
        rows = result.fetchall()
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for c in result.columns:
            table.add_column(str(c), overflow="fold")
        shown = rows if len(rows) <= MAX_ROWS else rows[:MAX_ROWS // 2] + [None] + rows[-MAX_ROWS // 2:]
        for r in shown:
            table.add_row(*(["…"] * len(result.columns) if r is None else [format_cell(v) for v in r]))
        console = self._console()
        console.print(table)
        console.print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", style="dim",
                      markup=False)

    def _tensor(self, result: Result) -> None:
        head = f"{result.name}: {result.dtype} {result.shape}"
        self._print(head + "\n" + result.preview(MAX_PRINTED_ELEMENTS))


def _asked_for(result: Result) -> bool:
    """What a quiet shell still prints: rows (SELECT, SHOW, DESCRIBE), EXPLAIN and a tensor
    printed by its name; not a status (CREATE, SET, LET, INSERT counts) nor an assignment's
    result, as psql -q prints no command tags."""
    if result.kind == "tensor":
        said = result.statement.strip().rstrip(";").strip()
        return said.lower() == (result.name or "").lower()
    return result.kind != "status"





class _Ordered(argparse.Action):
    """Keep -c and -f in the order given."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest) or [])
        items.append((option_string, values))
        setattr(namespace, self.dest, items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tensordb", description="tensordb: einsum queries over tiled tensors, in SQL.",
        epilog="Without -c or -f, an interactive shell. Example: tensordb demo.tdb -f sql/quickstart.sql")
    parser.add_argument("db", nargs="?", help="database directory (default: a database in memory)")
    parser.add_argument("-c", dest="actions", action=_Ordered, metavar="SQL",
                        help="run SQL (may be repeated)")
    parser.add_argument("-f", dest="actions", action=_Ordered, metavar="FILE",
                        help="run a script file (may be repeated)")
    parser.add_argument("--timer", action="store_true", help="print the time of each statement")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only what queries return (rows, EXPLAIN, a tensor named "
                             "alone), not the results of assignments nor messages (SET quiet)")
    parser.add_argument("--read-only", "-readonly", dest="read_only", action="store_true",
                        help="open the database read-only (DuckDB's -readonly too); a "
                             "database another process writes is read as of its newest commit")
    parser.add_argument("--version", action="version", version=f"tensordb {__version__}")
    args = parser.parse_args(argv)

    import tensordb
    if args.db == "":
        print("tensordb: the database path is empty (leave it out for an in-memory database)",
              file=sys.stderr)
        return 1
    try:
        con = tensordb.connect(args.db, read_only=args.read_only)
    except Error as exc:
        print(f"tensordb: cannot open {args.db or 'an in-memory database'}: {exc}", file=sys.stderr)
        return 1
    abandon = Abandon(sys.stderr, in_memory=not args.db).start()
    try:
        shell = Shell(con, where=args.db)
        shell.abandon = abandon
        shell.timer = args.timer
        if args.quiet:
            con.set("quiet", True)
        if not args.actions:
            shell.repl()
            # Piped input is a script: like sqlite3, its exit status says whether anything
            # failed (or a BEGIN was left open). At a terminal the user saw each error.
            return 0 if _isatty(sys.stdin) or not shell.failed else 1
        for n, (option, value) in enumerate(args.actions, 1):
            ok = run_file(shell, value) if option == "-f" else \
                shell.run_text(value, f"-c #{n}" if len(args.actions) > 1 else "-c")
            if not ok:
                return 1
        return 0 if shell.check_open_block() else 1
    except BrokenPipeError:
        # stdout was closed early; point it at /dev/null so the interpreter's final flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        abandon.stop()
        con.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
