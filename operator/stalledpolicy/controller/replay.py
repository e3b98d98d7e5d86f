"""Replay the morgue the GitOps way: once per new value of an annotation.

``queues.emq.dev/replay: "<token>"`` asks for one replay of the queue's morgue
(optionally only the lane in ``queues.emq.dev/replay-lane``). The token that
was served is kept in ``status.lastReplay.token``, and the last SERVED_HISTORY
tokens served in ``status.lastReplay.servedTokens``: a token served before never
replays again (a GitOps tool putting back an earlier value of the annotation
would otherwise replay the morgue a second time), a new one (any new string: a
date, a commit id) replays.

The served token and its result are also written to the queue's Redis
(``emq:{q}:sweeper:last-replay``) right after the replay: an operator that
dies before its status write lands finds the token there when it comes back,
and reports that replay instead of running it again on what has died since.

Job ids and errors are bytes to Redis, not always UTF-8: the replay runs on a
bytes client (the engine decodes with ``errors="replace"``), and a reply that
still cannot be read serves the token all the same (the script has run: the
jobs moved), with the count left unknown and a warning saying so. So does a
call that got no answer in time: it may have run, and it is never sent again.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION
from stalledpolicy.keyspace import InvalidLaneName, QueueKeys, validate_lane_name

TOKEN_MAX = 253
# Tokens served that never replay again (status.lastReplay.servedTokens, newest last).
SERVED_HISTORY = 16
# in the Redis record only (never in status): the replay was still running
_INCOMPLETE = "incomplete"


@dataclass(frozen=True)
class ReplayRequest:
    token: str
    lane: str | None


class InvalidReplayRequest(ValueError):
    pass


def served_tokens(last_replay: Mapping[str, Any] | None) -> list[str]:
    """The tokens served, oldest first, as ``status.lastReplay`` records them
    (``servedTokens``, and ``token``, the last one, for a status written before)."""
    last_replay = last_replay if isinstance(last_replay, Mapping) else {}
    listed = last_replay.get("servedTokens")
    tokens = [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []
    token = last_replay.get("token")
    return with_served(tokens, token) if isinstance(token, str) else tokens[-SERVED_HISTORY:]


def with_served(tokens: list[str], token: str) -> list[str]:
    """``tokens`` with ``token`` served last, at most SERVED_HISTORY of them."""
    return ([t for t in tokens if t != token] + [token])[-SERVED_HISTORY:]


def requested_replay(annotations: Mapping[str, str] | None,
                     served: str | list[str] | tuple[str, ...] | None) -> ReplayRequest | None:
    """The replay the annotations ask for and that was not served yet (``served``:
    the token served last, or those served lately), or None."""
    token = (annotations or {}).get(REPLAY_ANNOTATION)
    served = [served] if isinstance(served, str) else list(served or ())
    if token is None or token.strip() == "" or token in served:
        return None
    if len(token) > TOKEN_MAX:
        raise InvalidReplayRequest(
            f"annotation {REPLAY_ANNOTATION}: at most {TOKEN_MAX} characters (got {len(token)})")
    lane = (annotations or {}).get(REPLAY_LANE_ANNOTATION) or None
    if lane is not None:
        try:
            validate_lane_name(lane)
        except InvalidLaneName as exc:
            raise InvalidReplayRequest(
                f"annotation {REPLAY_LANE_ANNOTATION}: {str(exc).removeprefix('lane: ')}") from None
    return ReplayRequest(token=token, lane=lane)


def served_replay(client: Any, queue: str, request: ReplayRequest) -> tuple[dict[str, Any], str | None] | None:
    """This token's replay as recorded in Redis (served before, by this operator
    or one before a restart): its ``status.lastReplay`` record and warning, or
    None when it was never served. Not run, so not a replay to count again."""
    served = _served_record(client.get(QueueKeys(queue).sweeper_last_replay), request.token)
    if served is None:
        return None
    if served.pop(_INCOMPLETE, False):
        return served, (f"the replay of queue {queue} was stopped after {served['replayed']} jobs "
                        "(the operator stopped during it); annotate the policy again with a new value "
                        "to replay the rest")
    return served, None


def run_replay(client: Any, queue: str, request: ReplayRequest, now: str,
               replay_fn: Callable[..., Any] | None = None) -> tuple[dict[str, Any], str | None]:
    """Replay (the caller has asked :func:`served_replay` first: a token is
    replayed once): the ``status.lastReplay`` record, and what did not go as
    asked (:func:`replay_warning`) or None."""
    record_key = QueueKeys(queue).sweeper_last_replay
    if replay_fn is None:
        from stalledpolicy.engine import morgue_replay  # deferred: the engine imports redis-py

        replay_fn = morgue_replay
    # lane null when none (dropped when written): never an earlier replay's lane
    record: dict[str, Any] = {"token": request.token, "replayed": None, "time": now, "lane": request.lane}
    moved: list[int] = []  # jobs moved after each completed script call

    def called(so_far: Any) -> None:
        moved.append(int(so_far.replayed))
        # An operator stopped during a long replay (an upgrade) finds the token
        # served with what moved, instead of replaying what has died since.
        _store(client, record_key, {**record, "replayed": moved[-1], _INCOMPLETE: True})

    try:
        result = replay_fn(client, queue, lane=request.lane, progress=called)
        record["replayed"] = int(result.replayed)
        warning = replay_warning(queue, result)
    except Exception as exc:
        import redis  # deferred: redis-py loads only once a Redis is used

        if isinstance(exc, (redis.RedisError, OSError)):
            if not moved and not _may_have_run(exc):
                raise  # refused before anything moved: retried on the next refresh
            # Stopped half-way: running it again would also replay jobs that
            # died since the token was given, so the token is served with what
            # moved (at least that many: the failed call may have run too).
            if moved:
                record["replayed"] = moved[-1]
                warning = (f"the replay of queue {queue} stopped after {moved[-1]} jobs "
                           f"({type(exc).__name__}); annotate the policy again with a new value "
                           "to replay the rest")
            else:
                # ``replayed`` stays null: unknown
                warning = (f"the replay of queue {queue} got no answer from Redis ({type(exc).__name__}): "
                           "it may have run; `stalledpolicy morgue stats` shows what is left, and a new "
                           "annotation value replays it")
            _store_if_possible(client, record_key, record)
            return record, warning
        # A reply that came back but cannot be read: the script ran. Serve the
        # token (``replayed`` null: unknown) so it is never run again.
        warning = (f"the replay of queue {queue} ran but its reply could not be read "
                   f"({type(exc).__name__}): how many jobs moved is unknown; "
                   "`stalledpolicy morgue stats` shows what is left")
    _store_if_possible(client, record_key, record)
    return record, warning


def _store_if_possible(client: Any, record_key: str, record: dict[str, Any]) -> None:
    """The served record in Redis, if it can be written now: if not (the connection
    is likely gone), this operator still serves the token from memory."""
    import redis  # deferred: redis-py loads only once a Redis is used

    try:
        _store(client, record_key, record)
    except (redis.RedisError, OSError):
        pass


def _may_have_run(exc: BaseException) -> bool:
    """Whether a script call that failed this way may have run on the server.

    The call is made on a connection that has just answered (the record was
    read), and it is never resent (``redis_url.connecting.single_attempt``): a timeout or
    a connection lost while waiting means the script was sent and may have run.
    A server still loading its data refused it."""
    import redis  # deferred: redis-py loads only once a Redis is used

    if isinstance(exc, redis.BusyLoadingError):
        return False
    return isinstance(exc, (redis.TimeoutError, redis.ConnectionError, socket.timeout, ConnectionError))


def _store(client: Any, record_key: str, record: dict[str, Any]) -> None:
    client.set(record_key, json.dumps(record, sort_keys=True))


# ids named in the warning; the rest are counted (`stalledpolicy morgue list` shows them all)
_NAMED_LEFT = 3


def replay_warning(queue: str, result: Any) -> str | None:
    """Jobs the replay left in the morgue (with why) and keys it found malformed, or None."""
    parts = []
    left = dict(getattr(result, "unreplayable", None) or {})
    if left:
        named = "; ".join(f"{job_id}: {why}" for job_id, why in list(left.items())[:_NAMED_LEFT])
        more = f"; and {len(left) - _NAMED_LEFT} more" if len(left) > _NAMED_LEFT else ""
        parts.append(f"{len(left)} job{'s' if len(left) != 1 else ''} left in the morgue of queue {queue} "
                     f"({named}{more}; `stalledpolicy morgue list` shows them)")
    parts += list(getattr(result, "problems", None) or [])
    return ". ".join(parts) or None


def _served_record(raw: Any, token: str) -> dict[str, Any] | None:
    """The stored record when it is this token's; anything unreadable counts as none."""
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("token") != token:
        return None
    replayed = record.get("replayed")
    if not (replayed is None or isinstance(replayed, int)) or not isinstance(record.get("time"), str):
        return None
    return {k: record[k] for k in ("token", "replayed", "time", "lane", _INCOMPLETE) if k in record}


def replay_message(queue: str, record: Mapping[str, Any]) -> str:
    where = f" lane {record['lane']}" if record.get("lane") else ""
    n = record.get("replayed")
    if n is None:
        return (f"replayed the morgue of queue {queue}{where}, how many jobs is unknown "
                f"(token {record['token']!r})")
    return (f"replayed {n} job{'s' if n != 1 else ''} from the morgue of queue {queue}{where} "
            f"(token {record['token']!r})")
