"""Rows built directly with Redis commands, shaped as EchoMQ workers leave them."""

from __future__ import annotations

import contextlib
import json
import time

from stalledpolicy.keyspace import QueueKeys

EXPIRED = 1  # a lease deadline long past on any server clock


def server_ms(r) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def put_active(r, keys: QueueKeys, job_id: str, *, group: str | None = None, score: int = EXPIRED,
               attempts: str | int = 1, count_in_gactive: bool = True, **fields) -> str:
    """A claimed job: its row, its `active` entry and (grouped) its lane slot."""
    row = {"state": "active", "attempts": str(attempts), "payload": f"payload-{job_id}"}
    if group is not None:
        row["group"] = group
    row.update({k: str(v) for k, v in fields.items()})
    r.hset(keys.job(job_id), mapping=row)
    r.zadd(keys.active, {job_id: score})
    if group is not None and count_in_gactive:
        r.hincrby(keys.gactive, group, 1)
    return job_id


def put_each_event_kind(r, keys: QueueKeys) -> None:
    """One job recovered into a lane, one dead-lettered, one quarantined (at
    budget 2): the three events the sweep sends (stalled, failed stalled, failed
    malformed)."""
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", stalled=1)
    put_active(r, keys, "JOB3")
    r.hset(keys.job("JOB3"), "stalled", "x")


def assert_each_event_kind_moved(r, keys: QueueKeys, result) -> None:
    """Where put_each_event_kind's jobs are after one sweep."""
    assert (result.recovered, result.dead_lettered, result.quarantined) == (1, 1, 1)
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"]
    assert r.zrange(keys.dead, 0, -1) == ["JOB2", "JOB3"]
    assert r.hget(keys.job("JOB1"), "state") == "pending" and r.hget(keys.job("JOB2"), "state") == "dead"
    assert result.problems == []


# put_dead's default dead_attempts: the row's attempts, as our scripts record it
AS_WRITTEN = object()


def put_dead(r, keys: QueueKeys, job_id: str, *, group: str | None = None, stalled: int = 1,
             attempts: int = 2, dead_at: int | None = None, last_error: str = "stalled",
             dead_attempts: object = AS_WRITTEN, **fields) -> str:
    """A dead job. With ``dead_at``, ``dead_attempts`` is ``attempts`` (as our
    scripts write a time of death) unless given; ``None``: no ``dead_attempts``
    (a row written before the scripts recorded it)."""
    row = {"state": "dead", "attempts": str(attempts), "payload": f"payload-{job_id}",
           "stalled": str(stalled), "last_error": last_error}
    if dead_at is not None:
        row["dead_at"] = str(dead_at)
        if dead_attempts is AS_WRITTEN:
            row["dead_attempts"] = str(attempts)
    if dead_attempts is not AS_WRITTEN and dead_attempts is not None:
        row["dead_attempts"] = str(dead_attempts)
    if group is not None:
        row["group"] = group
    row.update({k: str(v) for k, v in fields.items()})
    r.hset(keys.job(job_id), mapping=row)
    r.zadd(keys.dead, {job_id: 0})
    return job_id


# EchoMQ's complete, modelled from the contract: the caller's token must equal
# `attempts` (else EMQSTALE); the id need not be in active (a job returned to
# pending is taken out of it); the row is deleted.
_COMPLETE = """
local att = redis.call('HGET', KEYS[2], 'attempts')
if not att then return 0 end
if att ~= ARGV[2] then return redis.error_reply('EMQSTALE complete token mismatch') end
local p = ARGV[3]
local g = redis.call('HGET', KEYS[2], 'group')
local was_active = redis.call('ZREM', KEYS[1], ARGV[1])
if g then
  local lane = p .. 'g:' .. g .. ':pending'
  if was_active == 1 then
    local act = redis.call('HINCRBY', p .. 'gactive', g, -1)
    if act <= 0 then redis.call('HDEL', p .. 'gactive', g) end
  else
    redis.call('ZREM', lane, ARGV[1])
  end
else
  if was_active == 0 then redis.call('ZREM', p .. 'pending', ARGV[1]) end
end
redis.call('DEL', KEYS[2])
redis.call('HINCRBY', p .. 'metrics:completed', 'count', 1)
return 1
"""


def echomq_complete(r, keys: QueueKeys, job_id: str, token: int):
    return r.eval(_COMPLETE, 2, keys.active, keys.job(job_id), job_id, str(token), keys.prefix)


def echomq_reprocess(r, keys: QueueKeys, job_id: str) -> None:
    """EchoMQ's own reprocess of a dead job (its Jobs.reprocess_job, modelled
    from its script): out of `dead`, `last_error` deleted, `state=pending`,
    into the flat `pending`; `dead_at`, `dead_attempts` and `attempts` kept."""
    assert r.zrem(keys.dead, job_id) == 1
    r.hdel(keys.job(job_id), "last_error")
    r.hset(keys.job(job_id), "state", "pending")
    r.zadd(keys.pending, {job_id: 0})


def reclaim(r, keys: QueueKeys, job_id: str, *, source: str) -> int:
    """A worker claims the job again (from `source`), attempts += 1, lease lapsed."""
    assert r.zrem(source, job_id) == 1
    token = r.hincrby(keys.job(job_id), "attempts", 1)
    r.hset(keys.job(job_id), "state", "active")
    r.zadd(keys.active, {job_id: EXPIRED})
    group = r.hget(keys.job(job_id), "group")
    if group:
        r.hincrby(keys.gactive, group, 1)
    return token


def received(pubsub, expected: int, timeout: float = 5.0) -> list[dict]:
    """The messages ``pubsub`` receives (not its subscriptions' confirmations):
    ``expected`` of them, or fewer at the timeout, then any beyond them (a
    duplicate announcement would show)."""
    messages: list[dict] = []

    def keep(message) -> None:
        if message and message["type"] in ("message", "pmessage"):
            messages.append(message)

    deadline = time.monotonic() + timeout
    while len(messages) < expected and time.monotonic() < deadline:
        keep(pubsub.get_message(timeout=0.2))
    extra = pubsub.get_message(timeout=0.2)
    while extra is not None:
        keep(extra)
        extra = pubsub.get_message(timeout=0.1)
    return messages


class EventTap:
    """Subscribe before the sweep; collect the JSON events afterwards."""

    def __init__(self, r, keys: QueueKeys):
        self.pubsub = r.pubsub()
        self.pubsub.subscribe(keys.events)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait for the subscribe confirmation
            message = self.pubsub.get_message(timeout=0.5)
            if message and message["type"] == "subscribe":
                break

    def collect(self, expected: int, timeout: float = 5.0) -> list[dict]:
        return [json.loads(data) for data in self.collect_raw(expected, timeout)]

    def collect_raw(self, expected: int, timeout: float = 5.0) -> list[str]:
        """The messages as published (text), in order."""
        return [data if isinstance(data, str) else data.decode()
                for data in (message["data"] for message in received(self.pubsub, expected, timeout))]

    def close(self) -> None:
        self.pubsub.close()


def dump(r) -> dict:
    """Every key with its type and content, to prove a dry run wrote nothing."""
    state = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key)
        if kind == "hash":
            value = r.hgetall(key)
        elif kind == "zset":
            value = r.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = r.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(r.smembers(key))
        else:
            value = r.dump(key)
        state[key] = (kind, value)
    return state


@contextlib.contextmanager
def restricted_user(redis_server, r, name, *rules):
    """A client logged in as a Redis user with every key, channel and command
    but what ``rules`` (ACL SETUSER's, applied after those) take away."""
    r.execute_command("ACL", "SETUSER", name, "reset", "on", "nopass", "~*", "&*", "+@all", *rules)
    client = redis_server.client(decode_responses=True, username=name, password="unused")
    try:
        yield client
    finally:
        client.close()
        r.acl_deluser(name)
