"""The command line: ``tensordb [DB] [-c SQL]... [-f FILE]...``, and a REPL without -c/-f.

Scripts and commands run in the order given; each is one unit (nothing is stored if a statement in
it fails), and the first failure ends the run with exit status 1 and a message naming the
statement (file:line) with a caret line. Errors never print a traceback unless TENSORDB_DEBUG is set.
"""
from __future__ import annotations

import argparse
import codecs
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
from .terminal import Abandon, as_command, history, is_utf8, read_piped, remember

__all__ = ["main", "Shell"]

PROGRESS_DELAY = 0.5   # seconds before a progress bar appears: quick work prints nothing extra
                       # (TENSORDB_PROGRESS_DELAY overrides it)
MAX_ROWS = 40          # rows printed; the middle of longer results is elided
MAX_PRINTED_ELEMENTS = 1_000_000  # larger tensors are described, not read

HELP = """\
Statements end with ';' and may span lines.
Statements:
  C[i,k] = A[i,j] * B[j,k];                      an einsum assignment (SUM, MAX, MIN, PROD aggregate)
  C = EINSUM('ij,jk->ik', A, B);                 numpy's einsum
  dW = GRAD(L, W);                               the gradient of scalar L (same group) by W
  CREATE [OR REPLACE] TENSOR Q[i] AS expr;       assign, failing if Q exists (or replacing it)
  CREATE TENSOR A (i 1000, j 500) FLOAT32;       a tensor of zeros; also ... FROM (SELECT ...)
  LOAD [OR REPLACE] TENSOR B FROM 'b.npy';       also .npz, .parquet, .csv
  LET E[i,j] = expr;                             an intermediate computed where used, never stored
  C;                                             print tensor C
  EXPLAIN [ANALYZE] [(FORMAT JSON)] statement;   the tile plan (ANALYZE also runs it)
  SHOW TENSORS;  SHOW ALL;  SHOW workers;        tensors; settings; one setting
  DESCRIBE C;  SHOW TENSOR C;                    a tensor's shape, dtype, tiles
  DROP TENSOR [IF EXISTS] C;                     remove a tensor
  COPY C TO 'c.npy';                             export (.npy, .parquet, .csv)
  CHECK TENSOR C;  CHECK DATABASE;               verify stored tiles
  SET workers = 4;                               change a setting (SHOW ALL lists them)
  BEGIN; ... COMMIT;  (or ROLLBACK;)             run several statements as one unit
  SELECT * FROM C LIMIT 5;                       any other SQL goes to DuckDB; tensors are tables
Commands:
  .help              this text
  .timer on|off      show how long each statement took (also \\timing)
  .quiet on|off      print only what queries return, not assignments nor messages (also -q)
  .tensors           SHOW TENSORS
  .tables            SHOW TABLES
  .read FILE         run a script
  .quit              leave (also .exit, \\q, quit, exit, Ctrl-D)
help, \\? and .help print this text; a ';' after a command is ignored.
See docs/sql.md for the whole dialect."""


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


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Shell:
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

    # -- the REPL ------------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """A dot command (or psql's backslash one); False to leave the REPL. A ';' after it is
        dropped: ``.timer on;`` is ``.timer on``."""
        parts = line.strip().rstrip(";").split()
        cmd, args = parts[0].lower(), parts[1:]
        if cmd in (".quit", ".exit", "\\q", "\\quit"):
            return False
        if cmd in (".timer", "\\timing"):
            if args and args[0].lower() not in ("on", "off"):
                self.failed = True
                print(f"usage: {cmd} on|off", file=self.err)
            else:
                self.timer = (args[0].lower() == "on") if args else not self.timer
                self._print(f"timer {'on' if self.timer else 'off'}", style="dim")
        elif cmd == ".quiet":
            if args and args[0].lower() not in ("on", "off"):
                self.failed = True
                print(f"usage: {cmd} on|off", file=self.err)
            else:
                self.con.set("quiet", (args[0].lower() == "on") if args else not self.quiet)
                if not self.quiet:
                    self._print("quiet off", style="dim")
        elif cmd in (".help", "\\?", "\\h", "\\help"):
            self._print(HELP)
        elif cmd == ".tensors":
            self.run_text("SHOW TENSORS;", "<stdin>")
        elif cmd == ".tables":
            self.run_text("SHOW TABLES;", "<stdin>")
        elif cmd == ".read" and args:
            run_file(self, args[0])
        else:
            self.failed = True
            print(f"unknown command {parts[0]}: try .help", file=self.err)
        return True

    def check_open_block(self) -> bool:
        """Warn about a BEGIN that was never committed (its statements did not run)."""
        pending = self.con.pending_statements()
        if pending is None:
            return True
        print(f"warning: BEGIN without COMMIT: {pending} statement(s) were not run and nothing "
              "of them was stored", file=self.err)
        return False

    def complete(self, text: str, state: int) -> str | None:
        """Tab completion: keywords, functions, tensor names."""
        if state == 0:
            from .bind import AGGREGATES, SCALAR_FUNCTIONS
            from .dialect.grammar import KEYWORDS
            try:
                names = [t["name"] for t in self.con.tensors()]
            except Error:
                names = []
            words = list(KEYWORDS) + [f.upper() for f in SCALAR_FUNCTIONS + AGGREGATES] + \
                ["EINSUM", "GRAD", "EXPLAIN", "ANALYZE", "SELECT", "JSON", "TEXT"] + names
            low = text.lower()
            self._matches = sorted({w for w in words if w.lower().startswith(low)})
        return self._matches[state] if state < len(self._matches) else None

    def repl(self, read=None, interactive: bool | None = None) -> None:
        """Read statements and commands until EOF or .quit. ``interactive`` (default: stdin is
        a terminal, or ``read`` is given): a banner, prompts, line editing and history. Piped
        input is a script: no banner nor prompts, and errors name their line (``<stdin>:7``)."""
        from .dialect import is_complete
        if interactive is None:
            interactive = read is not None or _isatty(sys.stdin)
        if read is None:
            read = input if interactive else read_piped
        if interactive:
            history(self.complete)
            if not self.quiet:
                self._print(f"tensordb {__version__} ({self.where or 'in-memory database'}). "
                            "End statements with ';'. help for help.")
        buffer, lines, line_no, first_line = "", 0, 0, 1
        while True:
            try:
                line = read("tensordb> " if not buffer else "     ...> ")
            except EOFError:
                if interactive:
                    print(file=self.out)
                if not self.check_open_block():
                    self.failed = True
                break
            except KeyboardInterrupt:
                print("^C", file=self.out)
                buffer, lines = "", 0
                continue
            line_no += 1
            if not is_utf8(line):  # piped bytes that are not UTF-8 (Python keeps them escaped)
                self.failed = True
                print(f"<stdin>:{line_no}: cannot read: a line holds bytes that are not UTF-8; "
                      "the statement it is part of is skipped", file=self.err)
                buffer, lines = "", 0
                continue
            if not buffer:
                cmd = as_command(line)
                if cmd is not None:
                    if not self.command(cmd):
                        break
                    continue
                if not line.strip():
                    continue
                first_line = line_no
            buffer += line + "\n"
            lines += 1
            if is_complete(buffer):
                if interactive and lines > 1:
                    remember(buffer, lines)
                self.run_text(buffer, "<stdin>", first_line if not interactive else 1)
                buffer, lines = "", 0


def _asked_for(result: Result) -> bool:
    """What a quiet shell still prints: rows (SELECT, SHOW, DESCRIBE), EXPLAIN and a tensor
    printed by its name; not a status (CREATE, SET, LET, INSERT counts) nor an assignment's
    result, as psql -q prints no command tags."""
    if result.kind == "tensor":
        said = result.statement.strip().rstrip(";").strip()
        return said.lower() == (result.name or "").lower()
    return result.kind != "status"


def run_file(shell: Shell, path: str) -> bool:
    """Run a script (-f, .read); False, with one line on stderr, when it cannot be read."""
    try:
        text = read_script(path)
    except OSError as exc:
        shell.failed = True
        print(f"{path}: cannot read: {exc.strerror or exc}", file=shell.err)
        return False
    except UnicodeDecodeError as exc:
        shell.failed = True
        print(f"{path}: cannot read: {_not_utf8(exc)}", file=shell.err)
        return False
    quiet = shell.quiet  # a script's SET quiet lasts to its end: the next script prints as asked
    try:
        return shell.run_text(text, path)
    finally:
        if shell.quiet != quiet:
            shell.con.set("quiet", quiet)


def read_script(path: str) -> str:
    """A script's text. UTF-8; a leading byte order mark (editors on Windows write one) is
    dropped rather than read as part of the first statement."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # utf-8-sig reports offsets after the BOM it skipped; the user counts from the file's start
        bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
        raise UnicodeDecodeError(exc.encoding, data, exc.start + bom, exc.end + bom,
                                 exc.reason) from None


def _not_utf8(exc: UnicodeDecodeError) -> str:
    line = exc.object.count(b"\n", 0, exc.start) + 1
    return (f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start} (line {line}) is not "
            "UTF-8; save the script as UTF-8")


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
