"""Duration strings as users write them: ``500ms``, ``30s``, ``2m``, ``1h``, ``1h30m``, ``7d``."""

from __future__ import annotations

import re

from stalledpolicy.tables import shown

# Nanoseconds, as Go's time.ParseDuration (and the CRD's CEL duration()) adds parts:
# in floating point, 0.7s0.2s0.1s was 0.9999999999999999 s and out of a 1s minimum
# the API server had admitted.
_UNIT_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9}
_PART = re.compile(r"(\d+)(?:\.(\d+))?(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"
# No setting needs more: a longer one is a typo.
LONGEST_S = 36_500 * 86_400
_SHOWN_MAX = 40


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (at most 36500d); raises ValueError with the accepted forms."""
    value = text.strip() if isinstance(text, str) else ""
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"{_shown(text)} is not a duration; write a number with a unit, for example 30s, 2m, 1h, 1h30m or 7d"
        )
    # a fraction below the nanosecond is dropped, as Go drops it
    nanoseconds: int = sum(int(whole) * _UNIT_NS[unit] + int(fraction or 0) * _UNIT_NS[unit] // 10 ** len(fraction)
                           for whole, fraction, unit in _PART.findall(value))
    if nanoseconds > LONGEST_S * 10**9:
        raise ValueError(f"{_shown(text)} is longer than 36500d (100 years); write a shorter duration")
    return nanoseconds / 10**9


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
