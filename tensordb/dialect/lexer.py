"""Splitting a script into statements, and peeking at a statement's first words.

SQL text is split on ``;`` outside strings, quoted identifiers, dollar quotes and comments. Only
this much lexing is shared by our statements and the plain SQL we hand to DuckDB; our own
statements are then parsed by the lark grammar.

>>> text = "SELECT ';'; C = A -- x;\\n;"
>>> [text[s.start:s.end] for s in split(text)]
["SELECT ';'", 'C = A -- x;']
>>> is_complete("SELECT 1"), is_complete("SELECT 1; -- done")
(False, True)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ParserError, Span

__all__ = ["Word", "split", "is_complete", "words", "skip_space"]

_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_WORD = re.compile(r"[^\W\d]\w*|\d+(?:\.\d*)?|'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?|\S")


@dataclass(frozen=True)
class Word:
    """A rough token of a statement: enough to classify it."""

    text: str
    start: int

    @property
    def upper(self) -> str:
        return self.text.upper()


def _scan(text: str, on_split) -> int | None:
    """Walk ``text``; call ``on_split(pos)`` at each top-level ';'. Returns the start of an
    unterminated string/comment, or None."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "eE" and text.startswith("'", i + 1) and not _in_word(text, i):
            j = _escape_string_end(text, i + 2)  # E'...': a backslash escapes the next character
            if j is None:
                return i + 1
            i = j + 1
        elif c == "'" or c == '"':
            j = i + 1
            while True:
                j = text.find(c, j)
                if j < 0:
                    return i
                if j + 1 < n and text[j + 1] == c:  # doubled quote is an escaped quote
                    j += 2
                    continue
                break
            i = j + 1
        elif c == "-" and text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                return i
            i = j + 2
        elif c == "$" and (m := _DOLLAR.match(text, i)) and not _in_word(text, i):
            j = text.find(m.group(0), m.end())
            if j < 0:
                return i
            i = j + len(m.group(0))
        elif c == ";":
            on_split(i)
            i += 1
        else:
            i += 1
    return None


def _in_word(text: str, i: int) -> bool:
    """Whether ``text[i]`` continues an identifier or number (so cannot begin a quote)."""
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _escape_string_end(text: str, j: int) -> int | None:
    """The closing quote of an escape string whose body starts at ``j`` (None: unterminated).
    DuckDB reads ``\\x`` there as an escaped character and ``''`` as a quote."""
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
        elif c == "'":
            if not text.startswith("'", j + 1):
                return j
            j += 2
        else:
            j += 1
    return None


def skip_space(text: str, i: int, end: int | None = None) -> int:
    """The first position at or after ``i`` that is neither whitespace nor inside a comment."""
    end = len(text) if end is None else min(end, len(text))
    while i < end:
        if text[i].isspace():
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i, end)
            i = end if j < 0 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2, end)
            i = end if j < 0 else j + 2
        else:
            break
    return min(i, end)


def _trim_end(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1].isspace():
        end -= 1
    return end


def split(script: str) -> list[Span]:
    """Spans of the non-empty statements of ``script`` (without their ';')."""
    cuts: list[int] = []
    bad = _scan(script, cuts.append)
    if bad is not None:
        what = "comment" if script.startswith("/*", bad) else \
            "dollar-quoted string" if script[bad] == "$" else \
            "quoted identifier" if script[bad] == '"' else "string"
        raise ParserError(f"unterminated {what}", statement=script, span=Span(bad, bad + 1))
    spans = []
    prev = 0
    for cut in cuts + [len(script)]:
        start = skip_space(script, prev, cut)
        if start < cut:
            spans.append(Span(start, _trim_end(script, start, cut)))
        prev = cut + 1
    return spans


def is_complete(text: str) -> bool:
    """True when ``text`` ends with a ';' outside strings and comments (the REPL's test)."""
    cuts: list[int] = []
    if _scan(text, cuts.append) is not None or not cuts:
        return False
    return skip_space(text, cuts[-1] + 1) >= len(text)


def words(text: str, start: int, end: int, limit: int = 8) -> list[Word]:
    """The first ``limit`` rough tokens of ``text[start:end]``, skipping comments."""
    out: list[Word] = []
    end = min(end, len(text))
    i = start
    while len(out) < limit:
        i = skip_space(text, i, end)
        if i >= end:
            break
        m = _WORD.match(text, i, end)
        if m is None:  # pragma: no cover - \S always matches
            break
        out.append(Word(m.group(0), i))
        i = m.end()
    return out
