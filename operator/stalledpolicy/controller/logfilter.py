"""Log hygiene for kopf's records: plain fields, and no repeated retry errors.

kopf attaches its settings object and an object reference to every record of
an object logger; our structured formatters would print the settings in every
line. This filter keeps the reference as ``namespace``/``policy`` fields and
drops the rest. It also lets a handler's retry error through only when its
text changes for that object: kopf retries a failing handler with backoff, and
says so once (the operator's own applies are retried by sync, not by kopf:
docs/architecture.md). A standby replica's SIGTERM is no warning either
(``_LEAD_CANCELLED``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

_KOPF_ATTRS = ("settings", "k8s_skip", "k8s_ref")
# Watch-event handlers succeed on every event of every object: not news.
_QUIET = ("Handler 'on_policy_event' succeeded.", "Handler 'on_sweeper_event' succeeded.")
_REPEATABLE = ("failed temporarily", "failed with an exception. Will retry")
# A waiting replica stopped by SIGTERM: kopf warns that it cancels the startup
# handler waiting for the Lease, then that startup was cut short; that is the clean
# way out, said by leader.py at INFO. The second line is dropped only after the first.
_LEAD_CANCELLED = "Activity 'lead' is cancelled. Will escalate."
_STARTUP_CUT_SHORT = "Startup activity is only partially executed due to cancellation."
_MEMORY = 10_000


class KopfRecordFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[Any, ...], str] = {}
        self._lock = threading.Lock()
        self._lead_cancelled = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("kopf.") and record.levelno == logging.WARNING:
            message = record.getMessage()
            if message == _LEAD_CANCELLED:
                self._lead_cancelled = True
                return False
            if message == _STARTUP_CUT_SHORT and self._lead_cancelled:
                return False
        ref = getattr(record, "k8s_ref", None)
        for attr in _KOPF_ATTRS:
            if hasattr(record, attr):
                delattr(record, attr)
        if not isinstance(ref, dict):
            return True
        if ref.get("namespace") and not hasattr(record, "namespace"):
            record.namespace = ref.get("namespace")
        if ref.get("name") and not hasattr(record, "object"):
            record.object = f"{ref.get('kind', '')}/{ref.get('name')}".lstrip("/")
        message = record.getMessage()
        if message in _QUIET:
            return False
        key = (ref.get("uid") or (ref.get("namespace"), ref.get("name")), record.name)
        with self._lock:
            if any(marker in message for marker in _REPEATABLE):
                if self._last.get(key) == message:
                    return False
                if len(self._last) >= _MEMORY:
                    self._last.clear()
                self._last[key] = message
            elif "succeeded" in message:
                self._last.pop(key, None)
        return True


def install() -> KopfRecordFilter:
    """Attach one filter to every root handler (call after ``logs.configure``)."""
    log_filter = KopfRecordFilter()
    for handler in logging.getLogger().handlers:
        handler.addFilter(log_filter)
    return log_filter
