"""Who may read the morgue, and what a refusal says: a Redis user with
read-only key permissions, a user without the queue's keys, a read-only
replica; for the morgue CLI and the sweeper, against a real redis-server."""

from __future__ import annotations

import json
import logging

import pytest

from stalledpolicy.devenv.ports import free_port
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import SweeperMetrics
from tests.redis.test_morgue_cli import dump, morgue, standard_morgue


def user_url(redis_server, user: str) -> str:
    return redis_server.url.replace("redis://", f"redis://{user}:pw@", 1)


@pytest.fixture
def acl_user(r, redis_server):
    """``make(name, *rules)``: a user with password ``pw`` and +@all, its key
    rules as given; returns its URL."""
    made = []

    def make(name: str, *rules: str) -> str:
        r.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "+@all", *rules)
        made.append(name)
        return user_url(redis_server, name)

    yield make
    for name in made:
        r.acl_deluser(name)


def commandstat(r, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


# ------------------------------------------------------------ read-only user


def test_a_read_only_user_lists_and_shows_stats(r, acl_user, queue_name):
    """%R~emq:{q}:* was refused: 'this user has no permissions to access one of
    the keys used as arguments', exit 1 (EVALSHA's keys count as written)."""
    standard_morgue(r, queue_name)
    url = acl_user("reader", f"%R~emq:{{{queue_name}}}:*")
    before = commandstat(r, "evalsha_ro") + commandstat(r, "eval_ro")
    listed = morgue(url, "list", "--queue", queue_name, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)["jobs"]] == [f"JOB00{i}" for i in range(1, 7)]
    lane = morgue(url, "list", "--queue", queue_name, "--lane", "tenant-a")
    assert lane.returncode == 0, lane.stderr
    stats = morgue(url, "stats", "--queue", queue_name, "-o", "json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["lanes"] == {"": 2, "tenant-a": 3, "tenant-b": 1}
    # called read-only, as the script declares (#!lua flags=no-writes)
    assert commandstat(r, "evalsha_ro") + commandstat(r, "eval_ro") > before


def test_a_read_only_user_is_told_what_a_change_needs_and_nothing_changes(r, acl_user, queue_name):
    standard_morgue(r, queue_name)
    url = acl_user("reader", f"%R~emq:{{{queue_name}}}:*")
    before = dump(r)
    for action in (["replay", "--all"], ["purge", "--older-than", "1m"]):
        result = morgue(url, *action, "--queue", queue_name, "--yes", "-o", "json")
        assert result.returncode == 3, result.stderr
        prefix = f"emq:{{{queue_name}}}:"
        assert f"EMQNOPERM the Redis user may not read and write the queue's keys {prefix}*" in result.stderr
        assert f"ACL SETUSER <user> ~{prefix}* &{prefix}events +@all" in result.stderr
        assert "no permissions to access one of the keys" not in result.stderr
        doc = json.loads(result.stdout)
        assert doc["error"].startswith("Redis at ") and "EMQNOPERM" in doc["error"]
        assert doc["ids"] == [] and doc["outcome_unknown"] is False
    assert dump(r) == before


def test_a_user_without_the_queues_keys_is_named_the_pattern_to_grant(r, acl_user, queue_name):
    standard_morgue(r, queue_name)
    url = acl_user("stranger", "~other:*")
    for action in ("list", "stats"):
        result = morgue(url, action, "--queue", queue_name)
        assert result.returncode == 3, result.stderr  # a credentials problem, as the help says
        assert f"EMQNOPERM the Redis user may not read the queue's keys emq:{{{queue_name}}}:*" in result.stderr
        assert f"%R~emq:{{{queue_name}}}:*" in result.stderr
        assert "pw@" not in result.stderr


# ------------------------------------------------------------ read-only replica


@pytest.fixture
def replica(queue_name, server_binaries):
    """A server holding the standard morgue, then made a replica (of a primary
    it cannot reach: it keeps its data and refuses writes)."""
    server = start_redis(binaries=server_binaries)
    client = server.client(decode_responses=True)
    standard_morgue(client, queue_name)
    expire_one(client, queue_name)  # work for a sweep
    client.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "+@all", f"%R~emq:{{{queue_name}}}:*")
    client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    yield server, client
    client.close()
    server.stop()


def test_a_read_only_replica_lists_and_shows_stats_for_a_read_only_user(replica, queue_name):
    server, client = replica
    url = user_url(server, "reader")
    before = dump(client)
    listed = morgue(url, "list", "--queue", queue_name, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["jobs"]) == 6
    stats = morgue(server.url, "stats", "--queue", queue_name)
    assert stats.returncode == 0, stats.stderr
    assert dump(client) == before


# ------------------------------------------------------------ the sweeper


def sweeper_for(url: str, queue: str) -> loop.Sweeper:
    config = SweeperConfig(redis_url=url, queue=queue, once=True)
    return loop.Sweeper(config, SweeperMetrics(queue, ()))


def expire_one(r, queue: str) -> None:
    keys = QueueKeys(queue)
    r.hset(keys.job("JOB1"), mapping={"state": "active", "attempts": 1, "payload": "{}"})
    r.zadd(keys.active, {"JOB1": 1})


@pytest.mark.parametrize("rules", [["%R~emq:*"], ["~other:*"]], ids=["read-only", "no-keys"])
def test_the_sweeper_names_the_key_pattern_a_refused_user_needs(r, acl_user, queue_name, caplog, rules):
    expire_one(r, queue_name)
    before = dump(r)
    sweeper = sweeper_for(acl_user("sweeper", *rules), queue_name)
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
    sweeper.close()
    [record] = caplog.records
    prefix = f"emq:{{{queue_name}}}:"
    assert "refused by the Redis ACL" in record.getMessage() and "nothing was moved" in record.getMessage()
    assert record.error.startswith(f"EMQNOPERM the Redis user may not read and write the queue's keys {prefix}*")
    assert f"ACL SETUSER <user> ~{prefix}* &{prefix}events +@all" in record.error
    assert "EMQNOPERM" in sweeper.health.ready()[1]
    assert dump(r) == before


def test_the_sweeper_on_a_read_only_replica_names_it_and_the_fix(replica, queue_name, caplog):
    """It logged 'redis unreachable; the pass failed', though Redis answered."""
    server, client = replica
    sweeper = sweeper_for(server.url, queue_name)
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
        assert sweeper.sweep_pass() is False  # logged once
    sweeper.close()
    [record] = caplog.records
    message = record.getMessage()
    assert "read-only replica" in message and "point the URL at the primary" in message
    assert "unreachable" not in message
    ok, reason = sweeper.health.ready()
    assert not ok and "read-only replica" in reason and "unreachable" not in reason
    assert sweeper.metrics.redis_up.labels(queue_name)._value.get() == 1  # Redis answered


# ------------------------------------------------- a grant written before EVALSHA_RO


def test_a_user_granted_evalsha_but_not_evalsha_ro_still_lists_and_shows_stats(r, acl_user, redis_server,
                                                                               queue_name):
    """+evalsha without +evalsha_ro (and eval_ro) was refused: NOPERM, exit 3.
    EVALSHA_RO is refused once per client, then the script goes by EVALSHA."""
    import redis as redis_py

    from stalledpolicy import engine

    standard_morgue(r, queue_name)
    url = acl_user("legacy-grant", f"~emq:{{{queue_name}}}:*", "-evalsha_ro", "-eval_ro")
    listed = morgue(url, "list", "--queue", queue_name, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)["jobs"]] == [f"JOB00{i}" for i in range(1, 7)]
    stats = morgue(url, "stats", "--queue", queue_name, "-o", "json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["lanes"] == {"": 2, "tenant-a": 3, "tenant-b": 1}

    def refused() -> int:
        return int(r.info("commandstats").get("cmdstat_evalsha_ro", {}).get("rejected_calls", 0))

    client = redis_py.Redis.from_url(url, decode_responses=True)
    before = refused()
    for _ in range(3):
        assert engine.morgue_stats(client, queue_name).size == 6
        assert len(engine.morgue_list(client, queue_name)) == 6
    assert refused() == before + 1
    client.close()
