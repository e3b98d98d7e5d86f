"""Text the scripts write is valid UTF-8, whatever bytes the queue holds.

Redis strings are bytes: an id, a field, a group name may hold anything. What
our scripts compose from them (the JSON events on ``emq:{q}:events``, the
``last_error`` of a quarantined row, the replay's reasons) must still decode
as strict UTF-8: a quoted value is cut on a character boundary, and a byte
that begins no valid UTF-8 sequence is written as U+FFFD (``\\ufffd`` inside
the JSON events). Valid multi-byte characters pass as they are.
"""

from __future__ import annotations

import json
import time

import pytest

from stalledpolicy import engine
from stalledpolicy.engine import Budgets
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.lua import script
from tests.redis.engine_rows import EXPIRED

pytestmark = pytest.mark.redis

FFFD = "\ufffd"

# (r_bytes id, the id as the event must carry it)
IDS = [
    (b"JOB-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "JOB-\u00e9\u20ac\U0001f600"),  # valid: kept as is
    (b"JOB\xff", "JOB" + FFFD),                      # never a UTF-8 byte
    (b"JOB\xe9t\xe9", f"JOB{FFFD}t{FFFD}"),          # Latin-1
    (b"JOB\x80\xbf", "JOB" + FFFD * 2),              # continuation bytes with no lead
    (b"JOB\xc3", "JOB" + FFFD),                      # a lead cut short at the end
    (b"JOB\xe2\x82x", f"JOB{FFFD * 2}x"),            # a 3-byte lead with one follower
    (b"JOB\xc0\xaf", "JOB" + FFFD * 2),              # overlong '/'
    (b"JOB\xed\xa0\x80", "JOB" + FFFD * 3),          # a UTF-16 surrogate
    (b"JOB\xf4\x90\x80\x80", "JOB" + FFFD * 4),      # above U+10FFFF
    (b"JOB\t\xff\"", 'JOB\t' + FFFD + '"'),           # escaping and cleaning together
]


def row_key(keys: QueueKeys, job_id: bytes) -> bytes:
    return keys.prefix.encode() + b"job:" + job_id


def put_active(r_bytes, keys, job_id: bytes, **fields) -> None:
    row = {b"state": b"active", b"attempts": b"1"}
    row.update({k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()})
    r_bytes.hset(row_key(keys, job_id), mapping=row)
    r_bytes.zadd(keys.active, {job_id: EXPIRED})
    if b"group" in row:
        r_bytes.hincrby(keys.gactive, row[b"group"], 1)


class RawTap:
    """The events channel, every message kept as the bytes published."""

    def __init__(self, r_bytes, keys):
        self.pubsub = r_bytes.pubsub()
        self.pubsub.subscribe(keys.events)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.5)
            if message and message["type"] == b"subscribe" or (message and message["type"] == "subscribe"):
                return
        raise TimeoutError("no subscribe confirmation")

    def collect(self, expected: int, timeout: float = 5.0) -> list[bytes]:
        out: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.2)
            if message and message["type"] in ("message", b"message"):
                out.append(message["data"])
        extra = self.pubsub.get_message(timeout=0.2)
        while extra is not None:
            if extra["type"] in ("message", b"message"):
                out.append(extra["data"])
            extra = self.pubsub.get_message(timeout=0.1)
        self.pubsub.close()
        return out


def decoded(events: list[bytes]) -> list[dict]:
    """Each event as a JSON object read from strictly decoded UTF-8."""
    return [json.loads(data.decode("utf-8", "strict")) for data in events]


def sweep_announcing(r_bytes, keys, expected: int, budget: int) -> tuple[engine.SweepResult, list[bytes]]:
    tap = RawTap(r_bytes, keys)
    result = engine.sweep_batch(r_bytes, keys.queue, Budgets(budget), 100)
    return result, tap.collect(expected)


@pytest.mark.parametrize("budget, event", [(2, "stalled"), (1, "failed")])
def test_every_event_is_valid_utf8_json_whatever_bytes_the_ids_hold(r_bytes, keys, budget, event):
    for job_id, _ in IDS:
        put_active(r_bytes, keys, job_id)
    result, events = sweep_announcing(r_bytes, keys, len(IDS), budget)
    assert result.recovered + result.dead_lettered == len(IDS)
    got = sorted(e["job"] for e in decoded(events))
    assert got == sorted(text for _, text in IDS)
    assert {e["event"] for e in decoded(events)} == {event}
    # a valid multi-byte id travels as its own bytes, not escaped
    assert any(b'"JOB-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"' in e for e in events)
    # the jobs themselves moved under their real (byte) ids
    where = keys.pending if budget == 2 else keys.dead
    assert sorted(r_bytes.zrange(where, 0, -1)) == sorted(job_id for job_id, _ in IDS)


QUOTED = {  # job -> (a malformed stalled value, the excerpt of it in last_error)
    # a 2-byte character over the 64-byte cut: cut before it
    b"JOB1": ("a" * 63 + "\u00e9" + "b" * 10, "a" * 63 + "..."),
    # a 4-byte character over the cut (bytes 62-65): cut before it
    b"JOB2": ("a" * 61 + "\U0001f600" + "b" * 10, "a" * 61 + "..."),
    # a 3-byte character ending exactly on byte 64: kept whole
    b"JOB3": ("a" * 61 + "\u20ac" + "b" * 10, "a" * 61 + "\u20ac..."),
    # short, valid multi-byte: as is
    b"JOB4": ("z\u00e9ro", "z\u00e9ro"),
}


def test_quoted_values_are_cut_on_a_character_boundary(r_bytes, keys):
    for job_id, (value, _) in QUOTED.items():
        put_active(r_bytes, keys, job_id, stalled=value.encode())
    result, events = sweep_announcing(r_bytes, keys, len(QUOTED), 2)
    assert result.quarantined == len(QUOTED)
    announced = {e["job"]: e for e in decoded(events)}
    for job_id, (value, quoted) in QUOTED.items():
        expected = "malformed: stalled is not a non-negative integer: " + quoted
        stored = r_bytes.hget(row_key(keys, job_id), "last_error")
        assert stored.decode("utf-8", "strict") == expected
        assert announced[job_id.decode()] == {"event": "failed", "job": job_id.decode(), "reason": expected}
        assert r_bytes.hget(row_key(keys, job_id), "stalled") == value.encode()  # the evidence, untouched
    assert len(events) == len(QUOTED)


def test_invalid_bytes_of_a_quoted_value_become_replacement_characters(r_bytes, keys):
    bad = b"\xff1\xc3(" + b"x" * 59 + b"\xe2\x82\xac"  # the euro sign spans the cut (bytes 64-66)
    put_active(r_bytes, keys, b"JOBbad", attempts=bad)
    result, events = sweep_announcing(r_bytes, keys, 1, 2)
    assert result.quarantined == 1
    expected = (f"malformed: attempts is not a non-negative integer: {FFFD}1{FFFD}(" + "x" * 59 + "...")
    assert r_bytes.hget(row_key(keys, b"JOBbad"), "last_error").decode("utf-8", "strict") == expected
    assert decoded(events) == [{"event": "failed", "job": "JOBbad", "reason": expected}]


def test_a_lane_key_with_invalid_bytes_is_named_in_valid_utf8(r_bytes, keys):
    lane = keys.prefix.encode() + b"g:t\xe9:pending"
    r_bytes.set(lane, b"oops")
    put_active(r_bytes, keys, b"JOB\xe9", group=b"t\xe9")
    result, events = sweep_announcing(r_bytes, keys, 2, 3)
    assert result.quarantined == 1
    expected = f"malformed: lane {keys.prefix}g:t{FFFD}:pending is a string, not a sorted set"
    assert r_bytes.hget(row_key(keys, b"JOB\xe9"), "last_error").decode("utf-8", "strict") == expected
    assert decoded(events) == [{"event": "stalled", "job": "JOB" + FFFD},
                               {"event": "failed", "job": "JOB" + FFFD, "reason": expected}]
    assert r_bytes.zrange(keys.dead, 0, -1) == [b"JOB\xe9"]


def replay_reasons(r_bytes, keys) -> dict[bytes, bytes]:
    """morgue_replay called directly: its reasons as the script returns them."""
    k = keys
    reply = script("morgue_replay")(
        r_bytes, [k.dead, k.pending, k.ring, k.gactive, k.glimit, k.paused, k.wake, k.sweeper_totals],
        [k.prefix, "0", "", "scan", "", 500, 500])
    refused = reply[1]
    return {refused[i]: refused[i + 1] for i in range(0, len(refused), 2)}


@pytest.mark.parametrize("value, quoted", [
    (("a" * 63 + "\u00e9" + "b").encode(), "a" * 63 + "..."),
    (b"\xffx", FFFD + "x"),
])
def test_the_replay_quotes_a_bad_token_in_valid_utf8(r_bytes, keys, value, quoted):
    r_bytes.hset(row_key(keys, b"JOB1"), mapping={b"state": b"dead", b"attempts": value})
    r_bytes.zadd(keys.dead, {b"JOB1": 0})
    reasons = replay_reasons(r_bytes, keys)
    assert reasons[b"JOB1"].decode("utf-8", "strict") == (
        "malformed: attempts is not a non-negative integer: " + quoted)
    assert r_bytes.zrange(keys.dead, 0, -1) == [b"JOB1"]


def test_every_replay_reason_is_valid_utf8(r_bytes, keys):
    """Reasons quote a row's state or group: invalid bytes there become U+FFFD."""
    r_bytes.hset(row_key(keys, b"JOBstate"), mapping={b"state": b"d\xe9ad", b"attempts": b"1"})
    r_bytes.hset(row_key(keys, b"JOBlane"), mapping={b"state": b"dead", b"attempts": b"1", b"group": b"t\xe9"})
    r_bytes.set(keys.prefix.encode() + b"g:t\xe9:pending", b"oops")
    r_bytes.zadd(keys.dead, {b"JOBstate": 0, b"JOBlane": 0})
    reasons = {job: reason.decode("utf-8", "strict") for job, reason in replay_reasons(r_bytes, keys).items()}
    assert reasons == {
        b"JOBstate": f"state is 'd{FFFD}ad', not dead",
        b"JOBlane": f"malformed: lane {keys.prefix}g:t{FFFD}:pending is a string, not a sorted set",
    }
    assert sorted(r_bytes.zrange(keys.dead, 0, -1)) == [b"JOBlane", b"JOBstate"]




# a value over the 64-byte cut: a 2-byte character crosses it and is left out whole
LONG = ("a" * 63 + "\u00e9" + "b" * 40).encode()
LONG_QUOTED = "a" * 63 + "..."


def test_the_sweep_quotes_a_long_group_in_a_lane_key_as_an_excerpt(r_bytes, keys):
    r_bytes.set(keys.prefix.encode() + b"g:" + LONG + b":pending", b"oops")
    put_active(r_bytes, keys, b"JOB1", group=LONG)
    result, events = sweep_announcing(r_bytes, keys, 2, 3)
    assert result.quarantined == 1
    expected = f"malformed: lane {keys.prefix}g:{LONG_QUOTED}:pending is a string, not a sorted set"
    assert r_bytes.hget(row_key(keys, b"JOB1"), "last_error").decode("utf-8", "strict") == expected
    assert decoded(events)[1] == {"event": "failed", "job": "JOB1", "reason": expected}
    assert r_bytes.hget(row_key(keys, b"JOB1"), "group") == LONG  # the evidence, untouched


def test_every_replay_reason_quotes_a_long_value_as_an_excerpt(r_bytes, keys):
    r_bytes.hset(row_key(keys, b"JOBstate"), mapping={b"state": LONG, b"attempts": b"1"})
    r_bytes.hset(row_key(keys, b"JOBlane"), mapping={b"state": b"dead", b"attempts": b"1", b"group": LONG})
    r_bytes.set(keys.prefix.encode() + b"g:" + LONG + b":pending", b"oops")
    r_bytes.zadd(keys.dead, {b"JOBstate": 0, b"JOBlane": 0})
    reasons = {job: reason.decode("utf-8", "strict") for job, reason in replay_reasons(r_bytes, keys).items()}
    assert reasons == {
        b"JOBstate": f"state is '{LONG_QUOTED}', not dead",
        b"JOBlane": f"malformed: lane {keys.prefix}g:{LONG_QUOTED}:pending is a string, not a sorted set",
    }
    # by ids with a lane filter: another lane's job is named by an excerpt of its group
    k = keys
    reply = script("morgue_replay")(
        r_bytes, [k.dead, k.pending, k.ring, k.gactive, k.glimit, k.paused, k.wake, k.sweeper_totals],
        [k.prefix, "0", "=other", "ids", "", 500, 500, b"JOBlane"])
    assert [reply[1][0], reply[1][1].decode("utf-8", "strict")] == [b"JOBlane", f"in lane {LONG_QUOTED}, not selected"]
    assert sorted(r_bytes.zrange(keys.dead, 0, -1)) == [b"JOBlane", b"JOBstate"]


@pytest.mark.parametrize(("state", "quoted"), [
    (b"activ\xe9", f"activ{FFFD}"),  # made valid UTF-8
    (LONG, LONG_QUOTED),             # and cut, as an excerpt
])
def test_the_purge_quotes_a_state_as_a_valid_utf8_excerpt(r_bytes, keys, state, quoted):
    r_bytes.hset(row_key(keys, b"JOBlive"), mapping={b"state": state})
    r_bytes.zadd(keys.dead, {b"JOBlive": 0})
    k = keys
    reply = script("morgue_purge")(r_bytes, [k.dead, k.sweeper_totals], [k.prefix, "0", "", "scan", "", "", 500])
    kept = reply[1]
    assert [kept[0], kept[1].decode("utf-8", "strict")] == [b"JOBlive", f"state is '{quoted}', not dead"]
    assert r_bytes.zrange(keys.dead, 0, -1) == [b"JOBlive"]


@pytest.mark.parametrize("change", ["purge", "replay"])
def test_a_bytes_id_that_is_not_utf8_names_its_own_job_not_its_lookalike(r_bytes, keys, change):
    """ids given as bytes went out decoded with U+FFFD for the bad byte: the job
    asked for was never found, and a job whose id holds U+FFFD there was changed."""
    asked, lookalike = b"JOB\xe9", "JOB\ufffd".encode()
    for job_id in (asked, lookalike):
        r_bytes.hset(keys.job("").encode() + job_id,
                     mapping={"state": "dead", "attempts": "2", "payload": b"payload of " + job_id})
        r_bytes.zadd(keys.dead, {job_id: 0})
    if change == "purge":
        result = engine.morgue_purge(r_bytes, keys.queue, ids=[asked])
        assert result.purged == 1
    else:
        result = engine.morgue_replay(r_bytes, keys.queue, ids=[asked])
        assert result.replayed == 1
        assert r_bytes.zscore(keys.pending, asked) is not None
    assert r_bytes.zrange(keys.dead, 0, -1) == [lookalike]
    assert r_bytes.hget(keys.job("").encode() + lookalike, "payload") == b"payload of " + lookalike
