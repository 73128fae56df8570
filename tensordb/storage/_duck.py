"""DuckDB error translation and quoting: no duckdb exception leaves the storage package."""
from __future__ import annotations

import contextlib
import signal
import threading

import duckdb

from .. import errors

__all__ = ["translate", "translate_message", "translating", "is_interrupt", "note_interrupt",
           "note_stream_error", "held_interrupt",
           "quote_ident", "quote_str", "spelled_names"]

# Most specific first: DuckDB's exception classes form a tree, ours too.
_MAP = (
    (duckdb.CatalogException, errors.CatalogError),
    (duckdb.ParserException, errors.ParserError),
    (duckdb.BinderException, errors.BinderError),
    (duckdb.OutOfMemoryException, errors.OutOfMemoryError),
    (duckdb.ConstraintException, errors.IntegrityError),
    (duckdb.ConversionException, errors.DataError),
    (duckdb.InvalidInputException, errors.DataError),
    (duckdb.DataError, errors.DataError),
    (duckdb.IOException, errors.OperationalError),
    (duckdb.ConnectionException, errors.OperationalError),
    (duckdb.OperationalError, errors.OperationalError),
    (duckdb.NotImplementedException, errors.NotSupportedError),
    (duckdb.InternalException, errors.InternalError),
    (duckdb.ProgrammingError, errors.ProgrammingError),
    (duckdb.IntegrityError, errors.IntegrityError),
    (duckdb.Error, errors.DatabaseError),
)


def translate(exc: BaseException, context: str | None = None) -> errors.Error:
    """The tensordb error for a duckdb exception (``context`` prefixes the message)."""
    cls = next((ours for theirs, ours in _MAP if isinstance(exc, theirs)), errors.DatabaseError)
    message = _unprefixed(str(exc), cls)
    return cls(f"{context}: {message}" if context else message)


def _unprefixed(message: str, cls: type) -> str:
    """DuckDB's message without its "Parser Error: " when the class says the same
    ("ParserError: Parser Error: ..." would say it twice); other prefixes carry information."""
    head, sep, rest = message.partition(": ")
    if sep and head.endswith(" Error") and head.replace(" ", "").lower() == cls.__name__.lower():
        return rest
    return message


@contextlib.contextmanager
def translating(context: str | None = None):
    """Re-raise any duckdb exception inside the block as a tensordb error; DuckDB's report of
    a Ctrl-C as the KeyboardInterrupt it was."""
    since = _STREAM_SEQ[0]
    try:
        yield
    except BaseException as exc:
        swallowed = _SWALLOWED.is_set()
        _SWALLOWED.clear()  # noted for the DuckDB error that follows it, and for no other
        if is_interrupt(exc) or (isinstance(exc, duckdb.Error) and swallowed):
            raise KeyboardInterrupt from None
        if isinstance(exc, duckdb.Error):
            ours = _stream_error(str(exc), since)
            if ours is not None:  # a tensordb error inside a tensor's stream, as it was
                raise ours from None
            raise translate(exc, context) from exc
        raise
    _SWALLOWED.clear()  # a noted interrupt whose error never came this way is stale now


# A tensordb error raised inside a tensor's Arrow stream (a damaged tile) reaches the caller as
# DuckDB's "Invalid Input Error" with a Python traceback in its text: it is kept here, and the
# DuckDB error whose text carries its message is reported as the error itself.
# Some statements (COPY ... TO) report only "Current transaction is aborted": then the error
# noted since the block began is the one.
_STREAM_ERRORS: list = []  # (sequence number, error)
_STREAM_SEQ = [0]
_STREAM_LOCK = threading.Lock()


def note_stream_error(exc: BaseException) -> None:
    """A tensordb error is passing through Python code that DuckDB runs (``translating``)."""
    with _STREAM_LOCK:
        _STREAM_SEQ[0] += 1
        _STREAM_ERRORS.append((_STREAM_SEQ[0], exc))
        del _STREAM_ERRORS[:-8]


def _stream_error(message: str, since: int | None = None):
    with _STREAM_LOCK:
        for i, (_, exc) in enumerate(_STREAM_ERRORS):
            if exc.message and exc.message in message:
                del _STREAM_ERRORS[i]
                return exc
        if since is not None and "transaction is aborted" in message:
            for i, (seq, exc) in enumerate(_STREAM_ERRORS):
                if seq > since:
                    del _STREAM_ERRORS[i]
                    return exc
    return None


# A Ctrl-C raised inside Python code that DuckDB was running (an Arrow stream of a tensor):
# DuckDB reports it as its own error ("Current transaction is aborted"), not as what it was.
_SWALLOWED = threading.Event()


def note_interrupt() -> None:
    """A KeyboardInterrupt is passing through Python code that DuckDB runs: the DuckDB error
    that follows is reported as the KeyboardInterrupt (``translating``)."""
    _SWALLOWED.set()


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB saying a statement was interrupted (Ctrl-C while it ran): an
    InterruptException, or, from its relation API, a RuntimeError "Query interrupted"."""
    return isinstance(exc, duckdb.InterruptException) or \
        (type(exc) is RuntimeError and str(exc) == "Query interrupted")


_PREFIX = (("Conversion Error", errors.DataError), ("Invalid Input Error", errors.DataError),
           ("Out of Memory Error", errors.OutOfMemoryError), ("IO Error", errors.OperationalError),
           ("Catalog Error", errors.CatalogError), ("Binder Error", errors.BinderError))


def translate_message(message: str, context: str | None = None) -> errors.Error:
    """The tensordb error for a DuckDB error that reached us as text (through an Arrow stream)."""
    ours = _stream_error(message)
    if ours is not None:
        return ours
    cls = next((ours for prefix, ours in _PREFIX if message.startswith(prefix)),
               errors.DatabaseError)
    message = _unprefixed(message, cls)
    return cls(f"{context}: {message}" if context else message)


def quote_ident(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def quote_str(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def first_row(result):
    """The first row of an executed query, or None. Fetching everything finishes the result:
    DuckDB refuses other work on a connection while a result is only partly fetched."""
    rows = result.fetchall()
    return rows[0] if rows else None


def spelled_names(query: str) -> list[str]:
    """Identifiers and keywords of ``query`` as spelled (quotes removed, case kept), by
    DuckDB's own tokenizer, which knows every kind of string and comment ($$...$$, E'...'): a
    name inside one is none. Text DuckDB cannot tokenize raises its error."""
    toks = duckdb.tokenize(query)
    out = []
    for k, (pos, kind) in enumerate(toks):
        if kind not in (duckdb.token_type.identifier, duckdb.token_type.keyword):
            continue
        word = query[pos:toks[k + 1][0] if k + 1 < len(toks) else len(query)].strip()
        if len(word) >= 2 and word[0] == word[-1] == '"':
            word = word[1:-1].replace('""', '"')
        out.append(word)
    return out


class held_interrupt:
    """Hold a Ctrl-C back while the block runs (a commit between its durable step and the
    process recording it), then raise it: the block's work is done, as a Ctrl-C that came
    after it. Python runs a SIGINT handler in the main thread only, between bytecodes, so only
    there can a KeyboardInterrupt arrive; this swaps the main thread's handler for one that
    notes the signal (DuckDB's own check for an interrupt, inside a statement, then finds none)
    and restores it after. In another thread, or with a handler that is not Python's (ignored,
    the default action), nothing is swapped. A block that raises keeps its exception; the
    Ctrl-C held meanwhile is then dropped (the statement fails all the same). Nested blocks
    leave it to the outermost."""

    __slots__ = ("old", "caught")

    def __enter__(self) -> "held_interrupt":
        self.old, self.caught = None, None
        if threading.current_thread() is not threading.main_thread():
            return self
        # Looked at first, swapped only when it is Python's and not held already: a nested
        # block that swapped itself in and the outer block back lost a Ctrl-C that came in
        # between (noted on the nested block, which holds nothing). A Ctrl-C before the swap
        # raises before the block, as one that came before it.
        old = signal.getsignal(signal.SIGINT)
        if callable(old) and not isinstance(old, held_interrupt):
            signal.signal(signal.SIGINT, self)  # one system call each way (about 3 us)
            self.old = old
        return self

    def __call__(self, signum, frame) -> None:  # the handler while held
        self.caught = (signum, frame)

    def __exit__(self, kind, exc, tb) -> bool:
        if self.old is None:
            return False
        signal.signal(signal.SIGINT, self.old)
        caught, self.caught = self.caught, None
        if caught is not None and kind is None:
            self.old(*caught)  # Python's handler: raises KeyboardInterrupt
        return False
