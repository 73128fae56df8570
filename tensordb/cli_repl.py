"""The command line's REPL and scripts (a mixin ``cli.Shell`` inherits): dot commands (``.help``,
``.timer``, ``.read``, psql's backslash forms), tab completion, the read loop (interactive, or piped
input read as a script), and reading a script file (UTF-8, a leading byte order mark dropped).
"""
from __future__ import annotations

import codecs
import sys
from typing import TYPE_CHECKING

from . import __version__
from .errors import Error
from .terminal import as_command, history, is_utf8, read_piped, remember

if TYPE_CHECKING:  # pragma: no cover
    from .cli import Shell

__all__ = ["HELP", "Repl", "run_file", "read_script"]

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

def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Repl:
    """The REPL of a ``cli.Shell`` (its state set up by ``Shell.__init__``)."""

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
