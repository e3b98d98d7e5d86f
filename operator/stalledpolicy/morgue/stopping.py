"""SIGTERM and SIGINT while a replay or purge runs: the script call in progress
finishes, the next one is not sent, and what moved so far is reported (as
``stalledpolicy sweep --once`` does). Before the change starts (preview,
prompt) and in the read-only actions a signal ends the command at once:
nothing was changed.

The command honours both signals whatever disposition it inherited: it
installs its own handlers while it runs (and gives the previous ones back when
it returns). A background job of a non-interactive shell (``cmd &`` in a
script) starts with SIGINT ignored; Python then installs no KeyboardInterrupt
handler, and Ctrl-C at the confirmation prompt would be swallowed while the
prompt waits for an answer. To keep a run from being interrupted, do not send
it the signal (``setsid`` gives it a session of its own, away from the
terminal's Ctrl-C)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# the shell's 128 + signal number: 130 for SIGINT, 143 for SIGTERM
EXIT_SIGNALLED_BASE = 128


class Terminated(BaseException):
    """SIGTERM outside a change's calls: ends the command as Ctrl-C does."""


class Stopper:
    """Remembers the first SIGTERM/SIGINT received while installed; its
    :meth:`should_stop` (the engine's, asked between calls only) stops the
    engine before its next call once a signal came. A signal during the last
    call stops nothing: the engine does not ask after it, and
    :attr:`stopped_early` stays false."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stopped_early = False  # a call was left unsent because of the signal

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "-"

    @property
    def exit_code(self) -> int:
        return EXIT_SIGNALLED_BASE + (self.signum or 0)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def should_stop(self) -> bool:
        if self.signum is not None:
            self.stopped_early = True
        return self.stopped_early

    @contextmanager
    def installed(self) -> Iterator[Stopper]:
        with _handlers(self._on_signal):
            yield self


def _raise_terminated(_signum: int, _frame: Any) -> None:
    raise Terminated


@contextmanager
def terminate_like_interrupt() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated`, so the
    command ends with a message and 130 or 143 rather than silently; SIGINT's
    handler is installed here too, as an inherited SIG_IGN would leave none."""
    with _handlers(signal.default_int_handler, (signal.SIGINT,)), _handlers(_raise_terminated, (signal.SIGTERM,)):
        yield


@contextmanager
def _handlers(handler: Any, signals: tuple[signal.Signals, ...] = SIGNALS) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (an embedding caller's thread)
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
