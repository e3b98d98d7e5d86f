"""The queue's figures for a policy's status (the status refresh's first step).

``read_queue`` gives the queue's snapshot, or the ``Problem`` that says why it
could not be read, in words that never show the URL's password;
``endpoint_changed`` tells whether the policy names another Redis than the one
its status figures came from (those figures must then be dropped), with the
judgement of the one-sweeper-per-queue claims (same_redis_server.same_server): one
server named two ways is no change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from stalledpolicy.controller.queue_claims import redis_endpoint
from stalledpolicy.controller.redis_clients import PolicyKey, RedisClients, RedisConfigError, SecretReader, resolve_url
from stalledpolicy.controller.same_redis_server import HostResolver, as_seen_from, same_server
from stalledpolicy.controller.status import Problem
from stalledpolicy.keyspace import InvalidQueueName
from stalledpolicy.redis_url.errors import is_credentials_refusal, refusal_in_our_words
from stalledpolicy.redis_url.redaction import redact_url, scrub


def safe_error(exc: BaseException, url: str | None, *, connected: bool = False) -> str:
    """An exception as text, with the URL's password (if any) never shown; a
    refusal the URL must fix (credentials, a database) in our words.
    ``connected``: Redis has answered on this URL (refusal_in_our_words)."""
    ours = refusal_in_our_words(exc, url, connected=connected) if url else None
    return ours or scrub(f"{type(exc).__name__}: {exc}", url)[:500]


def lanes_of(spec: Mapping[str, Any]) -> list[str]:
    """The lane names ``spec.lanes`` declares (a lane without a name is skipped)."""
    return [lane.get("name") for lane in spec.get("lanes") or [] if lane.get("name")]


def read_queue(key: PolicyKey, spec: Mapping[str, Any], *, secrets: SecretReader, clients: RedisClients,
               snapshot_fn: Callable[..., Any]) -> tuple[Any, Any, Problem | None, str | None]:
    """(client, snapshot, problem, url): exactly one of snapshot/problem is set."""
    import redis  # deferred: redis-py loads only once a Redis is used


    url = None
    try:
        url = resolve_url(key[0], spec.get("redis") or {}, secrets)
        client = clients.client(key, url)
        snapshot = snapshot_fn(client, spec.get("queue"), lanes_of(spec))
        clients.mark_answered(url)
        return client, snapshot, None, url
    except RedisConfigError as exc:
        return None, None, Problem(exc.reason, exc.message), None
    except InvalidQueueName as exc:
        return None, None, Problem("InvalidSpec", f"spec.{exc}"), None
    except redis.ResponseError as exc:
        if url is not None and refusal_in_our_words(exc, url) is None:
            # Redis answered (WRONGTYPE: a key of the queue holds another type;
            # NOPERM: the ACL user may not read it): the connection is fine, and
            # the client is shared by every policy on this Redis: keep it.
            return None, None, Problem(
                "QueueUnreadable",
                f"Redis at {redact_url(url)} refused to read queue {spec.get('queue')}: "
                f"{safe_error(exc, url, connected=True)}; check the queue's keys (`stalledpolicy morgue stats`) "
                "and the Redis user's permissions"), None
        return None, None, _unreachable(key, spec, url, exc, secrets=secrets, clients=clients), None
    except (redis.RedisError, OSError) as exc:
        return None, None, _unreachable(key, spec, url, exc, secrets=secrets, clients=clients), None


def _unreachable(key: PolicyKey, spec: Mapping[str, Any], url: str | None, exc: BaseException, *,
                 secrets: SecretReader, clients: RedisClients) -> Problem:
    """The problem of a Redis that cannot serve us (or a URL it refuses)."""
    clients.invalidate(key)
    ref = (spec.get("redis") or {}).get("secretRef") or {}
    if ref.get("name"):
        # A wrong URL is fixed by editing the Secret: read it again next time.
        secrets.forget(key[0], ref["name"])
    where = redact_url(url) if url else "Redis"
    detail = safe_error(exc, url, connected=bool(url and clients.answered(url)))
    if url and not ref.get("name") and is_credentials_refusal(exc):
        # CREDENTIALS_ADVICE says "put them in the URL": spec.redis.url refuses them.
        detail = ("Redis requires a password (or refused this user/password): spec.redis.url may not "
                  "hold one; put the whole URL, password included, in a Secret and name it in "
                  "spec.redis.secretRef")
    return Problem(failure_reason(exc), f"cannot read queue {spec.get('queue')} at {where}: {detail}")


def failure_reason(exc: BaseException) -> str:
    """The reason of a Redis failure: a refusal of the URL's credentials is no
    outage (Redis answers; the Secret is to fix), as the sweeper's
    stalledpolicy_redis_up says too, so an alert on outages does not fire."""
    return "RedisCredentialsRefused" if is_credentials_refusal(exc) else "RedisUnreachable"


def endpoint_changed(known: tuple[Any, ...] | None, namespace: str, spec: Mapping[str, Any], secrets: SecretReader,
                     hosts: HostResolver) -> tuple[bool, tuple[Any, ...] | None]:
    """(changed, endpoint): whether the policy names another Redis than ``known``, the
    one its status figures were read from (StatusCache.redis_endpoint), and the
    endpoint to remember for the next judgement. Another server or database (host, port,
    database of spec.redis.url, or of the value of the Secret spec.redis.secretRef
    names: new credentials for the same server are no change), or another
    spec.redis whose URL cannot be resolved now. The same spec.redis with a Secret
    unreadable for now is no change.

    The server is judged as the one-sweeper-per-queue claims judge it
    (``same_server`` with ``hosts``, a short host name taken in the policy's
    namespace): ``redis``, ``redis.<namespace>.svc.cluster.local`` and the
    Service's IP are one server, whose figures are kept. It may wait ``hosts.wait`` seconds for a host name's
    first lookup, under the status lock (as the queue's read after it waits for
    Redis); only when the host name was spelt another way, not each refresh."""

    redis_spec = spec.get("redis") or {}
    described = json.dumps(redis_spec, sort_keys=True, default=str)
    try:
        url = resolve_url(namespace, redis_spec, secrets)
        endpoint = redis_endpoint(url)
    except Exception:  # noqa: BLE001 - RedisConfigError, or the API down: not known now
        endpoint = None
    if endpoint is not None:
        endpoint = as_seen_from(namespace, endpoint)
    if known is None:
        return False, (described, endpoint)
    if endpoint is not None and known[1] is not None:
        same = same_server(endpoint, known[1], hosts)
        if same is None:
            # Cannot be told yet (a host name's first lookup still running, or the
            # DNS failing, for a reason that may pass, before any answer): no
            # change, the figures kept, as the claims let nothing move meanwhile.
            # A drop cannot be taken back: the next reading would be a new
            # baseline, so the jobs dead-lettered meanwhile on what is most often
            # the same server (a host spelt another way) would raise no
            # DeadLettered, and until a read succeeds status would show no figures.
            # Waiting is cheap: the endpoint the figures came from is kept (not
            # replaced by this one), so a refresh after the lookup judges again
            # and drops them then if this is another Redis. Meanwhile the old
            # figures may show a little longer, and at most one reading of the
            # new Redis is compared with the old one's (one DeadLettered at worst).
            return False, known
        changed = not same
    else:
        changed = described != known[0]
    return changed, ((described, endpoint) if changed or endpoint is not None else known)
