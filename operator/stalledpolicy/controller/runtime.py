"""The operator's memory and its status loop.

kopf feeds it (every policy and sweeper Deployment event, every reconcile
outcome); a ``Scheduler`` refreshes each policy's status on an interval, or
at once after a change. The status subresource has one writer, this module,
and a per-policy lock, so the reconcile handlers and the status workers never
write over each other's conditions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from stalledpolicy.controller import FIELD_MANAGER, GROUP, PLURAL, VERSION, events
from stalledpolicy.controller.apply import policy_owner
from stalledpolicy.controller.config import OperatorConfig, backoff
from stalledpolicy.controller.metrics import OperatorMetrics
from stalledpolicy.controller.redis_clients import (
    PolicyKey, RedisClients, RedisConfigError, SecretReader, resolve_url, secret_value_digest)
from stalledpolicy.controller.replay import (
    InvalidReplayRequest, replay_message, requested_replay, run_replay, served_replay)
from stalledpolicy.controller.scheduler import Scheduler
from stalledpolicy.controller.status import (
    CONFIGURATION_REASONS, FALSE, READY, REDIS_REACHABLE, SWEEPER_IN_SYNC, TRUE, DeploymentState, Problem,
    ReconcileOutcome,
    condition_of, desired_status, status_json_patch, status_patch, utc_now)
from stalledpolicy.redis_url import redact_url, refusal_in_our_words, scrub

log = logging.getLogger("stalledpolicy.operator")


def plain(value: Any) -> Any:
    """kopf's bodies are mapping views; keep plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def snapshot(body: Mapping[str, Any]) -> dict:
    """A plain copy of an object to keep in memory, without ``managedFields``
    (about half of each object, never read here)."""
    copy = plain(body)
    (copy.get("metadata") or {}).pop("managedFields", None)
    return copy


def policy_key(body: Mapping[str, Any]) -> PolicyKey:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


# Kubernetes resourceVersions are opaque: only two versions of the same object may
# be compared, and only for equality. What this module needs to order, it orders
# by other means: one object's watch events arrive in order; a version seen once and
# since replaced is older than the current one; ``metadata.generation`` grows with
# each spec change of one object; of two objects that held one name, the one created
# earlier was deleted before the other was created.

# Versions of one policy kept to recognise an older one delivered again (kopf's
# handler body, a watch event re-sent): a few reconciles' worth of events.
SEEN_VERSIONS = 32
# Seconds a status write of ours waits for the watch to deliver its version; the
# watch does so in milliseconds, so it was missed (a relist): trust the watch again.
WRITE_ECHO_TIMEOUT = 30.0
# Uids of deleted (or replaced) objects remembered: their late events are ignored.
RETIRED_UIDS = 4096


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return _meta(obj).get("resourceVersion")


def _generation(obj: Mapping[str, Any] | None) -> int:
    return int(_meta(obj).get("generation") or 0)


def _created_before(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool | None:
    """Whether ``one`` was created before ``other`` (two objects that held the same
    name, one after the other); None when their creation times cannot tell
    (missing, or within the same second: the API keeps seconds)."""
    a, b = _meta(one).get("creationTimestamp"), _meta(other).get("creationTimestamp")
    if not a or not b or a == b:
        return None
    return str(a) < str(b)  # RFC 3339 UTC, one format: text order is time order


class _Retired:
    """Uids of deleted objects, the most recent RETIRED_UIDS (uids are never reused)."""

    def __init__(self, size: int = RETIRED_UIDS) -> None:
        self._uids: dict[str, None] = {}
        self._size = size

    def add(self, uid: str | None) -> None:
        if uid:
            self._uids.pop(uid, None)
            self._uids[uid] = None
            while len(self._uids) > self._size:
                self._uids.pop(next(iter(self._uids)))

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


def _newer_deployment(body: Mapping[str, Any], known: Mapping[str, Any] | None, read: bool,
                      retired: _Retired) -> bool:
    """Whether ``body`` tells more about a sweeper Deployment than ``known`` (the
    one remembered under its name). One object: its watch events arrive in order,
    a read or apply of ours is newer only with a newer ``metadata.generation`` (its
    equal is no newer than the watch, which goes on from there; a status seen
    since would be lost). Another object of that name: not a deleted one, nor
    one created before ``known``."""
    uid = _meta(body).get("uid")
    if known is None:
        return read or uid not in retired
    if _meta(known).get("uid") == uid:
        if read:
            return _generation(body) > _generation(known)
        return _generation(body) >= _generation(known)
    if read:
        return True  # what the API server holds now
    return uid not in retired and _created_before(body, known) is not True


def sweeper_name(policy_name: str) -> str:
    from stalledpolicy.policy.builder import sweeper_name as name

    return name(policy_name)


def safe_error(exc: BaseException, url: str | None) -> str:
    """An exception as text, with the URL's password (if any) never shown; a
    refusal the URL must fix (credentials, a database) in our words."""
    ours = refusal_in_our_words(exc, url) if url else None
    return ours or scrub(f"{type(exc).__name__}: {exc}", url)[:500]


@dataclass
class PolicyState:
    key: PolicyKey
    body: dict
    lock: threading.RLock = field(default_factory=threading.RLock)
    outcome: ReconcileOutcome | None = None
    status: dict | None = None  # as last written (or first seen)
    # as the API server holds it, as far as we know: what we wrote, or what a
    # newer watch event shows (someone else's edit); the status patch is made
    # against it, so a status edited or wiped by hand is written back
    stored_status: dict | None = None
    # resourceVersions of this policy seen and since replaced (newest last): a body
    # carrying one of them is older than ``body``.
    seen_versions: deque = field(default_factory=lambda: deque(maxlen=SEEN_VERSIONS))
    # The version our last status write made, until the watch delivers it: the
    # watch events before it are older than the body that write returned.
    awaited_version: str | None = None
    awaited_since: float = 0.0
    failures: int = 0
    logged_problem: Problem | None = None
    served_token: str | None = None
    unwritten_replay: dict | None = None  # a replay done whose record is not in status yet
    replay_warning: str | None = None  # what that replay left undone, announced with it
    # One reconcile (apply) of this policy at a time: kopf's handlers, the
    # re-applies after drift or deletion, and the status loop's after a Secret change.
    apply_lock: threading.RLock = field(default_factory=threading.RLock)
    # Failed re-applies outside kopf in a row: the status loop tries again, its delay growing with it.
    reapply_failures: int = 0
    # Drift reverts of the last DRIFT_WINDOW seconds (wall-clock times, also recorded on
    # the Deployment); past DRIFT_MAX_REVERTS another writer is fighting us: no more
    # reverts until the sweeper has been left alone a while. ``drift_conflict`` is the
    # DriftConflict message meanwhile (the SweeperInSync condition, kept in status, so
    # a restarted operator goes on not reverting).
    drift_reverts: list = field(default_factory=list)
    drift_conflict: str | None = None
    drift_last_seen: float | None = None
    drift_seen_generation: int = 0
    drift_resume: bool = False  # the conflict is over: the status loop applies the spec again


class Controller:
    def __init__(self, config: OperatorConfig, *, apps, core, custom, recorder,
                 secrets: SecretReader, clients: RedisClients,
                 snapshot_fn: Callable[..., Any] | None = None,
                 replay_fn: Callable[..., Any] | None = None,
                 metrics: OperatorMetrics | None = None) -> None:
        self.config = config
        self.apps, self.core, self.custom = apps, core, custom
        self.recorder = recorder
        self.secrets = secrets
        self.clients = clients
        if snapshot_fn is None:
            from stalledpolicy.engine import queue_snapshot as snapshot_fn
        self.snapshot_fn = snapshot_fn
        self.replay_fn = replay_fn
        self.policies: dict[PolicyKey, PolicyState] = {}
        self.deployments: dict[tuple[str, str], dict] = {}
        self._retired_policies = _Retired()
        self._retired_deployments = _Retired()
        self._lock = threading.Lock()
        self.scheduler: Scheduler | None = None
        # The key the status loop is refreshing on this thread: a re-apply it runs
        # must not kick that key again (the scheduler would rerun it at once, and
        # a refused re-apply would then be retried with no delay at all).
        self._local = threading.local()
        self.clock = time.time  # wall clock of the drift budget (its times outlive the process)
        self.metrics = metrics or OperatorMetrics()  # a registry per Controller: tests read their own
        self.metrics.count_policies(lambda: len(self.policies))

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self.scheduler = Scheduler(self.refresh, workers=self.config.status_workers,
                                   on_lag=self.metrics.loop_lag.observe)

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        self.clients.close_all()

    def _kick(self, key: PolicyKey) -> None:
        if getattr(self._local, "refreshing", None) == key:
            return  # the status loop's own re-apply: refresh() returns the next delay itself
        if self.scheduler is not None:
            self.scheduler.kick(key)

    # -- what kopf tells us --------------------------------------------------
    def state(self, body: Mapping[str, Any]) -> PolicyState:
        key = policy_key(body)
        uid = _meta(body).get("uid")
        verdict = None  # (the state asked about, whether ``body`` came after its policy)
        while True:
            with self._lock:
                state = self.policies.get(key)
                if uid in self._retired_policies:
                    # A deleted policy of this name (kopf handles each uid in a stream of
                    # its own, so its late events may come after its successor's): a
                    # state of its own, never the successor's, and never kept.
                    return PolicyState(key=key, body=snapshot(body))
                if state is not None and _meta(state.body).get("uid") != uid:
                    if verdict is None or verdict[0] is not state:
                        pass  # ask below, outside the lock (it may ask the API server)
                    elif verdict[1]:
                        self._retired_policies.add(_meta(state.body).get("uid"))
                        state = None  # deleted and created again under the same name
                    else:
                        self._retired_policies.add(uid)
                        return PolicyState(key=key, body=snapshot(body))
                if state is None:
                    first = snapshot(body)
                    state = PolicyState(key=key, body=first)
                    state.status = dict(first.get("status") or {})
                    state.served_token = (state.status.get("lastReplay") or {}).get("token")
                    in_sync = condition_of(state.status, SWEEPER_IN_SYNC) or {}
                    if in_sync.get("status") == FALSE and in_sync.get("reason") == events.DRIFT_CONFLICT:
                        # A conflict an earlier process declared: it lasts until the sweeper
                        # has been left alone for a whole window from now.
                        state.drift_conflict = in_sync.get("message") or events.DRIFT_CONFLICT
                        state.drift_last_seen = self.clock()
                    self.policies[key] = state
                    return state
                if _meta(state.body).get("uid") == uid:
                    return state
            verdict = (state, self._came_after(key, body, state.body))

    def _came_after(self, key: PolicyKey, body: Mapping[str, Any], known: Mapping[str, Any]) -> bool:
        """Whether the policy ``body`` came after ``known``, another policy that held
        the same name: the one the API server holds under that name now is the
        latest (neither: ``body`` is gone too, its state does not matter); without an
        answer, the one created later. Two objects' resourceVersions tell nothing."""
        from kubernetes.client.exceptions import ApiException

        try:
            current = self.custom.get_namespaced_custom_object(GROUP, VERSION, key[0], PLURAL, key[1])
            return _meta(current).get("uid") == _meta(body).get("uid")
        except ApiException as exc:
            if exc.status == 404:
                return False
        except Exception:  # noqa: BLE001 - API server down: judge by the creation times
            pass
        # Created in the same second (or times missing): a uid never seen is most
        # likely the new one (the old one's state was made from its earlier events).
        return _created_before(body, known) is not True

    def observe_policy(self, body: Mapping[str, Any], event_type: str | None) -> None:
        key = policy_key(body)
        if event_type == "DELETED":
            self.forget(key, (body.get("metadata") or {}).get("uid"))
            return
        state = self.state(body)
        with state.lock:
            self._take_body(state, snapshot(body))
            annotations = (state.body.get("metadata") or {}).get("annotations") or {}
            token = annotations.get(f"{GROUP}/replay")
            wants_replay = token is not None and token != state.served_token
        if wants_replay and state.outcome is not None:
            self._kick(key)

    def _take_body(self, state: PolicyState, fresh: dict) -> bool:
        """Make ``fresh`` (this policy, same uid) the body we know, unless it is older
        (under ``state.lock``). A version seen before and since replaced is older (kopf's
        handler body, a watch event sent again). While a status write of ours waits for
        the watch to deliver its version, the watch events before it are older than the
        body the write returned: their status would pass for the one the server holds
        and the whole status would be written again, the same. Equality of versions only."""
        version = _version(fresh)
        current = _version(state.body)
        if state.awaited_version is not None:
            caught_up = (version == state.awaited_version
                         or _generation(fresh) > _generation(state.body)  # a spec change after our write
                         or status_patch(fresh.get("status") or {}, state.stored_status or {}) is None
                         or time.monotonic() - state.awaited_since > WRITE_ECHO_TIMEOUT)
            if not caught_up:
                return False
            state.awaited_version = None
        if version != current and version in state.seen_versions:
            return False
        if version != current:
            state.seen_versions.append(current)
        state.body = fresh
        state.stored_status = dict(fresh.get("status") or {})
        return True

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
            self.policies.pop(key, None)
        if self.scheduler is not None:
            self.scheduler.remove(key)
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
                if known is None or _meta(known).get("uid") == meta.get("uid"):
                    self.deployments.pop(dkey, None)
            elif _newer_deployment(body, known, read, self._retired_deployments):
                if read and known is not None and _meta(known).get("uid") != meta.get("uid"):
                    self._retired_deployments.add(_meta(known).get("uid"))
                self.deployments[dkey] = snapshot(body)
        owner = policy_owner(body)
        if owner is None:
            return None
        key = (dkey[0], owner.get("name"))
        if key in self.policies:
            self._kick(key)
            return key
        return None

    def record_outcome(self, body: Mapping[str, Any], outcome: ReconcileOutcome) -> None:
        self.metrics.count_reconcile(outcome)  # every reconcile ends here, whatever its result
        state = self.state(body)
        with state.lock:
            before = state.outcome
            state.outcome = outcome
            self._take_body(state, snapshot(body))
        changed = before is None or (before.ok, before.reason, before.message) != (
            outcome.ok, outcome.reason, outcome.message)
        if changed:
            extra = {"namespace": state.key[0], "policy": state.key[1],
                     "generation": outcome.generation, "reason": outcome.reason}
            if outcome.ok:
                log.info("policy reconciled", extra=extra)
            elif outcome.reason == events.OLD_SWEEPER_DELETING:
                # Expected after a delete and create again: news, not a warning.
                log.info(outcome.message, extra=extra)
                self.recorder.post(state.body, events.NORMAL, outcome.reason, outcome.message)
            else:
                log.warning(outcome.message, extra=extra)
                self.recorder.post(state.body, events.WARNING, outcome.reason, outcome.message)
        self._kick(state.key)

    def secret_digest(self, namespace: str, ref: Mapping[str, Any]) -> str | None:
        """A digest of the value the sweeper reads from ``spec.redis.secretRef``
        (the Secret read again once the reader's cache has expired): a new one
        rolls the sweeper, a label or annotation on the Secret does not. None
        when that value is no usable Redis URL now (Secret missing or unreadable,
        key missing, not a Redis URL): the caller keeps what the pods have."""
        try:
            url = resolve_url(namespace, {"secretRef": dict(ref)}, self.secrets)
            secret = self.secrets.get(namespace, ref["name"])  # cached by resolve_url's read
        except Exception:  # noqa: BLE001 - RedisConfigError, or the API down: keep what we have
            return None
        return secret_value_digest(namespace, ref["name"], ref.get("key") or "url", url,
                                   getattr(secret, "uid", None))

    # -- the status loop -------------------------------------------------------
    def refresh(self, key: PolicyKey) -> float | None:
        state = self.policies.get(key)
        if state is None:
            return None
        with state.lock:
            if state.outcome is None:
                return 1.0  # the reconcile handler has not run yet in this process
            if state.drift_conflict:
                from stalledpolicy.controller.reconcile import drift_conflict_over

                state.drift_resume = drift_conflict_over(self, state, self.clock()) or state.drift_resume
            with self.metrics.refresh_duration.time():
                problem = self._refresh_locked(state)
            if self.policies.get(key) is not state:
                return None
            self.metrics.count_refresh(problem)
            why = self._reapply_reason(state, problem)
            if problem is None:
                state.failures = 0
                delay = self.config.status_interval
            else:
                state.failures += 1
                delay = backoff(state.failures - 1, self.config.status_interval, self.config.max_backoff)
        if why is not None:
            from stalledpolicy.controller.reconcile import APPLY_FAILED_FIRST_RETRY, reapply

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

    def _reapply_reason(self, state: PolicyState, problem: Problem | None) -> str | None:
        """Why the sweeper must be applied again now, or None: the Secret of
        ``spec.redis.secretRef`` holds a new value (a rotated password
        reaches the pods only through a new pod template), or a re-apply failed.
        A Secret that is missing or holds no valid URL rolls nothing: the running
        pods keep the last good one, the condition says what is wrong."""
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
        return None, None, Problem("RedisUnreachable",
                                   f"cannot read queue {spec.get('queue')} at {where}: "
                                   f"{safe_error(exc, url)}"), None

    def _refresh_locked(self, state: PolicyState) -> Problem | None:
        body, outcome = state.body, state.outcome
        spec = body.get("spec") or {}
        namespace, name = state.key
        deployment_name = sweeper_name(name)
        deployment = self.deployments.get((namespace, deployment_name))
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

    def _replay_client(self, url: str):
        """A bytes client for one replay (replays are rare): job ids and errors
        need not be UTF-8, and a decoding client fails on the reply after the
        script has moved the jobs. Never resent: a replay that answered late
        would otherwise report its own moves as done by someone else."""
        from stalledpolicy.redis_url import connect, single_attempt

        timeout = self.config.redis_timeout
        return connect(url, retry=single_attempt(), decode_responses=False, socket_timeout=timeout,
                       socket_connect_timeout=timeout)

    def _maybe_replay(self, state: PolicyState, client, url: str, spec, snapshot, now):
        annotations = (state.body.get("metadata") or {}).get("annotations") or {}
        try:
            request = requested_replay(annotations, state.served_token)
        except InvalidReplayRequest as exc:
            token = annotations.get(f"{GROUP}/replay")
            state.served_token = token  # refused once; a new token asks again
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
        # Served from now on, whatever happens to the status write.
        state.served_token = request.token
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
            if isinstance(written, Mapping) and _meta(written).get("uid") == uid and _version(written):
                # The policy as our write left it, newer than anything the watch has
                # shown: the watch events until its own (kopf's annotation patch, sent
                # just before the write, arrives after it) are older (_take_body).
                if _version(written) != _version(state.body):
                    state.seen_versions.append(_version(state.body))
                state.body = snapshot(written)
                state.awaited_version, state.awaited_since = _version(written), time.monotonic()
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
