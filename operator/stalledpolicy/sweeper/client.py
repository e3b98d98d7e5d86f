"""The sweeper's Redis client: a plain ``Redis`` that makes one attempt per
call, or a Redis Cluster client that makes no new attempt once a stop was
requested (a signal) and reports each round trip, so the loop's heartbeat
stays fresh while it waits on a node that stopped answering (see
HEALTH_FLOOR_S in loop.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from stalledpolicy.redis_url import connecting

CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0


class _AttemptReportingPool(redis.ConnectionPool):
    """A cluster node's connection pool that calls ``on_attempt()`` each time a
    round trip takes a connection (:class:`StoppableRedisCluster` says why)."""

    def __init__(self, *args: Any, on_attempt: Callable[[], None], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._on_attempt = on_attempt

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self._on_attempt()
        return super().get_connection(*args, **kwargs)


class _StopRequested(Exception):
    """The failure of a cluster attempt that ended after a stop was requested, on
    its way through RedisCluster's retry loop: that loop sends again only errors
    of its own types (``RedisCluster.ERRORS_ALLOW_RETRY``), which this is not.
    :meth:`StoppableRedisCluster.execute_command` raises ``error`` in its place."""

    def __init__(self, error: Exception):
        super().__init__(error)
        self.error = error


class StoppableRedisCluster(RedisCluster):
    """redis-py's RedisCluster, with no new attempt once ``should_stop()`` says a
    stop was requested: the attempt in flight ends (its answer, or its timeout)
    and its error is raised as is (a single server's client makes one attempt anyway).

    A ``retry`` cannot do it here: RedisCluster reads its ``retry`` only for the
    number of retries, once when a command starts (``_internal_execute_command``),
    then sends the command again after each timeout or lost connection (10 times
    by default, refreshing the slot table in between). A SIGTERM to a sweeper
    whose queue's node stopped answering waited out every one of those timeouts.
    So the hook is the attempt itself, ``_execute_command``, which redis-py calls
    once per attempt and node (and only from ``execute_command``); it is private:
    tests/cluster/test_cluster_sweeper_stop.py fails if a redis-py upgrade moves it.

    Not covered: a pipeline (the sweeper's snapshot for the gauges) whose batch
    fails. ClusterPipeline then sends each of its commands again on its own, with
    RedisCluster's methods on the pipeline object, not these: a stop that comes
    while the snapshot waits on a node that stopped answering still waits for those.

    ``on_attempt()`` is called before each round trip to a node (the sweeper
    beats its heartbeat there): every attempt of a command, every redirect, and
    every node a slot-table refresh asks for CLUSTER SLOTS, the pipeline's too.
    One call facing a node that stopped answering makes up to 11 attempts, each
    a socket timeout followed by a refresh, ~55-110 s in all: without a beat in
    between, /healthz went stale (HEALTH_FLOOR_S) and the liveness probe
    restarted a sweeper that was only waiting for Redis, again and again. Per
    attempt is not enough: a refresh asks the cluster's nodes one after another
    (replicas too) until one answers, each up to a connect and a socket timeout
    when they stopped answering: 3 primaries and 3 replicas, ~30-40 s in one
    attempt. So the hook is where each round trip takes its connection, the node
    pool's ``get_connection`` (``connection_pool_class``, which RedisCluster gives
    each node's pool). Between two beats is then one round trip: for a node that
    stopped answering at most CONNECT_TIMEOUT_S plus SOCKET_TIMEOUT_S (its first
    unanswered read ends it), 7 s, well under HEALTH_FLOOR_S. The number of
    round trips stays redis-py's (bounded), so a wedged loop still goes stale.
    tests/cluster/test_cluster_sweeper_liveness.py fails if a redis-py upgrade
    stops taking connections there."""

    def __init__(self, *args: Any, should_stop: Callable[[], bool] = lambda: False,
                 on_attempt: Callable[[], None] = lambda: None, **kwargs: Any):
        # set first: the constructor already runs a command (COMMAND, for the key table)
        self._should_stop = should_stop
        super().__init__(*args, connection_pool_class=functools.partial(_AttemptReportingPool,
                                                                        on_attempt=on_attempt), **kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except _StopRequested as stopped:
            error = stopped.error
        # raised outside the handler: the caller sees the attempt's own error, not a chain through ours
        raise error

    def _execute_command(self, target_node: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._execute_command(target_node, *args, **kwargs)
        except RedisCluster.ERRORS_ALLOW_RETRY as error:
            # redis-py has already done its own clean-up of the failure (the
            # connection dropped, the slot table refreshed); only the next attempt is left out
            if self._should_stop():
                raise _StopRequested(error) from None
            raise


def connect(url: str, should_stop: Callable[[], bool] = lambda: False,
            on_attempt: Callable[[], None] = lambda: None) -> Any:
    """The sweeper's client for ``url``: a plain ``Redis``, or a
    :class:`StoppableRedisCluster` on a cluster node. Neither makes a new attempt
    once ``should_stop()`` says a stop was requested. The cluster client calls
    ``on_attempt()`` before each round trip to a node (the plain client's one call
    is short enough without: two attempts).

    Replies are decoded with ``surrogateescape`` (as the morgue CLI's are): a
    lane name that is not UTF-8 keeps its bytes as lone surrogates, so two lanes
    whose names differ only in such bytes stay two (``"l\\udcfe"`` and
    ``"l\\udcff"`` in JSON), and neither reads as a lane really named with
    U+FFFD (``errors="replace"`` made all three one)."""
    options: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "decode_responses": True,
        "encoding_errors": "surrogateescape",
    }
    # On a single server, one attempt: a script call that timed out (or lost its
    # reply) may have run, and sent again its moves went uncounted (the --once
    # JSON and the metrics said 0 dead-lettered for a call that dead-lettered
    # 200); a pooled connection a restart broke is replaced by the pool, and the
    # loop's own backoff handles real outages. The cluster keeps redis-py's own
    # retries (a failover), up to a stop.
    return connecting.connect(url, retry=connecting.single_attempt(), retry_on_cluster=False,
                              cluster_factory=functools.partial(StoppableRedisCluster.from_url,
                                                                should_stop=should_stop, on_attempt=on_attempt),
                              **options)
