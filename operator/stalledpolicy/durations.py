"""Duration strings as users write them: ``500ms``, ``30s``, ``2m``, ``1h``, ``1h30m``, ``7d``."""

from __future__ import annotations

import re

from stalledpolicy.tables import shown

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"
# No setting needs more; a longer one is a typo, and 320 digits would be inf.
LONGEST_S = 36_500 * 86_400.0
_SHOWN_MAX = 40


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (at most 36500d); raises ValueError with the accepted forms."""
    value = text.strip() if isinstance(text, str) else ""
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"{_shown(text)} is not a duration; write a number with a unit, for example 30s, 2m, 1h, 1h30m or 7d"
        )
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value))
    if not seconds <= LONGEST_S:  # also inf
        raise ValueError(f"{_shown(text)} is longer than 36500d (100 years); write a shorter duration")
    return seconds


def _shown(text: object) -> str:
    return shown(text, _SHOWN_MAX, quoted=True) if isinstance(text, str) else repr(text)


def format_duration(seconds: float) -> str:
    """``seconds`` written the way :func:`parse_duration` reads it, exactly to
    the microsecond: ``1.5s``, ``1m30.25s``, ``500ms``, ``1.5ms``, ``7d``.
    Nothing is cut off: ``1.5`` is ``1.5s``, never ``1s``."""
    micros = max(0, round(seconds * 1_000_000))
    if micros < 1_000_000:
        return _with_fraction(micros, 1000) + "ms"
    whole, fraction = divmod(micros, 1_000_000)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    if whole or fraction:
        parts.append(_with_fraction(whole * 1_000_000 + fraction, 1_000_000) + "s")
    return "".join(parts)


def _with_fraction(amount: int, per_unit: int) -> str:
    """``amount / per_unit`` in decimal, without trailing zeros: 1500/1000 -> ``1.5``."""
    units, rest = divmod(amount, per_unit)
    if not rest:
        return str(units)
    digits = len(str(per_unit)) - 1
    return f"{units}.{rest:0{digits}d}".rstrip("0")
