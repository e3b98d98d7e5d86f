"""Output streams whose reader went away."""

from __future__ import annotations

import os
from typing import IO


def discard(stream: IO[str]) -> None:
    """The reader of ``stream`` went away (a BrokenPipeError, ``... | head``):
    point its file descriptor at /dev/null so later writes and the
    interpreter's final flush do not fail. A stream without a descriptor is
    left as it is."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    finally:
        os.close(devnull)
