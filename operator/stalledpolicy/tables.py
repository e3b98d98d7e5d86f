"""Plain-text tables and ages for terminal output (the standard library and URL redaction only).

Cell text often comes from programs we do not own (a worker's ``last_error``),
so every cell is made printable first: a newline or an ANSI escape sequence in
an error message must not break the table or drive the engineer's terminal.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from stalledpolicy.redis_url.redaction import redact_value

EMPTY = "-"
ELLIPSIS = "…"
GAP = "  "


def printable(value: object, *, exact: bool = False) -> str:
    """``value`` as one printable line: None -> ``-``, whitespace runs (newlines
    included) -> one space, other control characters -> ``\\xNN`` escapes,
    bytes that were not UTF-8 (decoded with ``surrogateescape``) -> ``\\xNN``,
    and a backslash -> two, so that an escape shown is never a backslash the
    value holds (``JOB\\\\xff`` is the text, ``JOB\\xff`` the byte).

    ``exact`` (an id or a lane: what is shown must name one value): only the
    plain space stays as it is, every space kept; other whitespace and
    separators (tab, newline, no-break space, ...) are escaped too, and
    nothing is trimmed; a value that is ``-`` (the empty cell) shows as ``\\x2d``;
    a character past ASCII is escaped as ``\\uNNNN``, so that
    it never reads as the byte ``\\xNN`` (both can be typed: ``$'\\u00a0'``)."""
    if value is None:
        return EMPTY
    text = str(value)
    if exact and text == EMPTY:
        return "\\x2d"  # a name that is '-' is not the empty cell
    out: list[str] = []
    x_below = 0x80 if exact else 0x100
    for ch in text:
        if exact and ch != " " and (ch in "\t\n\r\v\f" or unicodedata.category(ch)[0] == "Z"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < x_below else f"\\u{ord(ch):04x}")
        elif ch in " \t\n\r\v\f":
            if exact or (out and out[-1] != " "):
                out.append(" ")
        elif ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= ord(ch) <= 0xDCFF:
            # a byte that is not UTF-8, kept as a lone surrogate (surrogateescape):
            # shown as the byte it stands for
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < x_below else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) if exact else "".join(out).strip()


def shown(text: str, limit: int, *, quoted: bool = False, keep: int | None = None) -> str:
    """``text`` for a message: whole when it has at most ``limit`` characters,
    else its first ``keep`` (default ``limit``), ``...`` and its length;
    ``quoted`` puts the text (or the part shown) in repr quotes. A URL in it is
    redacted first: cut before its ``@``, a password could no longer be found."""
    text = redact_value(text)
    if len(text) <= limit:
        return repr(text) if quoted else text
    part = text[:limit if keep is None else keep]
    head = repr(part) if quoted else part
    return f"{head}... ({len(text)} characters)"


def char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Terminal columns taken by ``text`` (wide CJK characters count two)."""
    return sum(char_width(ch) for ch in text)


def truncate(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` columns, marked with an ellipsis when cut."""
    if width <= 0:
        return ""
    if display_width(text) <= width:
        return text
    kept: list[str] = []
    used = 0
    for ch in text:
        w = char_width(ch)
        if used + w > width - 1:
            break
        kept.append(ch)
        used += w
    return "".join(kept) + ELLIPSIS


def truncate_unescaped(text: str, width: int) -> str:
    """``text`` cut so that, once :func:`printable` escapes it in a cell, it takes
    at most ``width`` columns (``truncate`` measures the text as it is: a control
    character, one column there, is four as ``\\xNN``)."""
    if width <= 0:
        return ""
    if display_width(printable(text)) <= width:
        return text
    kept: list[str] = []
    used = 0
    for ch in text:
        # whitespace printable() keeps as one space; other separators it escapes
        w = 1 if ch in " \t\n\r\v\f" else display_width(printable(ch))
        if used + w > width - 1:
            break
        kept.append(ch)
        used += w
    return "".join(kept) + ELLIPSIS


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * (width - display_width(text))
    return fill + text if right else text + fill


def render_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    right: Iterable[str] = (),
    max_widths: Mapping[str, int] | None = None,
    exact: Iterable[str] = (),
) -> str:
    """Aligned columns separated by two spaces; columns named in ``right`` are
    right-aligned (numbers), ``max_widths`` caps a column (cut with ``…``),
    columns named in ``exact`` hold ids or names (``printable(exact=True)``).
    No trailing spaces; no trailing newline."""
    right_aligned = set(right)
    caps = dict(max_widths or {})
    exact_columns = {i for i, name in enumerate(headers) if name in set(exact)}
    cells = [[printable(v, exact=i in exact_columns) for i, v in enumerate(row)] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, table has {len(headers)} columns")
        for i, name in enumerate(headers):
            if name in caps:
                row[i] = truncate(row[i], caps[name])
    widths = [display_width(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], display_width(text))
    lines = []
    for row in [list(headers), *cells]:
        parts = [_pad(text, widths[i], headers[i] in right_aligned) for i, text in enumerate(row)]
        lines.append(GAP.join(parts).rstrip())
    return "\n".join(lines)


def render_pairs(pairs: Sequence[tuple[str, object]]) -> str:
    """``key  value`` lines with the values aligned."""
    width = max((display_width(k) for k, _ in pairs), default=0)
    return "\n".join(f"{_pad(k, width, False)}{GAP}{printable(v)}".rstrip() for k, v in pairs)


def format_age(seconds: float | None) -> str:
    """How long ago, to the two largest units: ``45s ago``, ``3h12m ago``,
    ``2d5h ago``. A small negative age (clock skew) reads ``0s ago``."""
    if seconds is None:
        return EMPTY
    whole = max(0, int(seconds))
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        if whole >= size or (name == "s" and not parts):
            parts.append(f"{whole // size}{name}")
            whole %= size
        elif parts:
            # keep the second unit even when it is zero: "3h0m", not "3h"
            parts.append(f"0{name}")
        if len(parts) == 2:
            break
    return "".join(parts) + " ago"
