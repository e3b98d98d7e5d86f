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


class ReaderMayLeave:
    """A text stream whose reader may go away (``morgue purge ... | head -1``):
    a write or flush that meets a closed pipe discards the stream (the rest of
    the output is lost, quietly) instead of raising, so the command still ends
    with the exit code of what it did to the data, and its other stream still
    says what it must. Everything else is the wrapped stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.lost = False  # the reader went away; nothing more is written

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        # what is still buffered goes to /dev/null with the interpreter's final flush
        discard(self._stream)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
