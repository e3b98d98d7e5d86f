"""One sweeper per queue: two policies the operator watches that name the same
queue on the same Redis (host, port, database) would run two sweepers with two
budgets over one queue. They race, so neither budget holds. The older policy
(``metadata.creationTimestamp``, then name, then namespace) keeps the queue; each
newer one is ``QueueClaimed``: no sweeper is created for it, and one it already
has is scaled to 0 replicas (kept, not deleted: the operator may not delete
Deployments, and it comes back with the policy's spec once the claim ends).

The claim ends when the older policy is deleted or names another Redis (its URL
or Secret value changed): the status loop checks each refresh
(``StatusLoop._reapply_reason``) and applies the newer policy's sweeper. Memory
only: the policies compared are those this operator has seen.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from stalledpolicy.controller.objects import metadata_of
from stalledpolicy.controller.redis_clients import PolicyKey, RedisConfigError, resolve_url

log = logging.getLogger("stalledpolicy.operator")

Endpoint = tuple[str, int, int]  # host (lower case), port, database


def redis_endpoint(url: str) -> Endpoint | None:
    """The server and database a Redis URL names (redis-py's defaults: port 6379,
    database 0; ``?db=`` when the path has none); None when it cannot be read."""
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").lower()
        port = parts.port or 6379
    except ValueError:
        return None
    if not host:
        return None
    path = unquote(parts.path or "").strip("/")
    db_text = path or dict(parse_qsl(parts.query)).get("db") or "0"
    try:
        db = int(db_text)
    except ValueError:
        return None
    return host, port, db


def policy_endpoint(ctl, namespace: str, spec: Mapping[str, Any]) -> Endpoint | None:
    """The Redis endpoint of a policy's ``spec.redis`` (the Secret's URL through the
    controller's cached reader); None when it cannot be told now (the Secret
    missing, a URL that does not parse, the API down)."""
    try:
        url = resolve_url(namespace, spec.get("redis") or {}, ctl.secrets)
    except RedisConfigError:
        return None
    except Exception:  # noqa: BLE001 - the API server down: no claim can be judged
        return None
    return redis_endpoint(url)


def _age(body: Mapping[str, Any]) -> tuple[str, str, str]:
    """Sort key: older first. A policy without a creation time (never from the
    API server) sorts after any that has one."""
    meta = metadata_of(body)
    return (str(meta.get("creationTimestamp") or "~"), str(meta.get("name") or ""),
            str(meta.get("namespace") or ""))


def claimant(ctl, body: Mapping[str, Any]) -> tuple[PolicyKey, Mapping[str, Any]] | None:
    """``(key, body)`` of the oldest other policy (of those the operator knows, not
    being deleted) that names the same queue on the same Redis endpoint as
    ``body`` and is older than it; None when ``body``'s policy is the oldest, or
    its endpoint cannot be told."""
    meta = metadata_of(body)
    if meta.get("deletionTimestamp"):
        return None
    key = (meta.get("namespace") or "", meta.get("name") or "")
    spec = body.get("spec") or {}
    queue = spec.get("queue")
    if not queue:
        return None
    mine = _age(body)
    rivals = []
    for other_key, state in list(ctl.policies.items()):
        other = state.body
        other_meta = metadata_of(other)
        if other_key == key or other_meta.get("uid") == meta.get("uid") or other_meta.get("deletionTimestamp"):
            continue
        if (other.get("spec") or {}).get("queue") != queue or _age(other) >= mine:
            continue
        rivals.append((_age(other), other_key, other))
    if not rivals:
        return None
    endpoint = policy_endpoint(ctl, key[0], spec)
    if endpoint is None:
        return None
    for _, other_key, other in sorted(rivals, key=lambda r: r[0]):
        if policy_endpoint(ctl, other_key[0], other.get("spec") or {}) == endpoint:
            return other_key, other
    return None


def claimed_message(key: PolicyKey, queue: str, owner: PolicyKey, deployment_note: str) -> str:
    return (f"queue {queue} on this Redis (same host, port and database) is already swept for the older "
            f"StalledPolicy {owner[0]}/{owner[1]}: two sweepers of one queue race and neither budget "
            f"holds, so this policy gets no sweeper{deployment_note}; delete one of the two policies "
            f"(or point one at another Redis). If {owner[0]}/{owner[1]} is deleted, this policy takes "
            "the queue over")


def claimed_queue_waiters(ctl, queue: str) -> list[PolicyKey]:
    """Policies held back by a claim on ``queue`` (to look again at once when a
    policy of that queue is deleted or changed)."""
    from stalledpolicy.controller import events

    return [key for key, state in list(ctl.policies.items())
            if state.outcome is not None and state.outcome.reason == events.QUEUE_CLAIMED
            and (state.body.get("spec") or {}).get("queue") == queue]
