"""The operator's own settings, shared by ``cli.run`` and the kopf entry module.

``cli.run`` fills them from flags; ``kopf run -m stalledpolicy.controller.main``
(without our CLI) falls back to ``STALLEDPOLICY_OPERATOR_*`` variables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from stalledpolicy.kube_names import is_dns_label, is_dns_subdomain
from stalledpolicy.listen import EVERY_ADDRESS

ENV_PREFIX = "STALLEDPOLICY_OPERATOR_"
# The shortest status interval and retry cap: below a second the status loop
# would read every queue (and retry every failure) in a busy loop.
MIN_LOOP_SECONDS = 1.0
ALLOWED_SWEEPER_IMAGES_ENV = ENV_PREFIX + "ALLOWED_SWEEPER_IMAGES"
METRICS_PORT_ENV = ENV_PREFIX + "METRICS_PORT"
METRICS_ADDRESS_ENV = ENV_PREFIX + "METRICS_ADDRESS"
LIVENESS_ENV = ENV_PREFIX + "LIVENESS"
LEADER_LEASE_ENV = ENV_PREFIX + "LEADER_LEASE"


def check_metrics_port(text: str) -> int:
    """A TCP port, or 0 (no metrics server); ValueError saying what is wrong."""
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"{text!r}: must be a port number (0 turns the metrics server off)") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: must be between 0 (off) and 65535")
    return port


_IMAGE_CHARACTERS = re.compile(r"[A-Za-z0-9._/:@-]*")


def parse_lease(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of the leader election's Lease; ValueError saying what
    is wrong. Pure, as everything the arguments are checked with: the kubernetes
    client must not load before ``--kubeconfig`` is in the environment (it reads
    ``KUBECONFIG`` once, when imported)."""
    namespace, _, name = text.partition("/")
    if not is_dns_label(namespace) or not is_dns_subdomain(name):
        raise ValueError(f"{text!r}: give the Lease as NAMESPACE/NAME, for example "
                         "stalledpolicy-system/stalledpolicy-operator (lowercase names)")
    return namespace, name


def check_image_pattern(entry: str) -> str:
    """One entry of ``allowed_sweeper_images``, as given; ValueError saying what is wrong.
    An entry is an exact image reference, or a prefix ending in ``*``
    (``registry.example/team/*``); a lone ``*`` allows any image."""
    if not entry:
        raise ValueError("an entry is empty")
    if "*" in entry[:-1]:
        raise ValueError(f"{entry!r}: '*' is allowed only at the end (a prefix, e.g. registry.example/team/*)")
    if not _IMAGE_CHARACTERS.fullmatch(entry.rstrip("*")):
        # the chart's schema allows the same characters (Helm's regex \s is ASCII only)
        raise ValueError(f"{entry!r}: an image reference holds only letters, digits and . _ / : @ - "
                         "(no whitespace or comma)")
    if entry != "*" and entry.endswith("*") and entry[-2] not in "/:@":
        # registry.example* would also allow registry.example.evil.io/...
        raise ValueError(f"{entry!r}: a prefix ends at a '/', ':' or '@' before its '*' "
                         "(registry.example/team/*, registry.example/sweeper:*)")
    return entry


def image_allowed(image: str, patterns: tuple[str, ...] | list[str], own_image: str) -> bool:
    """``image`` is the operator's own sweeper image, or listed in ``patterns`` (exact,
    or a prefix written with a trailing ``*``; ``*`` alone: any image). Plain string
    comparison: ``img:1`` does not allow ``docker.io/library/img:1``."""
    if image == own_image:
        return True
    for pattern in patterns:
        if pattern.endswith("*"):
            if image.startswith(pattern[:-1]):
                return True
        elif image == pattern:
            return True
    return False


@dataclass(frozen=True)
class OperatorConfig:
    sweeper_image: str | None = None
    # Images a policy may set as spec.sweeper.image besides the operator's own
    # sweeper image (exact references, or prefixes ending in "*"; "*": any).
    # Empty: only the operator's own. The sweeper gets the policy's Redis Secret,
    # so an image of the policy author's choosing could read that Secret.
    allowed_sweeper_images: tuple[str, ...] = ()
    # Seconds between two status reads of one policy's queue.
    status_interval: float = 10.0
    # Cap of the retry delay after an error (Redis down, Secret missing, name clash).
    max_backoff: float = 300.0
    # A Secret read is reused this long before it is read again.
    secret_ttl: float = 30.0
    status_workers: int = 8
    redis_timeout: float = 2.0
    # Deadline of each call of the operator's own Kubernetes client (applies, status
    # writes, Secret reads, events): a connection the API server stops answering on
    # must not hold a status worker or a handler thread for ever.
    api_timeout: float = 30.0
    # The operator's own /metrics (controller/metrics.py). 0: not served. Off by
    # default on the command line (several operators run by hand or in tests would
    # clash on one port); the chart turns it on (operator.metricsPort, 8081).
    metrics_port: int = 0
    # Every address (IPv4 and IPv6), as the sweeper's: stalledpolicy.listen.
    metrics_address: str = EVERY_ADDRESS
    # kopf's liveness endpoint, served by controller/liveness.py (--liveness). None: not served.
    liveness: str | None = None
    # The Lease of leader election, "namespace/name" (controller/leader.py): several
    # replicas, one acting. None: no election, this process acts at once.
    leader_lease: str | None = None
    lease_seconds: float = 15.0

    @property
    def handler_workers(self) -> int:
        """Threads kopf runs the reconcile handlers in."""
        return max(4, self.status_workers)

    @property
    def api_connections(self) -> int:
        """Every handler thread and status worker may hold one API connection at once."""
        return self.handler_workers + self.status_workers

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
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

        def patterns() -> tuple[str, ...]:
            raw = (env.get(ALLOWED_SWEEPER_IMAGES_ENV) or "").strip()
            if not raw:
                return ()
            try:
                return tuple(check_image_pattern(entry.strip()) for entry in raw.split(","))
            except ValueError as exc:
                raise SystemExit(f"{ALLOWED_SWEEPER_IMAGES_ENV}={raw!r}: {exc} "
                                 "(comma-separated image references or prefixes ending in '*')") from None

        def metrics_port() -> int:
            raw = (env.get(METRICS_PORT_ENV) or "").strip()
            if not raw:
                return defaults.metrics_port
            try:
                return check_metrics_port(raw)
            except ValueError as exc:
                raise SystemExit(f"{METRICS_PORT_ENV}={raw!r}: {exc}") from None

        return cls(
            sweeper_image=env.get(ENV_PREFIX + "SWEEPER_IMAGE") or None,
            allowed_sweeper_images=patterns(),
            status_interval=number("STATUS_INTERVAL", defaults.status_interval, MIN_LOOP_SECONDS),
            max_backoff=number("MAX_BACKOFF", defaults.max_backoff, MIN_LOOP_SECONDS),
            secret_ttl=number("SECRET_TTL", defaults.secret_ttl),
            status_workers=int(number("STATUS_WORKERS", defaults.status_workers)),
            redis_timeout=number("REDIS_TIMEOUT", defaults.redis_timeout),
            api_timeout=number("API_TIMEOUT", defaults.api_timeout),
            metrics_port=metrics_port(),
            metrics_address=(env.get(METRICS_ADDRESS_ENV) or "").strip() or defaults.metrics_address,
            liveness=(env.get(LIVENESS_ENV) or "").strip() or None,
            leader_lease=(env.get(LEADER_LEASE_ENV) or "").strip() or None,
            lease_seconds=number("LEASE_SECONDS", defaults.lease_seconds, 3.0),
        )

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_PREFIX + "STATUS_INTERVAL": str(self.status_interval),
            ENV_PREFIX + "MAX_BACKOFF": str(self.max_backoff),
            ENV_PREFIX + "SECRET_TTL": str(self.secret_ttl),
            ENV_PREFIX + "STATUS_WORKERS": str(self.status_workers),
            ENV_PREFIX + "REDIS_TIMEOUT": str(self.redis_timeout),
            ENV_PREFIX + "API_TIMEOUT": str(self.api_timeout),
            METRICS_PORT_ENV: str(self.metrics_port),
            METRICS_ADDRESS_ENV: self.metrics_address,
            ENV_PREFIX + "LEASE_SECONDS": str(self.lease_seconds),
        }
        if self.leader_lease:
            env[LEADER_LEASE_ENV] = self.leader_lease
        if self.sweeper_image:
            env[ENV_PREFIX + "SWEEPER_IMAGE"] = self.sweeper_image
        if self.liveness:
            env[LIVENESS_ENV] = self.liveness
        if self.allowed_sweeper_images:
            env[ALLOWED_SWEEPER_IMAGES_ENV] = ",".join(self.allowed_sweeper_images)
        return env


def backoff(failures: int, base: float, cap: float) -> float:
    """Delay before retry number ``failures`` (0-based): doubles from ``base`` up to ``cap``."""
    return min(cap, base * float(2 ** min(max(failures, 0), 30)))
