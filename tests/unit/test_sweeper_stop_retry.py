"""A failed --once pass's log line names the exit it leads to, a stop
included (no Redis here; tests/redis/test_sweeper_settings_signals_and_lanes.py
runs the process; tests/redis/test_sweeper_single_attempt.py: the single
server's client makes one attempt per call)."""

from __future__ import annotations

import logging
import threading

import redis

from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import SweeperMetrics


def _once_sweeper(stop: threading.Event) -> loop.Sweeper:
    config = SweeperConfig(queue="orders", once=True)

    def connect(url):
        raise redis.TimeoutError("Timeout reading from socket")

    return loop.Sweeper(config, SweeperMetrics("orders", ()), stop=stop, connect_fn=connect)


def test_a_once_pass_failing_after_a_stop_does_not_say_exit_1(caplog):
    stop = threading.Event()
    stop.set()
    sweeper = _once_sweeper(stop)
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
    [record] = caplog.records
    assert "exits 1" not in record.getMessage() and "a signal came during the pass" in record.getMessage()


def test_a_once_pass_failing_without_a_stop_says_exit_1(caplog):
    sweeper = _once_sweeper(threading.Event())
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
    [record] = caplog.records
    assert record.getMessage().endswith("--once exits 1")


def test_a_missing_database_says_exit_2(caplog):
    config = SweeperConfig(queue="orders", once=True, redis_url="redis://127.0.0.1:1/16")

    def connect(url):
        raise redis.ResponseError("DB index is out of range")

    sweeper = loop.Sweeper(config, SweeperMetrics("orders", ()), connect_fn=connect)
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
    assert sweeper.bad_setting is not None
    [record] = caplog.records
    assert "--once exits 2" in record.getMessage() and "exits 1" not in record.getMessage()
