"""The EchoMQ keyspace: the one place where key names are built.

Every key of queue ``q`` is ``emq:{q}:<type>``; the braces are a Redis Cluster
hash tag, so all keys of a queue share one slot and one Lua script may touch
them all. See ``shared/echomq-wire.md`` (the contract).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from stalledpolicy.tables import shown

QUEUE_NAME_MAX = 128
# The CRD's rule (declared on policy.models.StalledPolicySpec.queue): ^[^{}:\s\p{Z}\p{Cc}]+$.
# No hash-tag braces and no key separator (they would let a queue name escape
# its slot or forge another queue's keys), no whitespace, no Unicode separator
# (category Z: spaces, line and paragraph separators) and no control character
# (Cc). Every character Python calls whitespace is in Z or Cc, and so is every
# one of RE2's \s, so this is the CRD's set exactly. Lone surrogates (Cs, what
# undecodable bytes of a command line become) are refused too: they are not
# text, so no CRD value can hold one.
_FORBIDDEN_CHARACTERS = "{}:"
_FORBIDDEN_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cs")
# A lane (EchoMQ group) name: the queue's rule, and no ',' or '=' either (the
# CRD's spec.lanes[].name rule: lanes reach the sweeper as "name=budget,...").
LANE_NAME_MAX = 128
_LANE_FORBIDDEN_CHARACTERS = _FORBIDDEN_CHARACTERS + ",="


class InvalidQueueName(ValueError):
    pass


class InvalidLaneName(ValueError):
    pass


def _describe(ch: str) -> str:
    category = unicodedata.category(ch)
    if ch in _LANE_FORBIDDEN_CHARACTERS:
        return repr(ch)
    kind = {"Cc": "a control character", "Cs": "an undecodable byte"}.get(category, "whitespace")
    return f"{ch!r} (U+{ord(ch):04X}, {kind})"


def _check_name(name: str, field: str, limit: int, forbidden: str, names: str, error: type[ValueError]) -> str:
    """The rule a queue and a lane name share, for a non-empty string: at most
    ``limit`` characters, none of ``forbidden``, no whitespace or control
    character. ``error``'s message starts ``<field>: `` and says what ``names``
    may not contain, the characters listed from ``forbidden`` itself."""
    if len(name) > limit:
        raise error(f"{field}: at most {limit} characters (got {len(name)})")
    for ch in name:
        if ch in forbidden or unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            listed = ", ".join(repr(c) for c in forbidden)
            raise error(f"{field}: {shown(name, limit, quoted=True)} contains {_describe(ch)}; {names} may not "
                        f"contain {listed}, whitespace or control characters")
    return name


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidQueueName("queue: must be a non-empty string")
    return _check_name(name, "queue", QUEUE_NAME_MAX, _FORBIDDEN_CHARACTERS, "EchoMQ queue names", InvalidQueueName)


def validate_lane_name(name: str) -> str:
    """``name`` when it may name a lane; else InvalidLaneName, its message
    starting ``lane: `` (as validate_queue_name's starts ``queue: ``)."""
    if not isinstance(name, str):
        raise InvalidLaneName("lane: must be a string")
    if not name:
        raise InvalidLaneName("lane: must not be empty; give the lane (EchoMQ group) name")
    return _check_name(name, "lane", LANE_NAME_MAX, _LANE_FORBIDDEN_CHARACTERS, "lane (EchoMQ group) names",
                       InvalidLaneName)


@dataclass(frozen=True)
class QueueKeys:
    """Key names of one EchoMQ queue."""

    queue: str

    def __post_init__(self) -> None:
        validate_queue_name(self.queue)

    @property
    def prefix(self) -> str:
        return f"emq:{{{self.queue}}}:"

    def _k(self, suffix: str) -> str:
        return self.prefix + suffix

    @property
    def pending(self) -> str:
        return self._k("pending")

    @property
    def active(self) -> str:
        return self._k("active")

    @property
    def schedule(self) -> str:
        return self._k("schedule")

    @property
    def dead(self) -> str:
        return self._k("dead")

    @property
    def ring(self) -> str:
        return self._k("ring")

    @property
    def gactive(self) -> str:
        return self._k("gactive")

    @property
    def glimit(self) -> str:
        return self._k("glimit")

    @property
    def paused(self) -> str:
        return self._k("paused")

    @property
    def wake(self) -> str:
        return self._k("wake")

    @property
    def events(self) -> str:
        return self._k("events")

    @property
    def metrics_failed(self) -> str:
        return self._k("metrics:failed")

    @property
    def metrics_completed(self) -> str:
        return self._k("metrics:completed")

    @property
    def sweeper_totals(self) -> str:
        """Our own hash (not EchoMQ's): sweeper-owned totals shared by all replicas."""
        return self._k("sweeper:totals")

    @property
    def sweeper_holds(self) -> str:
        """Our own sorted set: leases the sweep holds in their last moments, each
        scored with its real deadline (scripts/lib/holds.lua)."""
        return self._k("sweeper:holds")

    @property
    def sweeper_hold_tokens(self) -> str:
        """Our own hash: a held lease's job -> its ``attempts`` when it was held."""
        return self._k("sweeper:hold-tokens")

    @property
    def sweeper_last_replay(self) -> str:
        """Our own string: the operator's last served replay token and its result (JSON)."""
        return self._k("sweeper:last-replay")

    def fixed_keys(self) -> tuple[str, ...]:
        """The queue's keys that name no job nor lane: a queue EchoMQ or a sweeper
        has ever used has one of them."""
        return (self.pending, self.active, self.schedule, self.dead, self.ring, self.gactive, self.glimit,
                self.paused, self.wake, self.metrics_failed, self.metrics_completed, self.sweeper_totals,
                self.sweeper_holds, self.sweeper_hold_tokens)

    def job(self, job_id: str) -> str:
        return self._k(f"job:{job_id}")

    def lane_pending(self, group: str) -> str:
        return self._k(f"g:{group}:pending")
