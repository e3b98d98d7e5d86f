"""The status part of ``sync`` (``StatusRefresh.refresh``).

A refresh reads the queue, serves a replay the policy's annotation asks for,
writes the status that differs from the one the API server holds (a JSON patch
guarded by the policy's uid), posts the events of what changed, and says why the
sweeper must be applied again (the Secret it reads changed, a drift conflict is
over): sync applies it. It is given what it uses; docs/architecture.md, "The loop".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from stalledpolicy.controller import FIELD_MANAGER, GROUP, PLURAL, VERSION, drift_reverts, events, status_cache
from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.metrics import OperatorMetrics
from stalledpolicy.controller.objects import sweeper_name
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.queue_claims import note_queue_read
from stalledpolicy.controller.queue_figures import endpoint_changed, lanes_of, read_queue
from stalledpolicy.controller.redis_clients import PolicyKey, RedisClients, SecretReader, secret_digest
from stalledpolicy.controller.replay_serving import announce_replay, serve_requested_replay, take_written
from stalledpolicy.controller.retry import Retries
from stalledpolicy.controller.same_redis_server import HostResolver
from stalledpolicy.controller.status import (
    CONFIGURATION_REASONS,
    NO_URL_REASONS,
    READY,
    REDIS_REACHABLE,
    TRUE,
    DeploymentState,
    Problem,
    condition_of,
    utc_now,
)
from stalledpolicy.controller.status_document import (
    desired_status,
    status_json_patch,
    status_patch,
)

log = logging.getLogger("stalledpolicy.operator")
# Configuration problems a refresh finds with an answer of the API server (not
# SecretUnreadable: the API server itself may be down, so that one backs off).
RECHECKED_AT_INTERVAL = NO_URL_REASONS | {"InvalidSpec"}


class Refreshed(NamedTuple):
    """What a refresh tells sync: the delay before the next refresh, why the sweeper
    must be applied again (None: it need not), and whether the refresh may have
    moved the policy's queue to or from another policy (queue_claims.note_queue_read)."""

    delay: float
    why: str | None
    queue_moves: bool


@dataclass(frozen=True)
class StatusRefresh:
    """The status refresh, given what it uses (Controller.status_refresh makes one per sync)."""

    config: OperatorConfig
    custom: Any  # kubernetes CustomObjectsApi: the status writes
    recorder: Any  # events.EventRecorder
    secrets: SecretReader
    clients: RedisClients
    redis_hosts: HostResolver
    metrics: OperatorMetrics
    snapshot_fn: Callable[..., Any]  # engine.queue_snapshot
    replay_fn: Callable[..., Any] | None
    deployments: Mapping[tuple[str, str], dict[str, Any]]  # the sweeper Deployments last seen
    clock: Callable[[], float]  # the drift budget's wall clock
    is_current: Callable[[PolicyState], bool]  # the state is still its policy's (not forgotten)
    forget: Callable[[PolicyKey, str | None], None]  # a policy found deleted
    # the refreshes in a row that found a problem: the next waits the status interval
    # doubled per failure, up to max_backoff (Controller.read_retries)
    retries: Retries

    def refresh(self, state: PolicyState) -> Refreshed | None:
        """The status part of ``sync``: read the queue, serve a replay the policy asks
        for, write the status that differs, post the events of what changed. None
        when the policy is gone. The one-sweeper-per-queue reasons to apply are
        sync's to ask (queue_claims.claim_reconcile_reason), after this."""
        posts = events.DeferredPosts()  # the events this refresh decides, posted after the lock
        with posts.flushed_to(self.recorder), state.lock:
            drift_reverts.check_window(state, self.clock())
            with self.metrics.refresh_duration.time():
                problem = self._refresh_locked(state, posts)
            if not self.is_current(state):
                return None
            self.metrics.count_refresh(problem)
            queue_moves = note_queue_read(state, problem)
            why = self._reapply_reason(state, problem)
            delay = self.config.status_interval
            if problem is None:
                self.retries.succeeded(state.key)
            else:
                backoff = self.retries.failed(state.key, self.config.status_interval)
                # A problem a user fixes (a Secret created, a URL corrected), not
                # waiting, is looked at again every interval (a Secret read, at most a
                # connection), not after a backoff of up to max_backoff.
                if problem.reason not in RECHECKED_AT_INTERVAL:
                    delay = backoff
        return Refreshed(delay, why, queue_moves)

    def _reapply_reason(self, state: PolicyState, problem: Problem | None) -> str | None:
        """Why the sweeper must be applied again now (under the status lock), or None:
        a drift conflict is over (``drift_reverts.take_resume``: the policy's spec goes back
        over what the other writer left); the Secret of ``spec.redis.secretRef``
        holds a new value (a rotated password reaches the pods only through a new
        pod template). A Secret that is missing or holds no valid URL rolls
        nothing: the running pods keep the last good one, the condition says what
        is wrong. The one-sweeper-per-queue checks are
        queue_claims.claim_reconcile_reason's, made after the lock is released."""
        if drift_reverts.take_resume(state):
            return "the drift conflict is over: the sweeper was left alone"
        outcome = state.outcome
        if outcome is None or not outcome.ok:
            return None  # a failed apply is retried by sync's backoff
        if problem is not None and problem.reason in CONFIGURATION_REASONS:
            return None
        redis_spec = (state.body.get("spec") or {}).get("redis") or {}
        ref = redis_spec.get("secretRef") or {}
        if not ref.get("name") or redis_spec.get("url"):
            return None
        digest = secret_digest(self.secrets, state.key[0], ref)
        if digest is None or digest == outcome.secret_digest:
            return None
        return (f"the value of key {ref.get('key') or 'url'!r} in Secret {state.key[0]}/{ref['name']} changed "
                f"(digest {outcome.secret_digest} -> {digest})")

    def _refresh_locked(self, state: PolicyState, posts: events.DeferredPosts) -> Problem | None:
        body, outcome = state.body, state.outcome
        assert outcome is not None, "sync refreshes a policy applied (or held) by this process only"
        spec = body.get("spec") or {}
        queue = str(spec.get("queue") or "")
        namespace, name = state.key
        deployment_name = sweeper_name(name)
        deployment = self.deployments.get((namespace, deployment_name))
        changed, endpoint = endpoint_changed(state.status_cache.redis_endpoint, namespace, spec, self.secrets,
                                             self.redis_hosts)
        status_cache.endpoint_read(state, endpoint, changed)
        client, snapshot, problem, url = read_queue(state.key, spec, secrets=self.secrets, clients=self.clients,
                                                    snapshot_fn=self.snapshot_fn)
        now = utc_now()

        if client is not None and problem is None and url is not None:
            problem, snapshot = serve_requested_replay(
                state, url, queue, snapshot, now,
                read_snapshot=lambda: self.snapshot_fn(client, spec.get("queue"), lanes_of(spec)),
                replay_fn=self.replay_fn, redis_timeout=self.config.redis_timeout,
                clients=self.clients, metrics=self.metrics, recorder=posts)

        previous = state.status_cache.status or {}
        desired = desired_status(
            previous, outcome=outcome,
            deployment=DeploymentState.from_object(deployment) if deployment else None,
            deployment_name=deployment_name, snapshot=snapshot, problem=problem,
            last_replay=state.replay.unwritten[-1][0] if state.replay.unwritten else None, now=now,
            drift_conflict=state.drift.conflict, drift_reverting=state.drift.reverting)
        stored = previous if state.status_cache.stored is None else state.status_cache.stored
        patch = status_patch(stored, desired)
        if patch is not None:
            if not self._write_status(state, stored, patch, desired):
                return problem or Problem("StatusWriteFailed", "could not write status")
            for record, warning in take_written(state):
                announce_replay(posts, state, queue, record, warning)
            self._announce_changes(state, previous, desired, queue, posts)
        self._log_problem(state, problem)
        return problem

    def _write_status(self, state: PolicyState, stored: Mapping[str, Any] | None, patch: dict[str, Any],
                      desired: dict[str, Any]) -> bool:
        """Patch the status from ``stored`` to ``desired`` (``patch``, the difference);
        False when it was not written."""
        from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

        namespace, name = state.key
        uid = (state.body.get("metadata") or {}).get("uid")
        try:
            written = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, status_json_patch(uid, stored, patch),
                field_manager=FIELD_MANAGER, _content_type="application/json-patch+json")
            status_cache.written(state, desired, written, uid)
            return True
        except ApiException as exc:
            if exc.status == 404:
                self.forget(state.key, uid)
                return False
            if exc.status == 422 and self._status_target_gone(state, uid):
                return False
            self._log_problem(state, Problem("StatusWriteFailed",
                                             f"status patch refused: HTTP {exc.status} {exc.reason}"))
            return False
        except Exception as exc:  # noqa: BLE001 - API server down: retry on the next refresh
            self._log_problem(state, Problem("StatusWriteFailed", f"status patch failed: {type(exc).__name__}"))
            return False

    def _status_target_gone(self, state: PolicyState, uid: str | None) -> bool:
        """After a 422 to a status patch (a failed ``test`` of ``metadata.uid`` says no
        more than that): True, and ``state`` forgotten, when the policy of that uid
        is gone (the name is free, or a policy created since holds it: never write
        its status). Otherwise the status this policy holds now is read back, so
        the next patch is made against it (one the patch could not add to)."""
        from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

        namespace, name = state.key
        try:
            current = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                return False
            current = None
        except Exception:  # noqa: BLE001 - API server down: the caller reports the refusal
            return False
        if current is None or (current.get("metadata") or {}).get("uid") != uid:
            log.info("status not written: the policy was deleted (its name may belong to a new policy)",
                     extra={"namespace": namespace, "policy": name, "uid": uid})
            self.forget(state.key, uid)
            return True
        status_cache.read_back(state, current.get("status"))
        return False

    def _announce_changes(self, state: PolicyState, previous: dict[str, Any], desired: dict[str, Any], queue: str,
                          posts: events.DeferredPosts) -> None:
        before = condition_of(previous, REDIS_REACHABLE)
        after = condition_of(desired, REDIS_REACHABLE)
        if after is not None and (before is None or (before.get("status"), before.get("reason"))
                                  != (after.get("status"), after.get("reason"))):
            if after.get("status") != TRUE:
                posts.post(state.body, events.WARNING, after.get("reason") or events.REDIS_UNREACHABLE,
                                   after.get("message") or "")
            elif before is not None:
                posts.post(state.body, events.NORMAL, events.REDIS_REACHABLE,
                                   f"queue {queue} is readable again")
        grown = events.dead_letter_growth_message(
            queue, previous.get("deadLetters"), desired.get("deadLetters", 0))
        if grown:
            posts.post(state.body, events.WARNING, events.DEAD_LETTERED, grown)
        uncounted = events.uncounted_lapses_message(
            queue, previous.get("uncountedLapsesTotal"), desired.get("uncountedLapsesTotal", 0))
        if uncounted:
            posts.post(state.body, events.WARNING, events.LAPSES_UNCOUNTED, uncounted)
        ready_before, ready_after = condition_of(previous, READY), condition_of(desired, READY)
        if ready_after and (ready_before is None or ready_before.get("status") != ready_after.get("status")):
            log.info("Ready is now %s", ready_after.get("status"), extra={
                "namespace": state.key[0], "policy": state.key[1], "reason": ready_after.get("reason")})

    def _log_problem(self, state: PolicyState, problem: Problem | None) -> None:
        """Log a problem when it appears or changes, and its end; never every retry."""
        if not status_cache.problem_changed(state, problem):
            return
        extra = {"namespace": state.key[0], "policy": state.key[1]}
        if problem is None:
            log.info("queue readable again", extra=extra)
        else:
            log.warning(problem.message, extra={**extra, "reason": problem.reason})
