"""A three-node Redis Cluster on loopback: every queue lives in one slot (its
hash tag), queues spread over the nodes, and the sweep, the snapshot and every
morgue operation work there as on a single server."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ, read_state
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.redis_url import errors
from tests.redis.engine_rows import put_active, put_dead

pytestmark = pytest.mark.redis

BUDGETS = engine.Budgets(default=2, lanes={"vip": 0, "bulk": 1})


@pytest.fixture(params=[True, False], ids=["decoded", "raw"])
def cc(redis_cluster, request):
    client = redis_cluster.client(decode_responses=request.param)
    client.flushall()  # every primary
    yield client
    client.close()


def queues_on_every_node(client, per_node: int = 1) -> dict[int, list[str]]:
    """Queue names whose slot lands on each primary (port -> names)."""
    ports = {node.port for node in client.get_primaries()}
    found: dict[int, list[str]] = {port: [] for port in ports}
    for i in itertools.count():
        name = f"orders-{i}"
        port = client.get_node_from_key(QueueKeys(name).active).port
        if len(found[port]) < per_node:
            found[port].append(name)
        if all(len(names) >= per_node for names in found.values()):
            return found
        assert i < 10_000


def _node_client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def test_the_cluster_has_three_primaries_sharing_every_slot(redis_cluster):
    client = redis_cluster.client(decode_responses=True)
    primaries = client.get_primaries()
    assert len(primaries) == 3
    info = _node_client(primaries[0].port).cluster("info")
    assert info["cluster_state"] == "ok" and int(info["cluster_slots_assigned"]) == 16384
    client.close()


def test_sweep_snapshot_and_morgue_on_queues_spread_over_the_nodes(cc, redis_cluster):
    placement = queues_on_every_node(cc)
    assert len(placement) == 3
    for port, (queue,) in placement.items():
        mq = EchoMQ(cc, queue)
        k = mq.keys
        # live traffic: flat and grouped work, a lane at its limit, a paused lane
        mq.set_lane_limit("bulk", 1)
        mq.enqueue_many(3)
        mq.enqueue_many(2, group="bulk")
        mq.enqueue_many(2, group="vip")
        mq.enqueue_many(1, group="held")
        held = [mq.claim(60_000, "any") for _ in range(5)]
        assert all(held)
        mq.pause("held")
        # what a dead worker fleet leaves behind, on top
        seeded = mq.seed_stalled(300, groups=["bulk", "vip", "plain"], budget=BUDGETS.default,
                                 lane_budgets=BUDGETS.lanes, at_budget_fraction=0.3)
        for claim in held[:3]:
            mq.expire(claim)
        expired = 300 + 3
        assert mq.audit() == []

        # the data of this queue lives on its own node, all of it
        node = _node_client(port)
        assert node.zcard(k.active) == expired + 2
        node.close()

        swept = engine.drain(cc, queue, BUDGETS, 50)
        assert swept.recovered + swept.dead_lettered == expired
        assert swept.calls >= expired // 50
        assert swept.dead_lettered >= len(seeded.at_budget)
        assert mq.audit() == []
        state = read_state(cc, queue)
        assert len(state.active) == 2 and len(state.dead) == swept.dead_lettered

        snap = engine.queue_snapshot(cc, queue, lanes=["bulk", "vip"])
        assert (snap.active, snap.dead) == (2, swept.dead_lettered)
        assert (snap.recovered_total, snap.dead_lettered_total) == (swept.recovered, swept.dead_lettered)
        assert {lane.name: lane.dead_lettered_total for lane in snap.lanes} == {
            name: swept.lanes[name].dead_lettered for name in ("bulk", "vip")}
        assert snap.lanes[1].dead_lettered_total == 0  # vip: budget 0, never dead-lettered

        stats = engine.morgue_stats(cc, queue)
        assert stats.size == swept.dead_lettered
        assert sum(stats.lanes.values()) == stats.size and "vip" not in stats.lanes
        assert stats.oldest_dead_at_ms is not None
        listed = engine.morgue_list(cc, queue, lane="bulk", limit=1_000)
        assert {job.id for job in listed} == {j for j in state.dead if state.rows[j].group == "bulk"}
        assert all(job.last_error == "stalled" and job.lane == "bulk" for job in listed)

        # replay one lane: back to the lane (with the ring rule), stall count reset
        replayed = engine.morgue_replay(cc, queue, lane="bulk")
        assert replayed.replayed == len(listed) and replayed.lanes == {"bulk": len(listed)}
        after = read_state(cc, queue)
        assert set(replayed.ids) <= set(after.lanes["bulk"])
        assert all(after.rows[j].state == "pending" and after.rows[j].stalled in (None, "0")
                   for j in replayed.ids)
        assert mq.audit() == []

        # purge the rest (dry run first: nothing moves)
        rest = engine.morgue_stats(cc, queue).size
        assert engine.morgue_purge(cc, queue, dry_run=True).purged == rest
        assert engine.morgue_stats(cc, queue).size == rest
        purged = engine.morgue_purge(cc, queue, older_than_s=0)
        assert purged.purged == rest
        mq.ledger.retire(purged.ids)
        assert engine.morgue_stats(cc, queue).size == 0
        assert all(not cc.exists(k.job(j)) for j in purged.ids)
        assert mq.audit() == []

        # workers carry on: the ring serves the replayed lane
        claim = mq.claim(60_000, "grouped")
        assert claim is not None
        assert mq.complete(claim) is True
        assert mq.audit() == []


def test_one_script_call_per_queue_never_crosses_slots(cc):
    """Each queue's sweep touches only its own slot: draining one queue leaves
    a queue on another node untouched."""
    placement = queues_on_every_node(cc)
    first, second = [names[0] for names in list(placement.values())[:2]]
    mq_first, mq_second = EchoMQ(cc, first), EchoMQ(cc, second)
    mq_first.seed_stalled(50)
    mq_second.seed_stalled(50)
    before = read_state(cc, second)
    engine.drain(cc, first, BUDGETS, 10)
    assert read_state(cc, first).active == {}
    assert read_state(cc, second) == before
    engine.drain(cc, second, BUDGETS, 10)
    assert mq_first.audit() == [] and mq_second.audit() == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    return subprocess.run([sys.executable, "-m", "stalledpolicy", *args], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_cli_sweeps_and_replays_through_any_node(redis_cluster):
    """The commands are pointed at one node; the queues live on the others."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    entry = redis_cluster.nodes[0]
    elsewhere = [names[0] for port, names in queues_on_every_node(client).items() if port != entry.port]
    assert len(elsewhere) == 2
    for queue in elsewhere:
        mq = EchoMQ(client, queue)
        seeded = mq.seed_stalled(120, groups=["bulk", "plain"], budget=2, lane_budgets={"bulk": 1},
                                 at_budget_fraction=0.25)
        swept = _cli("sweep", "--once", "--redis-url", entry.url, "--queue", queue,
                     "--max-stalled", "2", "--lane", "bulk=1", "--batch-size", "25")
        assert swept.returncode == 0, swept.stderr
        state = read_state(client, queue)
        assert state.active == {} and set(state.dead) == seeded.at_budget
        assert mq.audit() == []

        stats = _cli("morgue", "stats", "--redis-url", entry.url, "--queue", queue, "-o", "json")
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["size"] == len(seeded.at_budget)
        replay = _cli("morgue", "replay", "--redis-url", entry.url, "--queue", queue, "--all", "--yes")
        assert replay.returncode == 0, replay.stderr
        after = read_state(client, queue)
        assert after.dead == {}
        assert all(after.rows[j].state == "pending" for j in seeded.at_budget)
        assert mq.audit() == []
    client.close()


def test_the_audit_reads_a_queue_whole_on_a_cluster_both_ways(cc):
    placement = queues_on_every_node(cc)
    for (queue,) in placement.values():
        mq = EchoMQ(cc, queue)
        mq.seed_stalled(200, groups=["a"])
        mq.enqueue_many(3, group="b")
        assert read_state(cc, queue, atomic=False) == read_state(cc, queue, atomic=True)
        assert mq.audit() == []


def test_a_change_is_never_resent_on_a_cluster_either(redis_cluster):
    """RedisCluster resends a command after a timeout on its own (3 attempts):
    the morgue's changes and the operator's replay ask for a single attempt,
    and get it there too; reads keep the cluster's retries (failovers)."""
    from stalledpolicy.redis_url.connecting import connect, single_attempt

    changes = connect(redis_cluster.url, retry=single_attempt())
    reads = connect(redis_cluster.url)
    try:
        assert isinstance(changes, redis.RedisCluster) and changes.retry.get_retries() == 0
        assert reads.retry.get_retries() > 0
        assert changes.ping()
    finally:
        changes.close()
        reads.close()


# ------------------------------------------------- a slot being migrated


@contextlib.contextmanager
def slot_migrating(client, queue: str, moved: list[str]):
    """The slot of ``queue`` half-way through a resharding: MIGRATING on its
    node, IMPORTING on another, and the keys ``moved`` already sent there
    (what redis-cli --cluster reshard does, a batch of keys at a time). The
    slot is stable and every key back on its node afterwards."""
    keys = QueueKeys(queue)
    slot = client.keyslot(keys.active)
    source = client.get_node_from_key(keys.active)
    target = next(node for node in client.get_primaries() if node.port != source.port)
    src = _node_client(source.port)
    dst = redis.Redis(host="127.0.0.1", port=target.port)  # DUMP payloads are bytes
    src_id, dst_id = src.cluster("myid"), dst.cluster("myid").decode()
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    try:
        for key in moved:
            src.execute_command("MIGRATE", "127.0.0.1", target.port, key, 0, 5000)
        yield src
    finally:
        dumps = {}
        for key in moved:  # back to the node that owns the slot
            pipe = dst.pipeline(transaction=False)
            pipe.execute_command("ASKING")
            pipe.execute_command("DUMP", key)
            pipe.execute_command("ASKING")
            pipe.execute_command("DEL", key)
            dumps[key] = pipe.execute()[1]
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        for key, dump in dumps.items():
            if dump is not None:
                src.restore(key, 0, dump, replace=True)
        dst.close()
        src.close()


def refused_on_the_importing_node(redis_cluster) -> str:
    """The words a script's command is refused with on the importing node when
    it names a key not moved yet with one that has (lib/refusals, here): Redis
    words it as it does a key on the other node, Valkey 8 names the migration.
    Either must read to the sweeper and the CLI as a slot being migrated."""
    return {"redis": "non local key",
            "valkey": "undeclared keys were accessed during rehashing of the slot"}[
        redis_cluster.nodes[0].binaries.name]


def _every_shared_key(client, keys: QueueKeys) -> None:
    """Each key a script declares exists (so the call runs on the slot's node
    while the slot migrates: a missing declared key is redirected instead)."""
    client.zadd(keys.pending, {"JOB-waiting": 0})
    client.hset(keys.job("JOB-waiting"), mapping={"state": "pending", "attempts": "0"})
    put_active(client, keys, "JOB-running", score=2**50)  # a lease running for ever
    client.rpush(keys.ring, "other")
    client.lpush(keys.wake, "1")
    client.hset(keys.gactive, "other", 1)
    client.hset(keys.glimit, "other", 5)
    client.sadd(keys.paused, "paused-lane")
    client.hset(keys.metrics_failed, "count", 0)
    client.hset(keys.sweeper_totals, "recovered", 0)
    client.zadd(keys.sweeper_holds, {"JOB-running": 2**50})  # a hold never due
    client.hset(keys.sweeper_hold_tokens, "JOB-running", "0")


def _queue_dump(client, keys: QueueKeys, ids) -> dict:
    return {
        "active": client.zrange(keys.active, 0, -1, withscores=True),
        "pending": client.zrange(keys.pending, 0, -1),
        "dead": client.zrange(keys.dead, 0, -1),
        "rows": {job_id: client.hgetall(keys.job(job_id)) for job_id in ids},
    }


def _three_stalled_jobs(redis_cluster, queue: str):
    """A flushed cluster with three stalled jobs of ``queue``, every shared key
    present and one job already in the morgue: (client, keys, stalled ids)."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    keys = QueueKeys(queue)
    ids = ["JOB1", "JOB2", "JOB3"]
    for job_id in ids:
        put_active(client, keys, job_id)
    _every_shared_key(client, keys)
    client.zadd(keys.dead, {"JOB-old": 0})
    return client, keys, ids


def test_a_sweep_while_the_queue_slot_migrates_moves_all_or_nothing(redis_cluster):
    """A row already moved to the importing node is refused inside the script
    ('Script attempted to access a non local key'). That refusal used to come
    after the batch left `active`: the jobs before it were half-recovered (row
    rewritten, in no set) and every job of the batch was lost. The sweep now
    reads every row before its first write, so the call moves nothing and the
    next pass, once the slot has moved, recovers them all."""
    client, keys, ids = _three_stalled_jobs(redis_cluster, "migrating-sweep")
    queue = keys.queue
    client.hset(keys.job("JOB-old"), mapping={"state": "dead", "attempts": "1"})
    with slot_migrating(client, queue, [keys.job("JOB2")]) as node:
        before = _queue_dump(node, keys, ["JOB1", "JOB3"])
        with pytest.raises(redis.ResponseError, match="non local key"):
            engine.sweep_batch(client, queue, BUDGETS, 100)
        assert _queue_dump(node, keys, ["JOB1", "JOB3"]) == before
    result = engine.sweep_batch(client, queue, BUDGETS, 100)
    assert result.recovered == 3
    assert client.zrange(keys.pending, 0, -1) == ["JOB-waiting", *ids]
    client.close()


def test_a_grouped_sweep_while_the_lane_key_migrates_moves_nothing(redis_cluster):
    """A lane key the call would fill, or ask for work, may have moved too."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    queue = "migrating-lane"
    keys = QueueKeys(queue)
    put_active(client, keys, "JOB1", group="g")
    put_active(client, keys, "JOB2")
    client.zadd(keys.lane_pending("g"), {"JOB0": 0})
    client.hset(keys.job("JOB0"), mapping={"state": "pending", "attempts": "0", "group": "g"})
    _every_shared_key(client, keys)
    client.zadd(keys.dead, {"JOB-old": 0})
    with slot_migrating(client, queue, [keys.lane_pending("g")]) as node:
        before = _queue_dump(node, keys, ["JOB1", "JOB2"])
        gactive = node.hgetall(keys.gactive)
        with pytest.raises(redis.ResponseError, match=refused_on_the_importing_node(redis_cluster)) as refusal:
            engine.sweep_batch(client, queue, BUDGETS, 100)
        assert errors.is_slot_migrating(refusal.value), str(refusal.value)
        assert _queue_dump(node, keys, ["JOB1", "JOB2"]) == before
        assert node.hgetall(keys.gactive) == gactive
    result = engine.sweep_batch(client, queue, BUDGETS, 100)
    assert result.recovered == 2 and result.quarantined == 0
    assert client.zrange(keys.lane_pending("g"), 0, -1) == ["JOB0", "JOB1"]
    client.close()


@pytest.mark.parametrize("change", ["replay", "purge"])
def test_a_morgue_change_while_the_queue_slot_migrates_changes_nothing(redis_cluster, change):
    """The replay used to take the first jobs out of `dead` and rewrite their
    rows before meeting the moved row: those jobs were in no set."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    queue = f"migrating-{change}"
    keys = QueueKeys(queue)
    ids = ["JOB1", "JOB2", "JOB3"]
    for job_id in ids:
        put_dead(client, keys, job_id)
    _every_shared_key(client, keys)
    with slot_migrating(client, queue, [keys.job("JOB2")]) as node:
        before = _queue_dump(node, keys, ["JOB1", "JOB3"])
        with pytest.raises(redis.ResponseError, match="non local key"):
            if change == "replay":
                engine.morgue_replay(client, queue)
            else:
                engine.morgue_purge(client, queue)
        assert _queue_dump(node, keys, ["JOB1", "JOB3"]) == before
    if change == "replay":
        assert engine.morgue_replay(client, queue).replayed == 3
        assert client.zrange(keys.pending, 0, -1) == ["JOB-waiting", *ids]
    else:
        assert engine.morgue_purge(client, queue).purged == 3
    assert client.zcard(keys.dead) == 0
    client.close()


@pytest.mark.parametrize("moved", ["log lines", "everything but the log lines"])
def test_a_purge_while_the_slot_migrates_never_leaves_log_lines_behind(redis_cluster, moved):
    """The log lines (job:<id>:logs) already on the other node, or not yet there
    while the call is redirected to it: deleted apart from the row, they were
    left with no job, silently. The call is refused with nothing changed."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    queue = "migrating-logs"
    keys = QueueKeys(queue)
    put_dead(client, keys, "JOB1")
    client.rpush(keys.job("JOB1") + ":logs", "line 1", "line 2")
    _every_shared_key(client, keys)
    logs = [keys.job("JOB1") + ":logs"]
    rest = [keys.dead, keys.sweeper_totals, keys.job("JOB1"), keys.pending, keys.prefix + "schedule"]
    with slot_migrating(client, queue, logs if moved == "log lines" else rest):
        with pytest.raises(redis.ResponseError) as refusal:
            engine.morgue_purge(client, queue, ids=["JOB1"])
        assert errors.is_slot_migrating(refusal.value), str(refusal.value)
    assert client.zrange(keys.dead, 0, -1) == ["JOB1"] and client.exists(keys.job("JOB1"), *logs) == 2
    assert engine.morgue_purge(client, queue, ids=["JOB1"]).purged == 1
    assert client.exists(keys.job("JOB1"), *logs) == 0
    client.close()


def _asking(port: int, *command):
    """One command on the importing node of a migrating slot (ASKING first)."""
    node = _node_client(port)
    try:
        pipe = node.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.execute_command(*command)
        return pipe.execute()[1]
    finally:
        node.close()


def test_a_sweep_on_the_importing_node_never_takes_a_row_left_behind_for_gone(redis_cluster):
    """Every key the sweep declares has moved, so the call is redirected (ASK)
    to the importing node; some rows have not moved yet. There Redis answers a
    command on such a row alone as if the row did not exist: the sweep took
    those jobs for completed ones (orphans), dropped their `active` entries and
    lost them once their rows arrived. A row's absence is now asked together
    with `active` (refused there while the slot migrates): nothing moves."""
    client, keys, ids = _three_stalled_jobs(redis_cluster, "importing-sweep")
    queue = keys.queue
    declared = [keys.active, keys.pending, keys.dead, keys.ring, keys.gactive, keys.glimit, keys.paused,
                keys.wake, keys.metrics_failed, keys.sweeper_totals, keys.sweeper_holds, keys.sweeper_hold_tokens]
    target_port = next(node.port for node in client.get_primaries()
                       if node.port != client.get_node_from_key(keys.active).port)
    with slot_migrating(client, queue, [*declared, keys.job("JOB1")]) as node:
        with pytest.raises(redis.ResponseError, match=refused_on_the_importing_node(redis_cluster)) as refusal:
            engine.sweep_batch(client, queue, BUDGETS, 100)
        assert errors.is_slot_migrating(refusal.value), str(refusal.value)
        active = _asking(target_port, "ZRANGE", keys.active, 0, -1)
        assert active == [*ids, "JOB-running"]
        assert _asking(target_port, "HGETALL", keys.job("JOB1"))["state"] == "active"
        assert node.hgetall(keys.job("JOB2"))["state"] == "active"
    result = engine.sweep_batch(client, queue, BUDGETS, 100)
    assert (result.recovered, result.orphans) == (3, 0)
    client.close()


def test_a_purge_on_the_importing_node_leaves_no_row_behind(redis_cluster):
    """A purge there took a row left behind for a missing one: it removed the
    entry, and the row arrived later in no set (a ghost)."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    queue = "importing-purge"
    keys = QueueKeys(queue)
    client.zadd(keys.dead, {"JOB1": 0})
    client.hset(keys.job("JOB1"), mapping={"payload": "p"})  # a row EchoMQ left without a state
    client.hset(keys.sweeper_totals, "purged", 0)
    with slot_migrating(client, queue, [keys.dead, keys.sweeper_totals]):
        with pytest.raises(redis.ResponseError, match=refused_on_the_importing_node(redis_cluster)) as refusal:
            engine.morgue_purge(client, queue, ids=["JOB1"])
        assert errors.is_slot_migrating(refusal.value), str(refusal.value)
    assert engine.morgue_purge(client, queue, ids=["JOB1"]).purged == 1
    assert client.exists(keys.job("JOB1")) == 0 and client.zcard(keys.dead) == 0
    client.close()


def morgue_of_three(redis_cluster, queue, group):
    """A flushed cluster whose ``queue`` has JOB1-3 in its morgue, in lane ``group``
    (None: no lane): (client, queue, keys)."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    keys = QueueKeys(queue)
    for job_id in ("JOB1", "JOB2", "JOB3"):
        put_dead(client, keys, job_id, group=group)
    return client, queue, keys


def test_the_morgue_scan_never_takes_a_row_that_moved_for_a_missing_one(redis_cluster):
    """`dead` has moved, so `list` and `stats` are redirected (ASK) to the
    importing node, where the rows not moved yet answered EXISTS alone as
    absent: `morgue list` showed "job row is missing" for rows that had only
    not moved yet. The scan now asks a row's absence with `dead` (lib/refusals,
    here), as the replay and the purge do: the call is refused, and the CLI
    says the slot is migrating."""
    client, queue, keys = morgue_of_three(redis_cluster, "importing-scan", "g")
    with slot_migrating(client, queue, [keys.dead, keys.job("JOB1")]):
        for read in (engine.morgue_list, engine.morgue_stats):
            with pytest.raises(redis.ResponseError, match=refused_on_the_importing_node(redis_cluster)) as refusal:
                read(client, queue)
            assert errors.is_slot_migrating(refusal.value), str(refusal.value)
        for action in ("list", "stats", "replay", "purge"):
            selection = ("--all", "--yes") if action in ("replay", "purge") else ()
            result = _cli("morgue", action, "--redis-url", redis_cluster.url, "--queue", queue, *selection)
            assert result.returncode == 1, (action, result.stdout, result.stderr)
            assert "missing" not in result.stdout + result.stderr
            assert f"the slot of queue {queue} is being migrated" in result.stderr, result.stderr
            assert ("nothing was changed" in result.stderr) == (action in ("replay", "purge"))
    # on the node the slot is leaving, a row already moved is refused too (never "malformed")
    with slot_migrating(client, queue, [keys.job("JOB2")]):
        with pytest.raises(redis.ResponseError, match="non local key"):
            engine.morgue_list(client, queue)
        result = _cli("morgue", "list", "--redis-url", redis_cluster.url, "--queue", queue)
        assert result.returncode == 1 and "is being migrated" in result.stderr, result.stderr
    assert [(job.id, job.lane, job.problem) for job in engine.morgue_list(client, queue)] == [
        (job_id, "g", None) for job_id in ("JOB1", "JOB2", "JOB3")]
    assert engine.morgue_stats(client, queue).lanes == {"g": 3}
    client.close()


# ------------------------------------------------------- read-only script calls


class _NodeStats:
    """INFO commandstats and errorstats summed over a cluster's nodes, through
    connections opened once (a new connection's handshake itself adds errors)."""

    def __init__(self, cluster) -> None:
        self.direct = [_node_client(node.port) for node in cluster.nodes]

    def reset(self) -> None:
        for direct in self.direct:
            direct.config_resetstat()

    def __call__(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for direct in self.direct:
            for section in ("commandstats", "errorstats"):
                for name, value in direct.info(section).items():
                    total[name] = total.get(name, 0) + int(value.get("calls", value.get("count", 0)))
        return total

    def close(self) -> None:
        for direct in self.direct:
            direct.close()


def _dead_on_every_node(client) -> list[str]:
    queues = [names[0] for names in queues_on_every_node(client).values()]
    for queue in queues:
        for job_id in ("JOB1", "JOB2"):
            put_dead(client, QueueKeys(queue), job_id, group="g")
    return queues


def test_the_morgue_reads_go_to_their_slot_without_asking_the_server_for_keys(redis_cluster):
    """redis-py's RedisCluster routes only EVAL/EVALSHA by their keys itself:
    EVALSHA_RO cost two COMMAND GETKEYS round trips per call. The read-only
    calls now go to the node of the queue's slot directly."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    queues = _dead_on_every_node(client)
    counted = _NodeStats(redis_cluster)
    for direct in counted.direct:
        direct.script_flush()  # earlier tests of the session cached the script
    counted.reset()
    _read_every_morgue(client, queues, times=3)
    stats = counted()
    assert stats.get("cmdstat_command|getkeys", 0) == 0, stats
    # one NOSCRIPT per node (the script loaded by EVAL_RO), then cached
    assert stats.get("cmdstat_evalsha_ro", 0) == 2 * 3 * len(queues)
    assert stats.get("cmdstat_eval_ro", 0) == len(queues)
    assert stats.get("cmdstat_evalsha", 0) == 0
    # each read ran on the queue's own node
    for queue in queues:
        node = _node_client(client.get_node_from_key(QueueKeys(queue).dead).port)
        assert node.info("commandstats")["cmdstat_evalsha_ro"]["calls"] == 6
        node.close()
    counted.close()
    client.close()


def _read_every_morgue(client, queues, times):
    """``morgue list`` and ``stats`` of each queue (two dead jobs of lane g), ``times`` over."""
    for _ in range(times):
        for queue in queues:
            assert [job.id for job in engine.morgue_list(client, queue)] == ["JOB1", "JOB2"]
            assert engine.morgue_stats(client, queue).lanes == {"g": 2}


@pytest.fixture(scope="module")
def cluster_without_read_only_eval(server_binaries):
    """Redis 6.2 is not installed here: a real Redis 7 cluster whose nodes lack
    EVALSHA_RO and EVAL_RO (rename-command to "") stands in for it. As on 6.2,
    the server says "unknown command" and COMMAND does not list them, so
    redis-py's RedisCluster refused EVALSHA_RO itself ("EVALSHA_RO command
    doesn't exist in Redis commands", a plain RedisError). Unlike 6.2 these nodes
    still read the shebang; the unit tests cover a body refused for it."""
    import shutil

    from stalledpolicy.devenv.redis_server import start_cluster

    cluster = start_cluster(3, ["--rename-command", "EVALSHA_RO", "", "--rename-command", "EVAL_RO", ""],
                            binaries=server_binaries)
    yield cluster
    cluster.stop()
    for node in cluster.nodes:
        shutil.rmtree(node.workdir, ignore_errors=True)


def test_without_evalsha_ro_the_morgue_reads_fall_back_once_per_client(cluster_without_read_only_eval):
    """Failed before: every list/stats on such a cluster raised redis-py's
    RedisError, and `morgue list`/`stats` exited 1."""
    cluster = cluster_without_read_only_eval
    client = cluster.client(decode_responses=True)
    client.flushall()
    queues = _dead_on_every_node(client)  # also connects the client to every node
    counted = _NodeStats(cluster)
    counted.reset()
    _read_every_morgue(client, queues, times=3)
    stats = counted()
    # one refused EVALSHA_RO for this client (unknown command: an ERR), then EVALSHA only
    assert stats.get("errorstat_ERR", 0) == 1, stats
    assert stats.get("cmdstat_evalsha", 0) == 2 * 3 * len(queues)
    assert stats.get("cmdstat_command|getkeys", 0) == 0, stats
    # a new client decides again, once
    other = cluster.client(decode_responses=True)
    other.ping(target_nodes=other.ALL_NODES)
    before = counted().get("errorstat_ERR", 0)
    for queue in queues:
        assert engine.morgue_stats(other, queue).size == 2
    assert counted().get("errorstat_ERR", 0) == before + 1
    other.close()
    counted.close()
    for action in ("list", "stats"):
        result = _cli("morgue", action, "--redis-url", cluster.url, "--queue", queues[0], "-o", "json")
        assert result.returncode == 0, (action, result.stderr)
    client.close()
