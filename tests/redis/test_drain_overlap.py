"""The drain sends its next call before the last one's bookkeeping
(engine.calls.HeldConnection), on a real redis-server: the next call runs while
the caller counts the last, every call that came back is counted, and a failed
call drops its connection, so no later call reads a reply that is not its own."""

from __future__ import annotations

import time

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.engine import Budgets
from stalledpolicy.engine import calls as engine_calls
from stalledpolicy.lua import script
from tests.redis.engine_rows import put_active

pytestmark = pytest.mark.redis


def evalsha_calls(r) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_next_call_runs_while_the_last_is_counted(r, keys):
    for i in range(6):
        put_active(r, keys, f"JOB{i}")
    r.script_load(script("sweep").body)  # no NOSCRIPT reply among the counted calls
    r.config_resetstat()
    seen = []

    def on_call(result, _seconds):
        # while the first call is counted, the second has reached the server
        if not seen:
            deadline = time.monotonic() + 10
            while evalsha_calls(r) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        seen.append((result.recovered, evalsha_calls(r)))

    total = engine.drain(r, keys.queue, Budgets(2), 2, on_call=on_call)
    assert total.recovered == 6 and total.calls == 3
    # (evalsha_calls counts each call once Redis ran it; INFO itself is no EVALSHA)
    assert seen[0] == (2, 2)
    assert [recovered for recovered, _ in seen] == [2, 2, 2]


def test_a_client_subclass_sends_each_call_itself(redis_server, keys):
    """A subclass may change how its commands go out: the drain uses its
    methods, not a connection of its pool."""

    class Counting(redis.Redis):
        sent = 0

        def evalsha(self, *args, **kwargs):
            Counting.sent += 1
            return super().evalsha(*args, **kwargs)

    client = Counting(connection_pool=redis_server.client(decode_responses=True).connection_pool)
    client.flushall()
    for i in range(5):
        put_active(client, keys, f"JOB{i}")
    assert isinstance(engine_calls.script_calls("sweep", client, keys, [keys.active]), engine_calls.ScriptCalls)
    try:
        total = engine.drain(client, keys.queue, Budgets(2), 2)
    finally:
        client.close()
    assert total.recovered == 5 and Counting.sent == total.calls == 3


def test_script_cache_flushed_mid_drain(r, keys):
    for i in range(8):
        put_active(r, keys, f"JOB{i}")
    flushed = []

    def on_call(_result, _seconds):
        if not flushed:
            r.script_flush()
            flushed.append(True)

    total = engine.drain(r, keys.queue, Budgets(2), 2, on_call=on_call)
    assert total.recovered == 8 and total.calls == 4
    assert r.zcard(keys.active) == 0 and r.zcard(keys.pending) == 8


def test_a_call_that_came_back_is_counted_when_sending_the_next_fails(r, keys, monkeypatch):
    for i in range(6):
        put_active(r, keys, f"JOB{i}")
    sends = []
    real_send = engine_calls.HeldConnection.send

    def send(self, args):
        sends.append(args)
        if len(sends) == 2:
            raise redis.ConnectionError("the connection broke")
        real_send(self, args)

    monkeypatch.setattr(engine_calls.HeldConnection, "send", send)
    told = []
    with pytest.raises(redis.ConnectionError, match="broke"):
        engine.drain(r, keys.queue, Budgets(2), 2, on_call=lambda result, _s: told.append(result.recovered))
    assert told == [2] and r.zcard(keys.active) == 4


def test_a_failed_read_fails_the_drain_and_the_next_drain_counts_exactly(r, keys, monkeypatch):
    """The second call's read fails (as on a socket timeout) with its reply
    still on the way: the drain raises after counting the first call, and the
    next drain counts exactly what it moves (no reply of the lost call read as
    its own; that the connection is closed at once: the test below)."""
    for i in range(10):
        put_active(r, keys, f"JOB{i}")

    def read_response(self, *args, **kwargs):
        # the first read once patched: the drain's, of its second call
        raise redis.TimeoutError("timed out")  # the reply is left unread

    told = []

    def on_call(result, _seconds):
        told.append(result.recovered)
        monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)

    with pytest.raises(redis.TimeoutError):
        engine.drain(r, keys.queue, Budgets(2), 2, on_call=on_call)
    monkeypatch.undo()
    assert told == [2]
    # the second call ran (its reply was lost): 6 jobs left, drained and counted exactly
    assert r.zcard(keys.active) == 6
    again = engine.drain(r, keys.queue, Budgets(2), 2)
    assert again.recovered == 6 and again.calls == 3 and r.zcard(keys.active) == 0


def test_held_connection_closes_on_a_failed_read(r, keys, monkeypatch):
    """Closed at once, not when the pool next hands it out (redis-py then drops
    a connection with data waiting, but a reply still on its way has none yet)."""
    put_active(r, keys, "JOB1")
    call = engine.sweep.SweepCall(keys.queue, Budgets(2))
    held = engine_calls.script_calls("sweep", r, call.keys, call.key_names)
    assert isinstance(held, engine_calls.HeldConnection)
    held._connection.send_command("CLIENT", "ID")
    own_id = str(held._connection.read_response())
    held.send(call.args(10))
    monkeypatch.setattr(held._connection, "read_response", lambda *a, **k: (_ for _ in ()).throw(
        redis.TimeoutError("timed out")))
    with pytest.raises(redis.TimeoutError):
        held.receive()
    monkeypatch.undo()
    deadline = time.monotonic() + 10
    while own_id in {c["id"] for c in r.client_list()} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert own_id not in {c["id"] for c in r.client_list()}
    held.close()
