"""One error tree, on DB-API 2.0 names, and the one place that renders a caret line.

Every error a user can cause is a subclass of :class:`Error`. An error may carry the statement
text and a span inside it; ``str(err)`` then shows the message, ``LINE n: ...`` and a caret::

    tensordb.BinderError: label 'j' has size 512 in A but 256 in B
    LINE 1: C[i,k] = SUM(A[i,j] * B[j,k])
                                  ^
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

__all__ = [
    "closest_keyword",
    "Span", "render_caret",
    "Warning", "GradientWarning", "NonFiniteWarning", "warning_text", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "ParserError", "BinderError", "CatalogError", "OutOfMemoryError",
]

_CONTEXT = 40  # display columns kept on each side of the caret, as DuckDB does
_TAB = 8       # columns between tab stops, as terminals set them


@dataclass(frozen=True)
class Span:
    """A half-open character range [start, end) in a statement's source text."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"bad span {self.start}..{self.end}")


def render_caret(text: str, span: Span) -> str:
    r"""Return ``LINE n: <line>`` and a caret line under ``span.start``. Tabs in the line are
    expanded (stops every ``_TAB`` columns of the source line) in the echo and counted so in
    the caret's column: a terminal would put a tab's stops after the ``LINE n:`` prefix instead.

    >>> print(render_caret("X = 1;\n\tY = Nope;", Span(12, 16)))
    LINE 2:         Y = Nope;
                        ^~~~
    """
    start = min(span.start, len(text))
    line_no = text.count("\n", 0, start) + 1
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    raw = text[line_start: line_end if line_end >= 0 else len(text)]
    line = raw.expandtabs(_TAB)
    col = len(raw[:start - line_start].expandtabs(_TAB))
    end = len(raw[:max(start, min(span.end, line_start + len(raw))) - line_start].expandtabs(_TAB))
    lo, hi = max(0, col - _CONTEXT), min(len(line), col + _CONTEXT)
    shown = ("..." if lo else "") + line[lo:hi] + ("..." if hi < len(line) else "")
    prefix = f"LINE {line_no}: "
    caret_col = len(prefix) + (3 if lo else 0) + (col - lo)
    width = max(1, min(end, hi) - col)
    return f"{prefix}{shown}\n{' ' * caret_col}^{'~' * (width - 1) if width > 1 else ''}"


class Warning(UserWarning):  # noqa: A001 - DB-API name
    """DB-API warning; also a Python warning category (``warnings.warn``), so that
    ``warnings.simplefilter("error", tensordb.Warning)`` turns tensordb's warnings into errors.
    Its text names the statement, with a caret, as an error's does (``warning``)."""


class GradientWarning(Warning):
    """A GRAD whose result is zeros by construction: the loss does not depend on the tensor
    (never read, or assigned after the loss read it)."""


class NonFiniteWarning(Warning):
    """A stored result of EXP or SOFTMAX holds inf or NaN (an overflow)."""


def warning_text(message: str, statement: str | None = None, span: Span | None = None,
                 hint: str | None = None) -> str:
    """A warning's text: the message, the caret line, the hint (as ``str(Error)`` shows)."""
    parts = [message]
    if statement is not None and span is not None:
        parts.append(render_caret(statement, span))
    elif statement is not None:
        parts.append(f"in statement: {statement.strip()[:200]}")
    if hint:
        parts.append(f"HINT: {hint}")
    return "\n".join(parts)


class Error(Exception):
    """Root of every tensordb error.

    ``statement`` is the source text the error refers to (if any) and ``span`` the position in it.
    """

    def __init__(self, message: str, *, statement: str | None = None, span: Span | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.statement = statement
        self.span = span
        self.hint = hint

    def with_source(self, statement: str, span: Span | None = None) -> "Error":
        r"""Attach the statement text (and a span, if the error has none yet); returns self.

        An error about a piece of ``statement`` (one SQL statement DuckDB split out of a script)
        moves to where that piece is in it, inside ``span`` when given, so that its LINE and
        caret are the script's:

        >>> e = Error("bad", statement="COPY x", span=Span(5, 6))
        >>> e.with_source("SELECT 1;\nCOPY x;", Span(10, 16)).span
        Span(start=15, end=16)
        """
        if self.statement is None:
            self.statement = statement
        elif self.statement != statement and self.span is not None:
            self._move_into(statement, span or Span(0, len(statement)))
        if self.span is None and span is not None:
            self.span = span
        return self

    def _move_into(self, statement: str, span: Span) -> None:
        if not self.statement.strip():
            return
        at = statement.find(self.statement, span.start, max(span.end, span.start + len(self.statement)))
        if at < 0:  # not a piece of it (a query tensordb wrote around the user's): kept as is
            return
        self.statement = statement
        self.span = Span(self.span.start + at, self.span.end + at)

    def __str__(self) -> str:
        parts = [self.message]
        if self.statement is not None and self.span is not None:
            parts.append(render_caret(self.statement, self.span))
        elif self.statement is not None:
            parts.append(f"in statement: {self.statement.strip()[:200]}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)


class InterfaceError(Error):
    """Misuse of the interface itself (for example, a closed connection)."""


class DatabaseError(Error):
    """Errors related to the database."""


class DataError(DatabaseError):
    """Bad data: unreadable or corrupt files, unsupported dtypes, values outside a shape."""


class OperationalError(DatabaseError):
    """I/O, locking and resource errors that are not the statement's fault."""


class IntegrityError(DatabaseError):
    """The catalog's integrity would be violated."""


class InternalError(DatabaseError):
    """A bug in tensordb: please report it."""


class ProgrammingError(DatabaseError):
    """The statement is wrong: syntax, names, labels, shapes."""


class NotSupportedError(DatabaseError):
    """A feature that tensordb does not support."""


class ParserError(ProgrammingError):
    """The text is not a valid statement."""


class BinderError(ProgrammingError):
    """Names, labels, shapes or types do not fit together."""


class CatalogError(ProgrammingError):
    """A tensor or table does not exist, or already exists."""


class OutOfMemoryError(OperationalError):
    """The work does not fit the memory budget."""


# -- did you mean ---------------------------------------------------------------------------------

def closest_keyword(word: str, kws) -> str | None:
    """One typo away, the likeliest first: two letters swapped (FORM), a letter left out
    (SELCT), a wrong letter, an extra letter; else difflib's closest, if close enough."""
    ranked = []
    for kw in kws:
        kind = _one_typo(word, kw)
        if kind is not None:
            ranked.append((kind, kw))
    if ranked:
        return min(ranked)[1]
    if len(word) < 4:
        return None
    close = difflib.get_close_matches(word, sorted(kws), n=1, cutoff=0.75)
    return close[0] if close else None


def _one_typo(word: str, kw: str) -> int | None:
    """0 swapped, 1 left out, 2 wrong, 3 extra letter; None when ``kw`` is not one typo away."""
    if len(word) == len(kw):
        diff = [i for i, (a, b) in enumerate(zip(word, kw)) if a != b]
        if len(diff) == 2 and diff[1] == diff[0] + 1 and word[diff[0]] == kw[diff[1]] \
                and word[diff[1]] == kw[diff[0]]:
            return 0
        return 2 if len(diff) == 1 and len(word) > 2 else None
    if len(kw) == len(word) + 1 and len(word) >= 3:
        return 1 if any(kw[:i] + kw[i + 1:] == word for i in range(len(kw))) else None
    if len(word) == len(kw) + 1 and len(kw) >= 3:
        return 3 if any(word[:i] + word[i + 1:] == kw for i in range(len(word))) else None
    return None
