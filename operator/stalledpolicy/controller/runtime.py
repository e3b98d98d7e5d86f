"""The operator's memory: the ``Controller``.

kopf feeds it (every policy and sweeper Deployment event, every apply's outcome);
its ``Scheduler`` runs ``sync`` (sync.py) for a policy key when a trigger enqueues
it and after the delay the last sync returned. docs/architecture.md has the loop,
the triggers and each policy's state (``PolicyState``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from stalledpolicy.controller import GROUP, PLURAL, VERSION, drift_reverts, events, status_cache
from stalledpolicy.controller.apply import policy_owner
from stalledpolicy.controller.apply_requests import ApplyRequest, PendingApplies
from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.metrics import OperatorMetrics
from stalledpolicy.controller.objects import (
    RetiredUids,
    created_before,
    generation_of,
    metadata_of,
    newer_deployment,
    policy_key,
    snapshot,
)
from stalledpolicy.controller.policy_state import PolicyState, ReplayState
from stalledpolicy.controller.redis_clients import (
    PolicyKey,
    RedisClients,
    SecretReader,
    secret_digest,
)
from stalledpolicy.controller.replay import served_tokens
from stalledpolicy.controller.replay_serving import wants_replay
from stalledpolicy.controller.retry import Retries
from stalledpolicy.controller.same_redis_server import HostResolver
from stalledpolicy.controller.scheduler import Scheduler
from stalledpolicy.controller.status import SWEEPER_IN_SYNC, ReconcileOutcome, condition_of
from stalledpolicy.controller.status_refresh import StatusRefresh
from stalledpolicy.controller.sync import sync as sync_policy

log = logging.getLogger("stalledpolicy.operator")


class Controller:
    def __init__(self, config: OperatorConfig, *, apps: Any, core: Any, custom: Any, recorder: Any,
                 secrets: SecretReader, clients: RedisClients,
                 snapshot_fn: Callable[..., Any] | None = None,
                 replay_fn: Callable[..., Any] | None = None,
                 metrics: OperatorMetrics | None = None) -> None:
        self.config = config
        self.apps, self.core, self.custom = apps, core, custom
        self.recorder = recorder
        self.secrets = secrets
        self.clients = clients
        self.redis_hosts = HostResolver()  # one Redis named two ways is one Redis (queue_claims)
        if snapshot_fn is None:
            from stalledpolicy.engine import queue_snapshot  # deferred: the engine imports redis-py

            snapshot_fn = queue_snapshot
        self.snapshot_fn: Callable[..., Any] = snapshot_fn
        self.replay_fn = replay_fn
        self.policies: dict[PolicyKey, PolicyState] = {}
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        # The keys of self.policies by spec.queue (immutable), under self._lock: the
        # one-sweeper-per-queue checks look at a queue's policies, not at every one.
        self._queues: dict[str, set[PolicyKey]] = {}
        self._retired_policies = RetiredUids()
        self._retired_deployments = RetiredUids()
        self._lock = threading.Lock()
        self.scheduler: Scheduler[PolicyKey] | None = None
        # The key this thread syncs: what the sync does must not kick that key again
        # (the scheduler would rerun it at once; sync returns its own next delay).
        self._local = threading.local()
        self.pending_applies = PendingApplies()  # what the triggers ask sync to apply
        self.retries = Retries(config.max_backoff)  # the applies' (the one retry policy: retry.py)
        self.read_retries = Retries(config.max_backoff)  # the status refreshes' that found a problem
        self.stopped = False
        self.clock = time.time  # wall clock of the drift budget (its times outlive the process)
        self.metrics = metrics or OperatorMetrics()  # a registry per Controller: tests read their own
        self.metrics.count_policies(lambda: len(self.policies))

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self.scheduler = Scheduler(self.sync, workers=self.config.status_workers,
                                   on_lag=self.metrics.loop_lag.observe)

    def stop(self) -> None:
        self.stopped = True
        if self.scheduler is not None:
            self.scheduler.stop()
        self.pending_applies.release_all()  # kopf's handlers waiting on them go
        self.clients.close_all()

    def sync(self, key: PolicyKey) -> float | None:
        """One sync of the policy ``key`` (sync.py); the delay before the next."""
        self._local.syncing = key
        try:
            return sync_policy(self, key)
        finally:
            self._local.syncing = None

    def kick(self, key: PolicyKey) -> None:
        """Enqueue ``key``: its sync runs now (or right after the one under way)."""
        if getattr(self._local, "syncing", None) == key:
            return  # from within its own sync, which returns its next delay itself
        if self.scheduler is not None:
            self.scheduler.kick(key)

    def request_apply(self, key: PolicyKey, request: ApplyRequest) -> None:
        """A trigger's request: pending until the next sync of ``key``, which is enqueued."""
        if self.stopped:
            request.taken.set()  # no sync will take it
            return
        self.pending_applies.add(key, request)
        self.kick(key)

    def request_policy_apply(self, body: Mapping[str, Any], request: ApplyRequest) -> None:
        """``request_apply`` for the policy ``body`` (kopf's handlers): its state made
        first, so that the sync finds the policy even before its watch event."""
        state = self.get_or_create_state(body)
        with state.lock:
            status_cache.take_body(state, snapshot(body))
        if self.policies.get(state.key) is state:
            self.request_apply(state.key, request)
        else:
            request.taken.set()  # a deleted policy's: nothing to apply

    # -- what kopf tells us --------------------------------------------------
    def known_state(self, body: Mapping[str, Any]) -> PolicyState | None:
        """The state of the policy ``body`` (its name and uid) if it is known; memory only."""
        state = self.policies.get(policy_key(body))
        if state is None or metadata_of(state.body).get("uid") != metadata_of(body).get("uid"):
            return None
        return state

    def get_or_create_state(self, body: Mapping[str, Any]) -> PolicyState:
        """The state of the policy ``body``, made (and kept) when its uid is new under
        its name: for the events that may show a policy first (its watch event, kopf's
        handlers). A policy deleted since (its uid retired) gets a state of its own,
        never kept. When another uid holds the name, the one that came later keeps
        it (``_came_after``, which may ask the API server, outside the lock)."""
        key = policy_key(body)
        uid = metadata_of(body).get("uid")
        judged: tuple[PolicyState, bool] | None = None  # (the state judged, whether ``body`` came after it)
        while True:
            with self._lock:
                state = self.policies.get(key)
                if uid in self._retired_policies:
                    # A deleted policy of this name (kopf handles each uid in a stream of
                    # its own, so its late events may come after its successor's).
                    return PolicyState(key=key, body=snapshot(body))
                if state is not None and metadata_of(state.body).get("uid") == uid:
                    return state
                if state is not None and judged is not None and judged[0] is state:
                    if not judged[1]:
                        self._retired_policies.add(uid)
                        return PolicyState(key=key, body=snapshot(body))
                    self._retired_policies.add(metadata_of(state.body).get("uid"))
                    state = None  # deleted and created again under the same name
                if state is None:
                    return self._keep_new_state(key, body)
            judged = (state, self._came_after(key, body, state.body))

    def _keep_new_state(self, key: PolicyKey, body: Mapping[str, Any]) -> PolicyState:
        """A new policy's state, from the status it carries (under self._lock)."""
        first = snapshot(body)
        state = PolicyState(key=key, body=first, status_cache=status_cache.first_seen(first))
        status = state.status_cache.status or {}
        state.replay = ReplayState(served=served_tokens(status.get("lastReplay")))
        drift_reverts.conflict_from_status(state, condition_of(status, SWEEPER_IN_SYNC),
                                           generation_of(first), self.clock())
        replaced = self.policies.get(key)
        if replaced is not None:
            self._unindex(replaced)
            self.read_retries.forget(key)  # its refreshes' failures were another policy's
        self.policies[key] = state
        self._queues.setdefault(_queue_of(first), set()).add(key)
        return state

    def _came_after(self, key: PolicyKey, body: Mapping[str, Any], known: Mapping[str, Any]) -> bool:
        """Whether the policy ``body`` came after ``known``, another policy that held
        the same name: the one the API server holds under that name now is the
        latest (neither: ``body`` is gone too, its state does not matter); without an
        answer, the one created later. Two objects' resourceVersions tell nothing."""
        from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

        try:
            current = self.custom.get_namespaced_custom_object(GROUP, VERSION, key[0], PLURAL, key[1])
            return metadata_of(current).get("uid") == metadata_of(body).get("uid")
        except ApiException as exc:
            if exc.status == 404:
                return False
        except Exception:  # noqa: BLE001 - API server down: judge by the creation times
            pass
        # Created in the same second (or times missing): a uid never seen is most
        # likely the new one (the old one's state was made from its earlier events).
        return created_before(body, known) is not True

    def observe_policy(self, body: Mapping[str, Any], event_type: str | None) -> None:
        key = policy_key(body)
        queue = (body.get("spec") or {}).get("queue")
        if event_type == "DELETED":
            self.forget(key, (body.get("metadata") or {}).get("uid"))
            self.kick_queue(queue, key)  # a policy it held back may take the queue over
            return
        state = self.get_or_create_state(body)
        with state.lock:
            before = generation_of(state.body)
            status_cache.take_body(state, snapshot(body))
            respecified = generation_of(state.body) != before
            replay_asked = wants_replay(state)
        if (replay_asked or respecified) and state.outcome is not None:
            self.kick(key)  # its sync serves the replay, or applies the new generation
        if respecified:
            self.kick_queue(queue, key)  # it may name another Redis now, or stop sweeping

    def _unindex(self, state: PolicyState) -> None:
        """Drop ``state``'s key from the queue index (under self._lock)."""
        keys = self._queues.get(_queue_of(state.body))
        if keys is not None:
            keys.discard(state.key)
            if not keys:
                self._queues.pop(_queue_of(state.body), None)

    def queue_policies(self, queue: str) -> list[PolicyState]:
        """The states of the policies of ``queue``."""
        with self._lock:
            return [self.policies[key] for key in self._queues.get(queue, ()) if key in self.policies]

    def kick_queue(self, queue: str | None, but: PolicyKey | None = None) -> None:
        """Refresh now the other policies of ``queue``: a change of one policy (deleted,
        another Redis, sweeping or not) may give its queue to another or take it back
        (their refresh looks at the claim again: queue_claims.claim_reconcile_reason)."""
        if queue:
            for state in self.queue_policies(queue):
                if state.key != but:
                    self.kick(state.key)

    def forget(self, key: PolicyKey, uid: str | None = None) -> None:
        """Drop a deleted policy; with ``uid``, only if the name still belongs to
        that policy (not to one created since under the same name), and that uid's
        later events are ignored."""
        with self._lock:
            if uid is not None:
                self._retired_policies.add(uid)
            state = self.policies.get(key)
            if uid is not None and state is not None and (state.body.get("metadata") or {}).get("uid") != uid:
                return
            popped = self.policies.pop(key, None)
            if popped is not None:
                self._unindex(popped)
            # Under the lock: a policy created again under this name, on another
            # thread, would otherwise lose its first refresh (or its new client).
            if self.scheduler is not None:
                self.scheduler.remove(key)
            self.pending_applies.forget(key)
            self.retries.forget(key)
            self.read_retries.forget(key)
            self.clients.drop(key)

    def observe_deployment(self, body: Mapping[str, Any], event_type: str | None = None, *,
                           read: bool = False) -> PolicyKey | None:
        """Remember a sweeper Deployment's state, from the watch or (``read``) from our
        own read or apply; returns its policy's key when we know it."""
        meta = body.get("metadata") or {}
        dkey = (meta.get("namespace") or "", meta.get("name") or "")
        with self._lock:
            known = self.deployments.get(dkey)
            if event_type == "DELETED":
                self._retired_deployments.add(meta.get("uid"))
                if known is None or metadata_of(known).get("uid") == meta.get("uid"):
                    self.deployments.pop(dkey, None)
            elif newer_deployment(body, known, read, self._retired_deployments):
                if read and known is not None and metadata_of(known).get("uid") != meta.get("uid"):
                    self._retired_deployments.add(metadata_of(known).get("uid"))
                self.deployments[dkey] = snapshot(body)
        owner = policy_owner(body)
        if owner is None:
            return None
        key = (dkey[0], owner.get("name"))
        if key in self.policies:
            self.kick(key)
            return key
        return None

    def record_outcome(self, body: Mapping[str, Any], outcome: ReconcileOutcome, *, announce: bool = True) -> None:
        """The outcome of an apply of the known policy ``body``. ``announce`` False: a
        changed outcome is neither logged as a warning nor posted as an event (it says
        again what the policy's status already says)."""
        self.metrics.count_reconcile(outcome)  # every reconcile ends here, whatever its result
        state = self.known_state(body)
        if state is None:
            return  # deleted meanwhile (or another policy holds its name now): recorded nowhere
        with state.lock:
            before = state.outcome
            state.outcome = outcome
            if outcome.ok:
                drift_reverts.applied(state)
            status_cache.take_body(state, snapshot(body))
        changed = before is None or (before.ok, before.reason, before.message) != (
            outcome.ok, outcome.reason, outcome.message)
        if before is None or changed or (before.suspended, before.replicas) != (outcome.suspended, outcome.replicas):
            # Sweeping or not may have changed: the queue may move to or from another policy.
            self.kick_queue(_queue_of(state.body), state.key)
        if changed:
            extra = {"namespace": state.key[0], "policy": state.key[1],
                     "generation": outcome.generation, "reason": outcome.reason}
            if not announce:
                log.info("policy status kept as recorded: " + outcome.message, extra=extra)
            elif outcome.ok:
                log.info("policy reconciled", extra=extra)
                if before is not None and before.reason == events.QUEUE_CLAIMED:
                    # the QueueClaimed Warning said "no sweeper": say that it ended
                    self.recorder.post(state.body, events.NORMAL, events.QUEUE_RELEASED,
                                       events.queue_released_message(_queue_of(state.body), before.claimed_by))
            elif outcome.reason == events.OLD_SWEEPER_DELETING:
                # Expected after a delete and create again: news, not a warning.
                log.info(outcome.message, extra=extra)
                self.recorder.post(state.body, events.NORMAL, outcome.reason, outcome.message)
            else:
                log.warning(outcome.message, extra=extra)
                self.recorder.post(state.body, events.WARNING, outcome.reason, outcome.message)
        self.kick(state.key)

    def secret_digest(self, namespace: str, ref: Mapping[str, Any]) -> str | None:
        """redis_clients.secret_digest, with this Controller's Secret reader."""
        return secret_digest(self.secrets, namespace, ref)

    def status_refresh(self) -> StatusRefresh:
        """The status refresh (status_refresh.py), given this Controller's parts as they are now."""
        return StatusRefresh(
            config=self.config, custom=self.custom, recorder=self.recorder, secrets=self.secrets,
            clients=self.clients, redis_hosts=self.redis_hosts, metrics=self.metrics,
            snapshot_fn=self.snapshot_fn, replay_fn=self.replay_fn, deployments=self.deployments,
            clock=self.clock, is_current=lambda state: self.policies.get(state.key) is state, forget=self.forget,
            retries=self.read_retries)


def _queue_of(body: Mapping[str, Any]) -> str:
    return str((body.get("spec") or {}).get("queue") or "")
