"""The status loop: each policy's status refreshed on an interval, or at once
after a change (``Controller.refresh``, run by the ``Scheduler``).

A refresh reads the queue, serves a replay the policy's annotation asks for,
writes the status that differs from the one the API server holds (a JSON patch
guarded by the policy's uid), posts the events of what changed, and re-applies
the sweeper when the Secret it reads changed or a drift conflict is over.
``StatusLoop`` is the part of ``Controller`` (runtime.py) that does it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from stalledpolicy.controller import FIELD_MANAGER, GROUP, PLURAL, VERSION, events
from stalledpolicy.controller.config import backoff
from stalledpolicy.controller.objects import asks_for_pods, metadata_of, resource_version, snapshot, sweeper_name
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.redis_clients import PolicyKey, RedisConfigError, resolve_url
from stalledpolicy.controller.replay import (InvalidReplayRequest, replay_message, requested_replay, run_replay,
                                             served_replay, with_served)
from stalledpolicy.controller.status import (CONFIGURATION_REASONS, READY, REDIS_REACHABLE, TRUE,
                                             DeploymentState, Problem, condition_of, desired_status,
                                             status_json_patch, status_patch, utc_now, without_queue_figures)
from stalledpolicy.redis_url.errors import is_credentials_refusal, refusal_in_our_words
from stalledpolicy.redis_url.redaction import redact_url, scrub

log = logging.getLogger("stalledpolicy.operator")


def safe_error(exc: BaseException, url: str | None) -> str:
    """An exception as text, with the URL's password (if any) never shown; a
    refusal the URL must fix (credentials, a database) in our words."""
    ours = refusal_in_our_words(exc, url) if url else None
    return ours or scrub(f"{type(exc).__name__}: {exc}", url)[:500]


class StatusLoop:
    """The status loop's methods of ``Controller``."""

    def refresh(self, key: PolicyKey) -> float | None:
        state = self.policies.get(key)
        if state is None:
            return None
        with state.lock:
            if state.outcome is None:
                return 1.0  # the reconcile handler has not run yet in this process
            if state.drift_conflict:
                from stalledpolicy.controller.drift import drift_conflict_over

                state.drift_resume = drift_conflict_over(self, state, self.clock()) or state.drift_resume
            with self.metrics.refresh_duration.time():
                problem = self._refresh_locked(state)
            if self.policies.get(key) is not state:
                return None
            self.metrics.count_refresh(problem)
            queue_moves = self._note_queue_read(state, problem)
            why = self._reapply_reason(state, problem)
            if problem is None:
                state.failures = 0
                delay = self.config.status_interval
            else:
                state.failures += 1
                delay = backoff(state.failures - 1, self.config.status_interval, self.config.max_backoff)
        if queue_moves:
            self.kick_queue((state.body.get("spec") or {}).get("queue"), key)
        if why is None:
            why = self._claim_reason(state)  # outside the status lock: it may read other policies' Secrets
        if why is not None:
            from stalledpolicy.controller.reapply import reapply
            from stalledpolicy.controller.retry import APPLY_FAILED_FIRST_RETRY

            self._local.refreshing = key
            try:
                reapply(self, key, why)  # outside the status lock: it records its outcome
            finally:
                self._local.refreshing = None
            if state.reapply_failures:
                # Refused again: retry with a growing delay (kopf's own retries grow the same way).
                return backoff(max(0, state.reapply_failures - 1), APPLY_FAILED_FIRST_RETRY,
                               self.config.max_backoff)
            return min(delay, 1.0)  # applied: show the new outcome in status soon
        return delay

    def _note_queue_read(self, state: PolicyState, problem: Problem | None) -> bool:
        """Count the refreshes in a row that could not read the queue (under the status
        lock); True when that may move the queue to or from another policy (the
        policy's first refresh, its claim lost or regained: queue_claims.sweeps)."""
        from stalledpolicy.controller.queue_claims import CLAIM_LOST_AFTER, UNREADABLE_REASONS

        before = (state.refreshed, state.queue_failures >= CLAIM_LOST_AFTER)
        state.refreshed = True
        unreadable = problem is not None and problem.reason in UNREADABLE_REASONS
        state.queue_failures = state.queue_failures + 1 if unreadable else 0
        state.queue_reads = state.queue_reads + 1 if problem is None else 0
        return before != (True, state.queue_failures >= CLAIM_LOST_AFTER)

    def _reapply_reason(self, state: PolicyState, problem: Problem | None) -> str | None:
        """Why the sweeper must be applied again now (under the status lock), or None:
        an earlier re-apply failed; a drift conflict is over (``state.drift_resume``:
        the policy's spec goes back over what the other writer left); the Secret of
        ``spec.redis.secretRef`` holds a new value (a rotated password reaches the
        pods only through a new pod template). A Secret that is missing or holds no
        valid URL rolls nothing: the running pods keep the last good one, the
        condition says what is wrong. The one-sweeper-per-queue checks are
        ``_claim_reason``'s, made by ``refresh`` after the lock is released."""
        if state.reapply_failures:
            return "an earlier re-apply failed"
        if state.drift_resume:
            state.drift_resume = False
            return "the drift conflict is over: the sweeper was left alone"
        outcome = state.outcome
        if outcome is None or not outcome.ok:
            return None  # kopf's handler retries its own failures
        if problem is not None and problem.reason in CONFIGURATION_REASONS:
            return None
        redis_spec = (state.body.get("spec") or {}).get("redis") or {}
        ref = redis_spec.get("secretRef") or {}
        if not ref.get("name") or redis_spec.get("url"):
            return None
        digest = self.secret_digest(state.key[0], ref)
        if digest is None or digest == outcome.secret_digest:
            return None
        return (f"the value of key {ref.get('key') or 'url'!r} in Secret {state.key[0]}/{ref['name']} changed "
                f"(digest {outcome.secret_digest} -> {digest})")

    def _claim_reason(self, state: PolicyState) -> str | None:
        """Why the sweeper must be reconciled again for the one-sweeper-per-queue rule
        (queue_claims.py), or None. Not under the status lock (it may read Secrets).
        A policy that sweeps a queue an older sweeping one holds (an operator start
        sees policies in any order, a Secret's URL may change, the older one may
        sweep again). A policy held back (QueueClaimed) whose claim is over (the
        older policy deleted, stopped sweeping, or on another Redis now), unless its
        own queue cannot be read now (nothing to take over); held by another policy
        now; or whose sweeper asks for pods again. When the claim cannot be told
        (UNKNOWN: an endpoint or an older policy's state not known), nothing moves:
        a sweeper that runs keeps running and a claimed one is never started."""
        from stalledpolicy.controller.queue_claims import CLAIM_LOST_AFTER, CLAIMED, FREE, claim_of

        outcome = state.outcome
        if outcome is None or not (outcome.ok or outcome.reason == events.QUEUE_CLAIMED):
            return None
        claim = claim_of(self, state.body)
        queue = (state.body.get("spec") or {}).get("queue")
        if outcome.ok:
            if claim.verdict != CLAIMED:
                return None
            return f"queue {queue} is claimed by the older StalledPolicy {claim.owner[0]}/{claim.owner[1]}"
        # From an older policy that lost its claim to unreadable reads, only once this
        # one has read the queue for as long: after an outage of a Redis both share,
        # the older one (its failures not yet refreshed away) would otherwise hand the
        # queue to whichever is read first, and both would sweep.
        if (claim.verdict == FREE and not state.queue_failures
                and (not claim.lapsed or state.queue_reads >= CLAIM_LOST_AFTER)):
            return f"queue {queue} is no longer claimed by an older StalledPolicy: this policy takes it over"
        if claim.verdict == CLAIMED and claim.owner != outcome.claimed_by:
            return f"queue {queue} is claimed by the StalledPolicy {claim.owner[0]}/{claim.owner[1]} now"
        deployment = self.deployments.get((state.key[0], sweeper_name(state.key[1])))
        if deployment is not None and asks_for_pods(deployment):
            return f"the sweeper of a policy whose queue {queue} is claimed runs again: scaling it to 0"
        return None

    def _read_queue(self, state: PolicyState, spec: Mapping[str, Any]):
        """(client, snapshot, problem, url): exactly one of snapshot/problem is set."""
        import redis

        from stalledpolicy.keyspace import InvalidQueueName

        url = None
        try:
            url = resolve_url(state.key[0], spec.get("redis") or {}, self.secrets)
            client = self.clients.client(state.key, url)
            lanes = [lane.get("name") for lane in spec.get("lanes") or [] if lane.get("name")]
            return client, self.snapshot_fn(client, spec.get("queue"), lanes), None, url
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
                    f"{safe_error(exc, url)}; check the queue's keys (`stalledpolicy morgue stats`) "
                    "and the Redis user's permissions"), None
            return self._unreachable(state, spec, url, exc)
        except (redis.RedisError, OSError) as exc:
            return self._unreachable(state, spec, url, exc)

    def _unreachable(self, state: PolicyState, spec: Mapping[str, Any], url: str | None, exc: BaseException):
        """(None, None, problem, None) for a Redis that cannot serve us (or a URL it refuses)."""
        self.clients.invalidate(state.key)
        ref = (spec.get("redis") or {}).get("secretRef") or {}
        if ref.get("name"):
            # A wrong URL is fixed by editing the Secret: read it again next time.
            self.secrets.forget(state.key[0], ref["name"])
        where = redact_url(url) if url else "Redis"
        detail = safe_error(exc, url)
        if url and not ref.get("name") and is_credentials_refusal(exc):
            # CREDENTIALS_ADVICE says "put them in the URL": spec.redis.url refuses them.
            detail = ("Redis requires a password (or refused this user/password): spec.redis.url may not "
                      "hold one; put the whole URL, password included, in a Secret and name it in "
                      "spec.redis.secretRef")
        return None, None, Problem("RedisUnreachable",
                                   f"cannot read queue {spec.get('queue')} at {where}: {detail}"), None

    def _refresh_locked(self, state: PolicyState) -> Problem | None:
        body, outcome = state.body, state.outcome
        spec = body.get("spec") or {}
        namespace, name = state.key
        deployment_name = sweeper_name(name)
        deployment = self.deployments.get((namespace, deployment_name))
        if self._endpoint_changed(state, spec):
            # Another Redis: the figures in status are the old one's. Dropped until the
            # new one is read, and no DeadLettered for its morgue's first reading.
            state.status = without_queue_figures(state.status)
        client, snapshot, problem, url = self._read_queue(state, spec)
        now = utc_now()

        if client is not None and problem is None:
            problem, snapshot = self._maybe_replay(state, client, url, spec, snapshot, now)

        previous = state.status or {}
        desired = desired_status(
            previous, outcome=outcome,
            deployment=DeploymentState.from_object(deployment) if deployment else None,
            deployment_name=deployment_name, snapshot=snapshot, problem=problem,
            last_replay=state.unwritten_replay, now=now, drift_conflict=state.drift_conflict)
        stored = previous if state.stored_status is None else state.stored_status
        patch = status_patch(stored, desired)
        if patch is not None:
            if not self._write_status(state, stored, patch):
                return problem or Problem("StatusWriteFailed", "could not write status")
            state.status = state.stored_status = desired
            if state.unwritten_replay is not None:
                self._announce_replay(state, spec, state.unwritten_replay, state.replay_warning)
                state.unwritten_replay = state.replay_warning = None
            self._announce_changes(state, previous, desired, spec)
        self._log_problem(state, problem)
        return problem

    def _endpoint_changed(self, state: PolicyState, spec: Mapping[str, Any]) -> bool:
        """Whether the policy names another Redis than the one its status figures were
        read from (under the status lock): another server or database (host, port,
        database of spec.redis.url, or of the value of the Secret spec.redis.secretRef
        names: new credentials for the same server are no change), or another
        spec.redis whose URL cannot be resolved now. The same spec.redis with a Secret
        unreadable for now is no change."""
        import json

        from stalledpolicy.controller.queue_claims import redis_endpoint

        redis_spec = spec.get("redis") or {}
        described = json.dumps(redis_spec, sort_keys=True, default=str)
        try:
            url = resolve_url(state.key[0], redis_spec, self.secrets)
            endpoint = redis_endpoint(url)
        except Exception:  # noqa: BLE001 - RedisConfigError, or the API down: not known now
            endpoint = None
        known = state.redis_endpoint
        if known is None:
            state.redis_endpoint = (described, endpoint)
            return False
        if endpoint is not None and known[1] is not None:
            changed = endpoint != known[1]
        else:
            changed = described != known[0]
        if changed or endpoint is not None:
            state.redis_endpoint = (described, endpoint)
        return changed

    def _replay_client(self, url: str):
        """A bytes client for one replay (replays are rare): job ids and errors
        need not be UTF-8, and a decoding client fails on the reply after the
        script has moved the jobs. Never resent: a replay that answered late
        would otherwise report its own moves as done by someone else."""
        from stalledpolicy.redis_url.connecting import connect, single_attempt

        timeout = self.config.redis_timeout
        return connect(url, retry=single_attempt(), decode_responses=False, socket_timeout=timeout,
                       socket_connect_timeout=timeout)

    def _maybe_replay(self, state: PolicyState, client, url: str, spec, snapshot, now):
        annotations = (state.body.get("metadata") or {}).get("annotations") or {}
        try:
            request = requested_replay(annotations, [*state.served_tokens, state.refused_token or ""])
        except InvalidReplayRequest as exc:
            token = annotations.get(f"{GROUP}/replay")
            state.refused_token = token  # refused once; a new token asks again
            self.metrics.count_replay("refused")
            self.recorder.post(state.body, events.WARNING, events.REPLAY_FAILED, str(exc))
            log.warning(str(exc), extra={"namespace": state.key[0], "policy": state.key[1]})
            return None, snapshot
        if request is None:
            return None, snapshot
        import redis

        replay_client = None
        try:
            replay_client = self._replay_client(url)
            served = served_replay(replay_client, spec.get("queue"), request)
            if served is None:
                record, warning = run_replay(replay_client, spec.get("queue"), request, now, self.replay_fn)
            else:
                record, warning = served
        except (redis.RedisError, OSError) as exc:
            self.clients.invalidate(state.key)
            self.metrics.count_replay("failed")
            return Problem("RedisUnreachable",
                           f"replay of queue {spec.get('queue')} failed: {safe_error(exc, url)}"), snapshot
        finally:
            if replay_client is not None:
                try:
                    replay_client.close()
                except Exception:  # noqa: BLE001 - a broken connection may fail to close
                    pass
        # Served from now on, whatever happens to the status write; kept in status
        # with the tokens served before it, so none of them replays again.
        state.served_tokens = with_served(state.served_tokens, request.token)
        record = {**record, "servedTokens": list(state.served_tokens)}
        if served is None:
            # Counted by the run that moved the jobs only: a record served from
            # Redis (after a restart) was counted by the process that ran it.
            self.metrics.count_replay("done", int(record.get("replayed") or 0))
        state.unwritten_replay, state.replay_warning = record, warning
        try:
            lanes = [lane.get("name") for lane in spec.get("lanes") or [] if lane.get("name")]
            snapshot = self.snapshot_fn(client, spec.get("queue"), lanes)
        except (redis.RedisError, OSError):
            pass  # the numbers catch up on the next refresh
        return None, snapshot

    def _write_status(self, state: PolicyState, stored: Mapping[str, Any] | None, patch: dict) -> bool:
        from kubernetes.client.exceptions import ApiException

        namespace, name = state.key
        uid = (state.body.get("metadata") or {}).get("uid")
        try:
            written = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, status_json_patch(uid, stored, patch),
                field_manager=FIELD_MANAGER, _content_type="application/json-patch+json")
            if isinstance(written, Mapping) and metadata_of(written).get("uid") == uid and resource_version(written):
                # The policy as our write left it, newer than anything the watch has
                # shown: the watch events until its own (kopf's annotation patch, sent
                # just before the write, arrives after it) are older (_take_body).
                if resource_version(written) != resource_version(state.body):
                    state.seen_versions.append(resource_version(state.body))
                state.body = snapshot(written)
                state.awaited_version, state.awaited_since = resource_version(written), time.monotonic()
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
        from kubernetes.client.exceptions import ApiException

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
        state.stored_status = dict(current.get("status") or {})
        return False

    def _announce_replay(self, state: PolicyState, spec, record: dict, warning: str | None) -> None:
        message = replay_message(spec.get("queue"), record)
        where = {"namespace": state.key[0], "policy": state.key[1]}
        log.info(message, extra={**where, "replayed": record["replayed"]})
        self.recorder.post(state.body, events.NORMAL, events.REPLAYED, message)
        if warning:
            log.warning(warning, extra=where)
            self.recorder.post(state.body, events.WARNING, events.REPLAY_INCOMPLETE, warning)

    def _announce_changes(self, state: PolicyState, previous: dict, desired: dict, spec) -> None:
        before = condition_of(previous, REDIS_REACHABLE)
        after = condition_of(desired, REDIS_REACHABLE)
        if after is not None and (before is None or (before.get("status"), before.get("reason"))
                                  != (after.get("status"), after.get("reason"))):
            if after.get("status") != TRUE:
                self.recorder.post(state.body, events.WARNING, after.get("reason") or events.REDIS_UNREACHABLE,
                                   after.get("message") or "")
            elif before is not None:
                self.recorder.post(state.body, events.NORMAL, events.REDIS_REACHABLE,
                                   f"queue {spec.get('queue')} is readable again")
        grown = events.dead_letter_growth_message(
            spec.get("queue"), previous.get("deadLetters"), desired.get("deadLetters", 0))
        if grown:
            self.recorder.post(state.body, events.WARNING, events.DEAD_LETTERED, grown)
        ready_before, ready_after = condition_of(previous, READY), condition_of(desired, READY)
        if ready_after and (ready_before is None or ready_before.get("status") != ready_after.get("status")):
            log.info("Ready is now %s", ready_after.get("status"), extra={
                "namespace": state.key[0], "policy": state.key[1], "reason": ready_after.get("reason")})

    def _log_problem(self, state: PolicyState, problem: Problem | None) -> None:
        """Log a problem when it appears or changes, and its end; never every retry."""
        if problem == state.logged_problem:
            return
        extra = {"namespace": state.key[0], "policy": state.key[1]}
        if problem is None:
            log.info("queue readable again", extra=extra)
        else:
            log.warning(problem.message, extra={**extra, "reason": problem.reason})
        state.logged_problem = problem
