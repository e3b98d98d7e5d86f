"""``-o json`` of a replay or purge that ends early or on an error: one
document, in the shape of every other run, saying what changed (against a
real redis-server; failures the test cannot cause for real are raised by a
wrapped engine call)."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.morgue import cli as morgue_cli
from tests.redis.test_morgue_cli import _args, bury, dump, standard_morgue

SHAPE = {"queue", "action", "dry_run", "purged", "ids", "lanes", "unreadable", "missing", "refused", "vanished",
         "problems",
         "stopped_early", "signal", "not_reached", "undated", "undated_dated", "undatable", "error",
         "outcome_unknown"}


@pytest.fixture
def url(redis_server):
    return redis_server.url


def run_json(url, queue, *action):
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(_args(*action, "-o", "json", "--redis-url", url, "--queue", queue),
                          stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def wrap_purge(monkeypatch, on_call):
    """engine.morgue_purge, with ``on_call(dry_run, result)`` after each call's progress."""
    real = engine.morgue_purge

    def purge(*args, dry_run=False, progress=None, **kwargs):
        def after(result):
            if progress is not None:
                progress(result)
            on_call(dry_run, result)
        if dry_run:
            on_call(dry_run, None)
        return real(*args, dry_run=dry_run, progress=after, **kwargs)

    monkeypatch.setattr(engine, "morgue_purge", purge)


@pytest.mark.parametrize("yes", [True, False])
def test_sigterm_before_the_change_prints_the_stopped_document_with_nothing_changed(
        r, url, queue_name, monkeypatch, yes):
    """It printed nothing on stdout and exited 143."""
    standard_morgue(r, queue_name)
    before = dump(r)

    def on_call(dry_run, result):
        if dry_run and result is None:
            os.kill(os.getpid(), signal.SIGTERM)  # during the preview

    wrap_purge(monkeypatch, on_call)
    code, out, err = run_json(url, queue_name, "purge", "--all", *(["--yes"] if yes else []))
    assert code == 143, err
    doc = json.loads(out)
    assert set(doc) == SHAPE
    assert doc["purged"] == 0 and doc["ids"] == [] and doc["dry_run"] is False
    assert doc["stopped_early"] is True and doc["signal"] == "SIGTERM"
    # not null: "error" is null on success only
    assert doc["error"] == "terminated (SIGTERM): nothing was changed" and doc["outcome_unknown"] is False
    assert "nothing was changed" in err
    assert dump(r) == before


def test_a_completed_change_has_the_same_shape(r, url, queue_name):
    standard_morgue(r, queue_name)
    code, out, _ = run_json(url, queue_name, "purge", "--all", "--yes")
    doc = json.loads(out)
    assert code == 0 and set(doc) == SHAPE and doc["error"] is None and doc["outcome_unknown"] is False


def test_an_unanswered_call_prints_what_the_answered_ones_changed(r, url, queue_name, monkeypatch):
    monkeypatch.setattr(engine.morgue, "MORGUE_BATCH", 2)
    for i in range(1, 6):
        bury(r, queue_name, f"JOB00{i}")

    def on_call(dry_run, result):
        if not dry_run and result is not None and len(result.ids) == 2:
            raise redis.TimeoutError("Timeout reading from socket")  # the next call went unanswered

    wrap_purge(monkeypatch, on_call)
    code, out, err = run_json(url, queue_name, "purge", "--all", "--yes")
    assert code == 5, err
    doc = json.loads(out)
    assert set(doc) == SHAPE
    assert doc["outcome_unknown"] is True and "outcome unknown" in doc["error"]
    assert doc["purged"] == 2 and doc["ids"] == ["JOB001", "JOB002"]


def test_a_slot_migration_refusal_prints_a_document_saying_so(r, url, queue_name, monkeypatch):
    standard_morgue(r, queue_name)
    before = dump(r)

    def on_call(dry_run, result):
        if dry_run and result is None:
            raise redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot")

    wrap_purge(monkeypatch, on_call)
    code, out, err = run_json(url, queue_name, "purge", "--all", "--yes")
    assert code == 1, err
    doc = json.loads(out)
    assert set(doc) == SHAPE and doc["purged"] == 0 and "being migrated" in doc["error"]
    assert dump(r) == before


def test_a_table_run_that_ends_on_an_error_prints_nothing_on_stdout(r, url, queue_name, monkeypatch):
    standard_morgue(r, queue_name)

    def on_call(dry_run, result):
        if dry_run and result is None:
            raise redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot")

    wrap_purge(monkeypatch, on_call)
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(_args("purge", "--all", "--yes", "--redis-url", url, "--queue", queue_name),
                          stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 1 and out.getvalue() == ""
    assert r.zcard(QueueKeys(queue_name).dead) == 6


# ------------------------------------------------------------ stats and list

STATS_SHAPE = {"queue", "size", "lanes", "oldest_dead_at_ms", "oldest_dead_at", "oldest_age_s", "unreadable",
               "error"}
LIST_SHAPE = {"queue", "lane", "total", "offset", "limit", "jobs", "error"}


@pytest.mark.parametrize("action, shape", [("stats", STATS_SHAPE), ("list", LIST_SHAPE)])
def test_a_view_prints_one_document_with_error_null_when_it_works(r, url, queue_name, action, shape):
    standard_morgue(r, queue_name)
    code, out, err = run_json(url, queue_name, action)
    doc = json.loads(out)
    assert code == 0 and set(doc) == shape and doc["error"] is None, err


@pytest.mark.parametrize("action, extra, shape", [
    ("stats", (), STATS_SHAPE), ("list", (), LIST_SHAPE), ("list", ("--lane", "a"), LIST_SHAPE)])
def test_a_view_that_fails_prints_a_document_with_the_error(r, url, queue_name, action, extra, shape):
    """`stats` and `list` printed nothing on stdout when they failed; a script
    reading `-o json` now gets one document, as from a replay or a purge."""
    r.set(QueueKeys(queue_name).dead, "not a sorted set")
    code, out, err = run_json(url, queue_name, action, *extra)
    assert code == 1, err
    doc = json.loads(out)
    assert set(doc) == shape and doc["queue"] == queue_name
    assert "EMQWRONGTYPE" in doc["error"] and "EMQWRONGTYPE" in err
    assert all(doc[k] is None for k in shape - {"queue", "lane", "offset", "limit", "error"})
    if action == "list":
        assert (doc["lane"], doc["offset"]) == (extra[1] if extra else None, 0) and doc["limit"] >= 1


@pytest.mark.parametrize("action", ["stats", "list"])
def test_a_view_of_an_unreachable_redis_prints_a_document_with_the_error(queue_name, action):
    code, out, err = run_json("redis://127.0.0.1:1/0", queue_name, action)
    assert code == 3, err
    doc = json.loads(out)
    assert "unreachable" in doc["error"] and doc["queue"] == queue_name


@pytest.mark.parametrize("action", ["stats", "list"])
def test_a_view_refused_for_bad_usage_prints_nothing(queue_name, action):
    code, out, err = run_json("http://127.0.0.1:1/0", queue_name, action)
    assert code == 2 and out == "", (out, err)


def test_a_view_stopped_by_a_signal_prints_a_document_saying_so(r, url, queue_name, monkeypatch):
    standard_morgue(r, queue_name)

    def stats(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM raised nothing")

    monkeypatch.setattr(engine, "morgue_stats", stats)
    code, out, err = run_json(url, queue_name, "stats")
    assert code == 143, err
    doc = json.loads(out)
    assert set(doc) == STATS_SHAPE and doc["error"] == "terminated (SIGTERM)" and doc["size"] is None
