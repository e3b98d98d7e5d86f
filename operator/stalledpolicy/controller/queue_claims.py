"""One sweeper per queue: two policies the operator watches that name the same
queue on the same Redis (server, port, database; one server may be named two
ways: same_redis_server.py) would run two sweepers with two budgets over one queue.
They race, so neither budget holds. Of the policies of a queue and Redis that
sweep, the oldest (``metadata.creationTimestamp``, then name, then namespace)
keeps the queue; each newer one is ``QueueClaimed``: no sweeper is created for
it, and one it already has is scaled to 0 replicas (kept, not deleted: the
operator may not delete Deployments, and it comes back with the policy's spec
once the claim ends).

Only a policy that sweeps holds a claim (``sweeps``): reconciled with a sweeper
that asks for pods (not suspended, spec.sweeper.replicas above 0; after a failed
reconcile, its last applied sweeper still running), whose Secret or URL gives a
Redis URL or whose sweeper has a pod available (pods keep the URL they started
with), and its queue read by the last refreshes (CLAIM_LOST_AFTER in a row that
cannot read it end the claim). The
claim ends when the older policy stops sweeping, is deleted or names another
Redis: the status loop checks each refresh (``claim_reconcile_reason``). When
the older one sweeps again it takes the queue back: a policy's claim depends only
on older policies, never on newer ones, so there is no loop to flap in; the claim
moves only when the older policy's own state changes, and a Redis outage shorter
than CLAIM_LOST_AFTER refreshes moves nothing.

Each verdict is one of three (``Claim``): the queue is free, claimed by a known
older policy, or unknown (an endpoint that cannot be resolved now, an older
policy not yet reconciled or refreshed by this process, a host name not looked up
yet): then whatever holds stays (a claimed policy stays claimed, a running sweeper
runs) and no sweeper is started. Memory only: the policies compared are those
this operator has seen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from stalledpolicy.controller import events
from stalledpolicy.controller.apply import policy_owner
from stalledpolicy.controller.objects import asks_for_pods, metadata_of, sweeper_name
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.redis_clients import PolicyKey, RedisConfigError, resolve_url
from stalledpolicy.controller.same_redis_server import Endpoint, as_seen_from, same_server
from stalledpolicy.controller.status import NO_URL_REASONS, Problem
from stalledpolicy.redis_url.validation import url_database

if TYPE_CHECKING:  # for the annotations only: runtime imports this module
    from stalledpolicy.controller.runtime import Controller

log = logging.getLogger("stalledpolicy.operator")

# Refreshes in a row that cannot read a policy's queue before it holds no claim
# (a blip of a Redis both policies share moves nothing).
CLAIM_LOST_AFTER = 3
# Refresh problems that mean a policy's sweeper cannot sweep either. Not the
# configuration reasons (a Secret gone or blank, a bad URL): they roll nothing, and
# the running pods keep sweeping with the URL they started with.
UNREADABLE_REASONS = frozenset({"RedisUnreachable", "RedisCredentialsRefused", "QueueUnreadable"})

FREE, CLAIMED, UNKNOWN = "free", "claimed", "unknown"


@dataclass(frozen=True)
class Claim:
    """``verdict``: FREE (no older policy sweeps the queue on this Redis), CLAIMED
    (``owner`` does), UNKNOWN (cannot be told now; ``owner``: the older policy
    that could not be judged). ``lapsed``: an older policy of the queue holds no
    claim only because its queue could not be read lately (it may sweep again as
    soon as it is read)."""

    verdict: str
    owner: PolicyKey | None = None
    lapsed: bool = False
    #: UNKNOWN because this policy's own Redis URL cannot be had: what is wrong with
    #: its Secret or URL (the message to lead with: fixing it is the user's next step)
    misconfigured: str | None = None


def redis_endpoint(url: str) -> Endpoint | None:
    """The server and database a Redis URL connects to (redis-py's defaults:
    port 6379, database 0; the database as redis-py reads it, ``?db=`` over
    the path); None when it cannot be read."""
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").lower()
        port = parts.port or 6379
        db = url_database(url)
    except ValueError:
        return None
    if not host:
        return None
    return host, port, db


def policy_endpoint(ctl: Controller, namespace: str, spec: Mapping[str, Any]) -> tuple[Endpoint | None, str | None]:
    """(endpoint, misconfigured): the Redis endpoint of a policy's ``spec.redis``
    (the Secret's URL through the controller's cached reader), a short host name
    taken in the policy's namespace (``as_seen_from``). None when it cannot be told
    now: unknown, never "another Redis"; ``misconfigured`` then says what is wrong
    with the policy's own Secret or URL (missing, blank, a URL naming no server),
    None when the reason is the API server being down."""
    try:
        url = resolve_url(namespace, spec.get("redis") or {}, ctl.secrets)
    except RedisConfigError as exc:
        return None, exc.message
    except Exception:  # noqa: BLE001 - the API server down: no claim can be judged
        return None, None
    endpoint = redis_endpoint(url)
    if endpoint is None:
        return None, "the Redis URL names no server"
    return as_seen_from(namespace, endpoint), None


def own_sweeper(ctl: Controller, state: PolicyState) -> Mapping[str, Any] | None:
    """The policy's sweeper Deployment as last seen, if it is this policy's (its uid)."""
    namespace, name = state.key
    deployment = ctl.deployments.get((namespace, sweeper_name(name)))
    owner = policy_owner(deployment) if deployment is not None else None
    if deployment is None or owner is None or owner.get("uid") != metadata_of(state.body).get("uid"):
        return None
    return deployment


def _pods_available(ctl: Controller, state: PolicyState) -> bool:
    """Whether a pod of the policy's own sweeper Deployment is available now."""
    deployment = own_sweeper(ctl, state)
    return deployment is not None and int((deployment.get("status") or {}).get("availableReplicas") or 0) > 0


def _age(body: Mapping[str, Any]) -> tuple[str, str, str]:
    """Sort key: older first. A policy without a creation time (never from the
    API server) sorts after any that has one."""
    meta = metadata_of(body)
    return (str(meta.get("creationTimestamp") or "~"), str(meta.get("name") or ""),
            str(meta.get("namespace") or ""))


def sweeps(ctl: Controller, state: PolicyState) -> bool | None:
    """Whether the policy of ``state`` sweeps its queue, as last seen: None when this
    process cannot tell yet (not reconciled, or its queue not read, since start)."""
    outcome = state.outcome
    if outcome is None:
        return None
    if outcome.ok:
        if outcome.suspended or outcome.replicas == 0:
            return False
    elif outcome.reason == events.QUEUE_CLAIMED:
        return False
    else:
        # Not applied (InvalidSpec, ApplyFailed, ...): its last applied sweeper, if it
        # still runs, sweeps on.
        deployment = own_sweeper(ctl, state)
        if deployment is None or not asks_for_pods(deployment):
            return False
    if state.claim.read_failures >= CLAIM_LOST_AFTER:
        return False
    if state.claim.misconfigured and not _pods_available(ctl, state):
        # Its Secret or URL gives no Redis URL, and no pod of its sweeper runs (none
        # can start without one): holding the queue would leave it swept by no one.
        # Pods still running keep the URL they started with: they sweep on.
        return False
    if not state.claim.refreshed:
        return None
    return True


def note_queue_read(state: PolicyState, problem: Problem | None) -> bool:
    """Count the refreshes in a row that could not read the queue (under the status
    lock); True when that may move the queue to or from another policy (the
    policy's first refresh, its claim lost or regained: ``sweeps``)."""
    before = (state.claim.refreshed, state.claim.read_failures >= CLAIM_LOST_AFTER, state.claim.misconfigured)
    state.claim.refreshed = True
    unreadable = problem is not None and problem.reason in UNREADABLE_REASONS
    state.claim.read_failures = state.claim.read_failures + 1 if unreadable else 0
    state.claim.reads = state.claim.reads + 1 if problem is None else 0
    state.claim.misconfigured = problem is not None and problem.reason in NO_URL_REASONS
    return before != (True, state.claim.read_failures >= CLAIM_LOST_AFTER, state.claim.misconfigured)


_UNSET: Any = object()


def claim_of(ctl: Controller, body: Mapping[str, Any], _verdicts: dict[PolicyKey, str] | None = None) -> Claim:
    """Whether an older policy (of those the operator knows, not being deleted) that
    sweeps (``sweeps``) names the same queue on the same Redis server and database
    as ``body`` (``same_server``): the oldest such one is the ``owner``. Reads
    Secrets (cached, maybe the API) and may wait a moment for a host name's lookup:
    never call it holding a policy's status lock. ``_verdicts``: the verdicts of
    older policies already judged in this call (``_takes_over_next``), by key: a
    policy's claim depends only on older ones, so each is judged once (without
    it, N held-back policies cost 2^N judgements)."""
    verdicts: dict[PolicyKey, str] = {} if _verdicts is None else _verdicts
    meta = metadata_of(body)
    if meta.get("deletionTimestamp"):
        return Claim(FREE)
    key = (meta.get("namespace") or "", meta.get("name") or "")
    spec = body.get("spec") or {}
    queue = spec.get("queue")
    if not queue:
        return Claim(FREE)
    mine = _age(body)
    rivals = []
    for state in ctl.queue_policies(queue):
        other = state.body
        other_meta = metadata_of(other)
        if state.key == key or other_meta.get("uid") == meta.get("uid") or other_meta.get("deletionTimestamp"):
            continue
        if (other.get("spec") or {}).get("queue") != queue or _age(other) >= mine:
            continue
        rivals.append((_age(other), state))
    unknown = None
    lapsed = False
    endpoint, misconfigured = _UNSET, None
    for _, state in sorted(rivals, key=lambda r: r[0]):
        sweeping = sweeps(ctl, state)
        if sweeping is False and _takes_over_next(ctl, state, verdicts):
            # An older policy held back until now, whose claim has just ended: it
            # takes the queue at its next check. Waiting for it keeps this one from
            # taking the queue at the same moment (both sweepers would start).
            sweeping = None
        if sweeping is False:
            lapsed = lapsed or state.claim.read_failures >= CLAIM_LOST_AFTER
            continue
        if endpoint is _UNSET:
            endpoint, misconfigured = policy_endpoint(ctl, key[0], spec)
        theirs = None if endpoint is None else policy_endpoint(ctl, state.key[0], state.body.get("spec") or {})[0]
        same = None if theirs is None else same_server(endpoint, theirs, ctl.redis_hosts)
        if same is False:
            continue  # another Redis
        if same is None or sweeping is None:
            unknown = unknown or state.key
            continue
        return Claim(CLAIMED, state.key)
    return Claim(FREE, lapsed=lapsed) if unknown is None else Claim(UNKNOWN, unknown,
                                                                    misconfigured=misconfigured)


def _takes_over_next(ctl: Controller, state: PolicyState, verdicts: dict[PolicyKey, str]) -> bool:
    """Whether a policy held back (QueueClaimed) finds its queue free now and so
    takes it over at its next check (as ``claim_reconcile_reason`` decides; its
    own claim depends only on policies older than it: no cycle). ``verdicts``
    memoizes the judgements of one top-level ``claim_of``."""
    outcome = state.outcome
    if outcome is None or outcome.ok or outcome.reason != events.QUEUE_CLAIMED or state.claim.read_failures:
        return False
    if state.key not in verdicts:
        verdicts[state.key] = claim_of(ctl, state.body, verdicts).verdict
    return verdicts[state.key] == FREE


def claim_reconcile_reason(ctl: Controller, state: PolicyState) -> str | None:
    """Why the sweeper must be reconciled again for the one-sweeper-per-queue rule,
    or None. Not under the status lock (it may read Secrets).
    A policy that sweeps a queue an older sweeping one holds (an operator start
    sees policies in any order, a Secret's URL may change, the older one may
    sweep again). A policy held back (QueueClaimed) whose claim is over (the
    older policy deleted, stopped sweeping, or on another Redis now), unless its
    own queue cannot be read now (nothing to take over); held by another policy
    now; or whose sweeper asks for pods again. When the claim cannot be told
    (UNKNOWN: an endpoint or an older policy's state not known), nothing moves:
    a sweeper that runs keeps running and a claimed one is never started."""
    outcome = state.outcome
    if outcome is None or not (outcome.ok or outcome.reason == events.QUEUE_CLAIMED):
        return None
    claim = claim_of(ctl, state.body)
    queue = (state.body.get("spec") or {}).get("queue")
    if outcome.ok:
        if claim.verdict != CLAIMED or claim.owner is None:  # CLAIMED names its owner
            return None
        return f"queue {queue} is claimed by the older StalledPolicy {claim.owner[0]}/{claim.owner[1]}"
    # From an older policy that lost its claim to unreadable reads, only once this
    # one has read the queue for as long: after an outage of a Redis both share,
    # the older one (its failures not yet refreshed away) would otherwise hand the
    # queue to whichever is read first, and both would sweep.
    if (claim.verdict == FREE and not state.claim.read_failures
            and (not claim.lapsed or state.claim.reads >= CLAIM_LOST_AFTER)):
        return f"queue {queue} is no longer claimed by an older StalledPolicy: this policy takes it over"
    if claim.verdict == CLAIMED and claim.owner is not None and claim.owner != outcome.claimed_by:
        return f"queue {queue} is claimed by the StalledPolicy {claim.owner[0]}/{claim.owner[1]} now"
    deployment = ctl.deployments.get((state.key[0], sweeper_name(state.key[1])))
    if deployment is not None and asks_for_pods(deployment):
        return f"the sweeper of a policy whose queue {queue} is claimed runs again: scaling it to 0"
    return None


def owner_text(key: PolicyKey, owner: PolicyKey | None) -> str:
    """The older policy as a condition or event of ``key``'s policy may name it:
    never by name from another namespace (whose policies its readers may not see)."""
    if owner is None:
        return "an older StalledPolicy"
    if owner[0] != key[0]:
        return "an older StalledPolicy in another namespace (kubectl get stalledpolicies -A)"
    return f"the older StalledPolicy {owner[0]}/{owner[1]}"


def claimed_message(key: PolicyKey, queue: str, owner: PolicyKey | None, deployment_note: str, *,
                    owner_confirmed: bool = True, misconfigured: str | None = None) -> str:
    """``owner_confirmed`` False: Claim UNKNOWN, and no claim recorded before
    (``owner``, if any, is the older policy that cannot be judged); ``misconfigured``:
    what is wrong with this policy's own Secret or URL, the reason it cannot be told."""
    if misconfigured:
        return (f"{misconfigured}; until it is fixed this policy gets no sweeper{deployment_note}: with no Redis "
                f"URL it cannot be told whether queue {queue} is on the Redis where {owner_text(key, owner)} "
                "sweeps it (its pods would start as soon as the Secret is fixed, a second sweeper of that queue)")
    if not owner_confirmed or owner is None:
        return (f"queue {queue} may be swept for {owner_text(key, owner)} on this Redis, which cannot be told "
                "now (that policy's state or Redis is not known yet: an operator start, the API server or a "
                "Secret unreadable, a host name not looked up yet; or its Secret or URL is wrong while its "
                "sweeper still runs): this policy gets no "
                f"sweeper{deployment_note} until it can be told")
    return (f"queue {queue} on this Redis (the same server, port and database) is already swept for "
            f"{owner_text(key, owner)}: two sweepers of one queue race and neither budget holds, so this "
            f"policy gets no sweeper{deployment_note}; delete one of the two policies (or point one at another "
            "Redis). This policy takes the queue over when that one stops sweeping (deleted, suspended, "
            "spec.sweeper.replicas 0, no sweeper running, or its queue unreadable "
            f"{CLAIM_LOST_AFTER} refreshes in a row)")
