"""Replay the morgue the GitOps way: once per new value of an annotation.

``queues.emq.dev/replay: "<token>"`` asks for one replay of the queue's morgue
(optionally only the lane in ``queues.emq.dev/replay-lane``). The token that
was served is kept in ``status.lastReplay.token``; the same token never
replays twice, a new one (any new string: a date, a commit id) replays again.
"""

from __future__ import annotations

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
    """Replay and return the ``status.lastReplay`` record."""
    if replay_fn is None:
        from stalledpolicy.engine import morgue_replay as replay_fn
    result = replay_fn(client, queue, lane=request.lane)
    record: dict[str, Any] = {"token": request.token, "replayed": int(result.replayed), "time": now}
    if request.lane:
        record["lane"] = request.lane
    return record


def replay_message(queue: str, record: Mapping[str, Any]) -> str:
    where = f" lane {record['lane']}" if record.get("lane") else ""
    n = record["replayed"]
    return (f"replayed {n} job{'s' if n != 1 else ''} from the morgue of queue {queue}{where} "
            f"(token {record['token']!r})")
