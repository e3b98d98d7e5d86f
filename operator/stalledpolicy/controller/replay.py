"""Replay the morgue the GitOps way: once per new value of an annotation.

``queues.emq.dev/replay: "<token>"`` asks for one replay of the queue's morgue
(optionally only the lane in ``queues.emq.dev/replay-lane``). The token that
was served is kept in ``status.lastReplay.token``; the same token never
replays twice, a new one (any new string: a date, a commit id) replays again.

The served token and its result are also written to the queue's Redis
(``emq:{q}:sweeper:last-replay``) right after the replay: an operator that
dies before its status write lands finds the token there when it comes back,
and reports that replay instead of running it again on what has died since.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION

TOKEN_MAX = 253


@dataclass(frozen=True)
class ReplayRequest:
    token: str
    lane: str | None


class InvalidReplayRequest(ValueError):
    pass


def requested_replay(annotations: Mapping[str, str] | None,
                     last_token: str | None) -> ReplayRequest | None:
    """The replay the annotations ask for and that was not served yet, or None."""
    token = (annotations or {}).get(REPLAY_ANNOTATION)
    if token is None or token.strip() == "" or token == last_token:
        return None
    if len(token) > TOKEN_MAX:
        raise InvalidReplayRequest(
            f"annotation {REPLAY_ANNOTATION}: at most {TOKEN_MAX} characters (got {len(token)})")
    lane = (annotations or {}).get(REPLAY_LANE_ANNOTATION) or None
    if lane is not None:
        from stalledpolicy.keyspace import InvalidQueueName, validate_queue_name

        try:
            validate_queue_name(lane)
        except InvalidQueueName as exc:
            raise InvalidReplayRequest(
                f"annotation {REPLAY_LANE_ANNOTATION}: {str(exc).replace('queue: ', '')}") from None
    return ReplayRequest(token=token, lane=lane)


def run_replay(client: Any, queue: str, request: ReplayRequest, now: str,
               replay_fn: Callable[..., Any] | None = None) -> dict:
    """Replay (unless this token was served already) and return the ``status.lastReplay`` record."""
    from stalledpolicy.keyspace import QueueKeys

    record_key = QueueKeys(queue).sweeper_last_replay
    served = _served_record(client.get(record_key), request.token)
    if served is not None:
        return served
    if replay_fn is None:
        from stalledpolicy.engine import morgue_replay as replay_fn
    result = replay_fn(client, queue, lane=request.lane)
    record: dict[str, Any] = {"token": request.token, "replayed": int(result.replayed), "time": now}
    if request.lane:
        record["lane"] = request.lane
    client.set(record_key, json.dumps(record, sort_keys=True))
    return record


def _served_record(raw: Any, token: str) -> dict | None:
    """The stored record when it is this token's; anything unreadable counts as none."""
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("token") != token:
        return None
    if not isinstance(record.get("replayed"), int) or not isinstance(record.get("time"), str):
        return None
    return {k: record[k] for k in ("token", "replayed", "time", "lane") if k in record}


def replay_message(queue: str, record: Mapping[str, Any]) -> str:
    where = f" lane {record['lane']}" if record.get("lane") else ""
    n = record["replayed"]
    return (f"replayed {n} job{'s' if n != 1 else ''} from the morgue of queue {queue}{where} "
            f"(token {record['token']!r})")
