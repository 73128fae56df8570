"""The terminal side of the shell: reading lines (a terminal's, with history and completion, or
piped ones, without prompts), the words and commands a line may be, and the way out of a
statement that a Ctrl-C did not stop (a second Ctrl-C abandons it).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["history", "save_history", "remember", "read_piped", "as_command", "is_utf8",
           "Abandon", "HISTORY_FILE", "NOTICE_AFTER"]

HISTORY_FILE = "~/.tensordb_history"


def read_piped(prompt: str) -> str:
    """A line of piped input, without its newline and without a prompt (it is no dialogue)."""
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line[:-1] if line.endswith("\n") else line


# Words psql takes alone on a line, before any statement: `help`, `quit`, `exit` (a ';' after
# them too). A tensor of one of these names is printed by SELECT * FROM it, or "name" quoted.
_WORDS = {"help": ".help", "quit": ".quit", "exit": ".quit"}


def as_command(line: str) -> str | None:
    """The command a line at the start of a statement is (``.timer on``, ``\\q``, ``help``,
    ``quit;``), or None: the line begins a statement."""
    text = line.strip()
    word = text.rstrip(";").strip().lower()
    if word in _WORDS:
        return _WORDS[word]
    return text if text[:1] in (".", "\\") else None


def remember(statement: str, lines: int) -> None:
    """A statement typed over several lines is one history entry (recalled whole), not one per
    line. Its lines are joined by spaces, so that the history file keeps it as one entry, unless
    a line holds a ``--`` comment, which would swallow the lines after it."""
    try:
        import readline
    except ImportError:
        return
    n = readline.get_current_history_length()
    if n < lines:
        return
    typed = [readline.get_history_item(n - k + 1) for k in range(lines, 0, -1)]  # 1-based
    if [t.strip() for t in typed if t is not None] != \
            [t.strip() for t in statement.rstrip("\n").split("\n")]:
        return  # not the lines just typed (history off, or lines recalled differently)
    for k in range(lines):
        readline.remove_history_item(n - 1 - k)  # 0-based
    parts = [t.rstrip() for t in typed]
    joined = "\n".join(parts) if any("--" in t for t in parts) else \
        " ".join(p.strip() for p in parts)
    readline.add_history(joined)


def is_utf8(text: str) -> bool:
    """Whether ``text`` is text: stdin decodes bytes that are not UTF-8 to lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def history(completer=None) -> None:
    """Line editing, tab completion and a history file, where the platform has readline."""
    try:
        import atexit
        import readline
    except ImportError:
        return
    if completer is not None:
        readline.set_completer(completer)
        readline.set_completer_delims(" \t\n;,()[]=+-*/")
        readline.parse_and_bind("tab: complete")
    path = os.path.expanduser(HISTORY_FILE)
    try:
        readline.read_history_file(path)
    except (OSError, ValueError):
        pass
    readline.set_history_length(2000)

    def save() -> None:
        try:
            readline.write_history_file(path)
        except OSError:
            pass
    global _save
    _save = save
    atexit.register(save)


_save = None  # the history's save, once history() set it up


def save_history() -> None:
    """Write the history file now (leaving with os._exit runs no atexit function)."""
    if _save is not None:
        _save()


NOTICE_AFTER = 1.0  # seconds a statement may take to stop after a Ctrl-C before a way out is offered


class Abandon:
    """A second Ctrl-C abandons a statement that the first did not stop. Not every query stops
    at a Ctrl-C: DuckDB checks for one between pieces of work, and one large function call
    (``list_sort`` of a long list) runs to its end. ``NOTICE_AFTER`` seconds after a Ctrl-C,
    a statement still running gets a notice; a Ctrl-C after the notice ends the process at once
    (exit status 130), as a kill would: a database on disk is as it was before the statement
    (its writes are crash-safe), a database in memory is lost.

    Python runs its SIGINT handler only between the main thread's bytecodes, and the main thread
    is inside DuckDB: ``signal.set_wakeup_fd`` makes the C-level handler write the signal to a
    pipe, which a thread of ours reads. Python's own handling (KeyboardInterrupt) is unchanged.
    """

    def __init__(self, err, in_memory: bool) -> None:
        self.err = err
        self.in_memory = in_memory
        self.lock = threading.Lock()
        self.count = 0        # statements run so far
        self.running = 0      # the number of the one running; 0 between statements
        self.interrupted = 0  # the statement the last Ctrl-C came during
        self.noticed = 0      # the statement the notice was given for
        self._pipe: tuple[int, int] | None = None
        self._old = -1

    def start(self) -> "Abandon":
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may set the wakeup fd: no way out offered
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return self
        self._pipe = (r, w)
        threading.Thread(target=self._watch, args=(r,), name="tensordb-ctrl-c",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._old)
        os.close(self._pipe[1])  # the watcher reads the end of the pipe and leaves
        self._pipe = None

    @contextlib.contextmanager
    def statement(self):
        """Around a statement (or a script) that runs: Ctrl-C counts only then."""
        with self.lock:
            self.count += 1
            self.running = self.count
        try:
            yield
        finally:
            with self.lock:
                self.running = 0

    def _watch(self, r: int) -> None:
        try:
            while True:
                data = os.read(r, 64)
                if not data:
                    return
                if signal.SIGINT not in data:
                    continue
                with self.lock:
                    run = self.running
                    if not run:
                        continue
                    if self.noticed == run:
                        self._leave()
                    if self.interrupted != run:
                        self.interrupted = run
                        timer = threading.Timer(NOTICE_AFTER, self._notice, (run,))
                        timer.daemon = True
                        timer.start()
        finally:
            os.close(r)

    def _notice(self, run: int) -> None:
        with self.lock:
            if self.running != run:
                return
            self.noticed = run
        lost = "the database in memory is lost" if self.in_memory else \
            "the database keeps its state from before the statement"
        print(f"\nthe statement did not stop at Ctrl-C: it goes on; press Ctrl-C again to "
              f"abandon it and leave tensordb ({lost})", file=self.err, flush=True)

    def _leave(self) -> None:
        print("abandoned: tensordb leaves while the statement runs; nothing of it was stored",
              file=self.err, flush=True)
        try:
            save_history()
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
        os._exit(130)
