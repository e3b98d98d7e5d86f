"""``morgue list --lane`` walks the morgue once: the page and the lane's total
come from the same bounded calls (morgue_scan ``lane`` mode with ``total``),
where it walked it twice (the page, then ``morgue_stats`` for the total)."""

from __future__ import annotations

import io
import json

import pytest

from stalledpolicy import engine
from stalledpolicy.engine import morgue as morgue_engine
from stalledpolicy.morgue import cli as morgue_cli
from tests.redis.engine_rows import put_dead
from tests.redis.test_morgue_cli import _args

pytestmark = pytest.mark.redis


def mixed_morgue(r, keys) -> None:
    """Flat jobs, lanes a and b, rows missing or not a hash (in no lane), a hash
    holding none of the fields the scan reads (flat), a group that is empty (flat)."""
    for n in range(1, 15):
        job_id = f"JOB{n:02d}"
        if n % 5 == 0:
            r.zadd(keys.dead, {job_id: 0})  # row gone
        elif n == 7:
            r.set(keys.job(job_id), "x")  # not a hash
            r.zadd(keys.dead, {job_id: 0})
        elif n == 8:
            r.hset(keys.job(job_id), "payload", "p")  # only a payload: a flat job all the same
            r.zadd(keys.dead, {job_id: 0})
        elif n == 9:
            put_dead(r, keys, job_id, group="")
        else:
            put_dead(r, keys, job_id, group=(None, "a", "b")[n % 3], dead_at=10_000 - n)


@pytest.fixture
def scan_calls(monkeypatch):
    """The cursor (ARGV[3]) of every morgue_scan call, in order; a walk of the
    morgue starts at ''."""
    real = morgue_engine.run_script
    cursors: list = []

    def counting(name, client, keys, key_names, args):
        if name == "morgue_scan":
            cursors.append(args[2])
        return real(name, client, keys, key_names, args)

    monkeypatch.setattr(morgue_engine, "run_script", counting)
    return cursors


@pytest.mark.parametrize("output", ["table", "json"])
@pytest.mark.parametrize("lane, limit", [("a", 100), ("a", 1), ("nosuch", 100), ("", 2)])
def test_list_by_lane_walks_the_morgue_once(r, keys, redis_server, monkeypatch, scan_calls, output, lane, limit):
    mixed_morgue(r, keys)
    monkeypatch.setattr(morgue_engine, "MORGUE_BATCH", 3)
    monkeypatch.setattr(morgue_engine, "MORGUE_STATS_BATCH", 3)
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(_args("list", "--redis-url", redis_server.url, "--queue", keys.queue, "--lane", lane,
                                "--limit", str(limit), "-o", output), stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    # one walk, one call per window of 3 ids (14 ids: the fifth call finds the end)
    assert scan_calls.count("") == 1 and len(scan_calls) == 5, scan_calls
    total = engine.morgue_stats(r, keys.queue).lanes.get(lane, 0)
    if output == "json":
        doc = json.loads(out.getvalue())
        assert doc["total"] == total
        assert [job["id"] for job in doc["jobs"]] == [
            job.id for job in engine.morgue_list(r, keys.queue, lane=lane, limit=limit)]


def test_a_page_and_its_lane_total_read_as_the_list_and_the_stats_do_over_any_windows(r, keys, monkeypatch):
    """The total is what morgue_stats counts for the lane (the rule of lane_of:
    a row missing or not a hash is in no lane, flat included), whatever the
    page, and the page is morgue_list's."""
    mixed_morgue(r, keys)
    lanes = engine.morgue_stats(r, keys.queue).lanes
    assert lanes == {"": 5, "a": 3, "b": 3}
    for batch in (1, 2, 3, 500):
        monkeypatch.setattr(morgue_engine, "MORGUE_BATCH", batch)
        for lane in ("", "a", "b", "nosuch"):
            for offset in (0, 1, 4, 6):
                for limit in (1, 2, 100):
                    page = engine.morgue_page(r, keys.queue, lane=lane, limit=limit, offset=offset)
                    assert page == engine.MorguePage(
                        engine.morgue_list(r, keys.queue, lane=lane, limit=limit, offset=offset),
                        lanes.get(lane, 0)), (batch, lane, offset, limit)
    page = engine.morgue_page(r, keys.queue, limit=2, offset=13)
    assert page == engine.MorguePage(engine.morgue_list(r, keys.queue, limit=2, offset=13), 14)


def test_a_list_without_its_total_still_stops_once_the_page_is_full(r, keys, monkeypatch, scan_calls):
    mixed_morgue(r, keys)
    monkeypatch.setattr(morgue_engine, "MORGUE_BATCH", 3)
    assert [job.id for job in engine.morgue_list(r, keys.queue, lane="a", limit=1)] == ["JOB01"]
    assert len(scan_calls) == 1
