"""The confirmation question a change asks before it runs."""

from __future__ import annotations

from typing import IO


def is_interactive(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def confirm(question: str, *, stdin: IO[str], stderr: IO[str]) -> bool:
    """Ask ``question [y/N]`` on ``stderr`` (stdout may be a JSON document) and
    read one answer line; only ``y``/``yes`` agree, end of input declines.
    Ctrl-C is no answer: its KeyboardInterrupt goes on to the command, which
    exits 130 (interrupted) as on Ctrl-C anywhere else, not 4 (declined)."""
    stderr.write(f"{question} [y/N] ")
    stderr.flush()
    answer = stdin.readline()
    if not answer.endswith("\n"):
        stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")
