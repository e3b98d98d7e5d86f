"""The operator's own settings, shared by ``cli.run`` and the kopf entry module.

``cli.run`` fills them from flags; ``kopf run -m stalledpolicy.controller.main``
(without our CLI) falls back to ``STALLEDPOLICY_OPERATOR_*`` variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_PREFIX = "STALLEDPOLICY_OPERATOR_"
# The shortest status interval and retry cap: below a second the status loop
# would read every queue (and retry every failure) in a busy loop.
MIN_LOOP_SECONDS = 1.0


@dataclass(frozen=True)
class OperatorConfig:
    sweeper_image: str | None = None
    # Seconds between two status reads of one policy's queue.
    status_interval: float = 10.0
    # Cap of the retry delay after an error (Redis down, Secret missing, name clash).
    max_backoff: float = 300.0
    # A Secret read is reused this long before it is read again.
    secret_ttl: float = 30.0
    status_workers: int = 8
    redis_timeout: float = 2.0

    @property
    def handler_workers(self) -> int:
        """Threads kopf runs the reconcile handlers in."""
        return max(4, self.status_workers)

    @property
    def api_connections(self) -> int:
        """Every handler thread and status worker may hold one API connection at once."""
        return self.handler_workers + self.status_workers

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> "OperatorConfig":
        env = os.environ if environ is None else environ
        defaults = cls()

        def number(name: str, default: float, minimum: float | None = None) -> float:
            raw = env.get(ENV_PREFIX + name)
            if raw in (None, ""):
                return default
            try:
                value = float(raw)
            except ValueError:
                raise SystemExit(f"{ENV_PREFIX + name}={raw!r}: must be a number of seconds") from None
            if minimum is not None and value < minimum:
                raise SystemExit(f"{ENV_PREFIX + name}={raw!r}: must be at least {minimum:g}s")
            if value <= 0:
                raise SystemExit(f"{ENV_PREFIX + name}={raw!r}: must be greater than 0")
            return value

        return cls(
            sweeper_image=env.get(ENV_PREFIX + "SWEEPER_IMAGE") or None,
            status_interval=number("STATUS_INTERVAL", defaults.status_interval, MIN_LOOP_SECONDS),
            max_backoff=number("MAX_BACKOFF", defaults.max_backoff, MIN_LOOP_SECONDS),
            secret_ttl=number("SECRET_TTL", defaults.secret_ttl),
            status_workers=int(number("STATUS_WORKERS", defaults.status_workers)),
            redis_timeout=number("REDIS_TIMEOUT", defaults.redis_timeout),
        )

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_PREFIX + "STATUS_INTERVAL": str(self.status_interval),
            ENV_PREFIX + "MAX_BACKOFF": str(self.max_backoff),
            ENV_PREFIX + "SECRET_TTL": str(self.secret_ttl),
            ENV_PREFIX + "STATUS_WORKERS": str(self.status_workers),
            ENV_PREFIX + "REDIS_TIMEOUT": str(self.redis_timeout),
        }
        if self.sweeper_image:
            env[ENV_PREFIX + "SWEEPER_IMAGE"] = self.sweeper_image
        return env


def backoff(failures: int, base: float, cap: float) -> float:
    """Delay before retry number ``failures`` (0-based): doubles from ``base`` up to ``cap``."""
    return min(cap, base * (2 ** min(max(failures, 0), 30)))
