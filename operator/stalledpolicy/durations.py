"""Duration strings as users write them: ``500ms``, ``30s``, ``2m``, ``1h``, ``1h30m``, ``7d``."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError with the accepted forms."""
    value = text.strip() if isinstance(text, str) else ""
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"{text!r} is not a duration; write a number with a unit, for example 30s, 2m, 1h or 1h30m"
        )
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value))


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)
