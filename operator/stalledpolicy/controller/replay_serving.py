"""The status loop's replay duty: serve the replay a policy's annotation asks for.

A refresh that has read the queue asks ``serve_requested_replay`` whether the
annotation holds a token not served yet; if so the replay runs (or is found
already served in Redis: replay.py) on a connection of its own, and its record
waits in ``state.replay.unwritten`` until the status write that carries it
lands; ``announce_replay`` then posts its event, so a write that fails never
announces a replay that status does not show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from stalledpolicy.controller import REPLAY_ANNOTATION, events
from stalledpolicy.controller.metrics import OperatorMetrics
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.queue_figures import failure_reason, safe_error
from stalledpolicy.controller.redis_clients import RedisClients
from stalledpolicy.controller.replay import (
    InvalidReplayRequest,
    replay_message,
    requested_replay,
    run_replay,
    served_replay,
    with_served,
)
from stalledpolicy.controller.status import Problem
from stalledpolicy.redis_url.connecting import connect, single_attempt

log = logging.getLogger("stalledpolicy.operator")


def wants_replay(state: PolicyState) -> bool:
    """Whether the policy's annotation asks for a replay not served or refused yet."""
    token = ((state.body.get("metadata") or {}).get("annotations") or {}).get(REPLAY_ANNOTATION)
    return token is not None and token not in state.replay.served and token != state.replay.refused


def take_written(state: PolicyState) -> list[tuple[dict[str, Any], str | None]]:
    """The replays the status just written carries (under the status lock): each to announce once."""
    written, state.replay.unwritten = state.replay.unwritten, []
    return written


def serve_requested_replay(state: PolicyState, url: str, queue: str, snapshot: Any, now: str, *,
                           read_snapshot: Callable[[], Any], replay_fn: Callable[..., Any] | None,
                           redis_timeout: float, clients: RedisClients, metrics: OperatorMetrics,
                           recorder: Any) -> tuple[Problem | None, Any]:
    """(problem, snapshot) after serving the replay the annotation asks for, if any
    (under the status lock). ``snapshot`` comes back as given unless a replay moved
    jobs: then it is ``read_snapshot()``'s (kept as given if that read fails)."""
    annotations = (state.body.get("metadata") or {}).get("annotations") or {}
    try:
        request = requested_replay(annotations, [*state.replay.served, state.replay.refused or ""])
    except InvalidReplayRequest as exc:
        token = annotations.get(REPLAY_ANNOTATION)
        state.replay.refused = token  # refused once; a new token asks again
        metrics.count_replay("refused")
        recorder.post(state.body, events.WARNING, events.REPLAY_FAILED, str(exc))
        log.warning(str(exc), extra={"namespace": state.key[0], "policy": state.key[1]})
        return None, snapshot
    if request is None:
        return None, snapshot
    import redis  # deferred: redis-py loads only once a Redis is used

    replay_client = None
    try:
        replay_client = _replay_client(url, redis_timeout)
        served = served_replay(replay_client, queue, request)
        if served is None:
            record, warning = run_replay(replay_client, queue, request, now, replay_fn)
        else:
            record, warning = served
    except (redis.RedisError, OSError) as exc:
        clients.invalidate(state.key)
        metrics.count_replay("failed")
        # connected: the refresh that asked for this replay has read the queue on this URL
        detail = safe_error(exc, url, connected=True)
        return Problem(failure_reason(exc), f"replay of queue {queue} failed: {detail}"), snapshot
    finally:
        if replay_client is not None:
            try:
                replay_client.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close
                pass
    # Served from now on, whatever happens to the status write; kept in status
    # with the tokens served before it, so none of them replays again.
    state.replay.served = with_served(state.replay.served, request.token)
    record = {**record, "servedTokens": list(state.replay.served)}
    if served is None:
        # Counted by the run that moved the jobs only: a record served from
        # Redis (after a restart) was counted by the process that ran it.
        metrics.count_replay("done", int(record.get("replayed") or 0))
    # Kept beside any earlier one whose status write has not landed yet: each
    # replay is announced (its Replayed event) once status shows the last.
    state.replay.unwritten.append((record, warning))
    try:
        snapshot = read_snapshot()
    except (redis.RedisError, OSError):
        pass  # the numbers catch up on the next refresh
    return None, snapshot


def _replay_client(url: str, timeout: float) -> Any:  # a redis-py client
    """A bytes client for one replay (replays are rare): job ids and errors
    need not be UTF-8, and a decoding client fails on the reply after the
    script has moved the jobs. Never resent: a replay that answered late
    would otherwise report its own moves as done by someone else."""
    return connect(url, retry=single_attempt(), decode_responses=False, socket_timeout=timeout,
                   socket_connect_timeout=timeout)


def announce_replay(recorder: Any, state: PolicyState, queue: str, record: dict[str, Any],
                    warning: str | None) -> None:
    """Log and post the replay whose record status now shows, and what it left undone."""
    message = replay_message(queue, record)
    where = {"namespace": state.key[0], "policy": state.key[1]}
    log.info(message, extra={**where, "replayed": record["replayed"]})
    recorder.post(state.body, events.NORMAL, events.REPLAYED, message)
    if warning:
        log.warning(warning, extra=where)
        recorder.post(state.body, events.WARNING, events.REPLAY_INCOMPLETE, warning)
