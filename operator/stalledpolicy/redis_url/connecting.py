"""Opening clients for a Redis URL: a plain ``Redis`` or a ``RedisCluster``.

:func:`connect` tells a cluster from a single server (:func:`cluster_mode`:
INFO, else HELLO); :func:`single_attempt` is the retry of a client whose
scripts change data; :func:`server_databases` asks a server how many databases
it has. redis-py is imported on first use (``lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stalledpolicy.lazy import lazy_module
from stalledpolicy.redis_url.errors import ClusterDatabases, is_missing_database

if TYPE_CHECKING:
    import redis
else:
    # deferred: every stalledpolicy command imports this module, only those that talk to Redis pay for
    # redis-py (0.1 s)
    redis = lazy_module("redis")


def single_attempt() -> Any:
    """The ``retry`` of a client whose scripts change data: none.

    redis-py sends a command again after a timeout or a dropped reply, and a
    script that ran but answered late would then run twice: its moves are
    not repeated (each script re-reads where a job is), but the second answer
    reports them as jobs someone else moved, and the first answer is lost. A
    connection the server closed while idle costs no attempt: the pool
    replaces it when it hands it out."""
    return redis.retry.Retry(redis.backoff.NoBackoff(), 0)


def connect(url: str, *, retry: Any = None, cluster_factory: Any = None, retry_on_cluster: bool | None = None,
            **client_options: Any) -> Any:
    """A client for ``url``: a ``RedisCluster`` when the server has cluster mode
    on (:func:`cluster_mode`: INFO, else HELLO; a user allowed neither is
    refused with ``EMQNOPERM``), else a plain ``Redis``. ``client_options`` (timeouts, ``decode_responses``)
    go to either; ``retry`` only to the plain client, because a RedisCluster's
    own retry also rides out failovers and MOVED storms, and cutting it to the
    plain client's one quick retry would turn every failover into an error.
    :func:`single_attempt` is the exception: a change must never be sent twice,
    on a cluster either (a failover during it is then an error to check).
    ``retry_on_cluster`` False: ``retry`` goes to the plain client only, even
    a single attempt (the caller's cluster client keeps its own, as the
    sweeper's does). ``cluster_factory(url, **options)`` makes the cluster client
    (``RedisCluster.from_url`` unless given)."""
    plain_options = dict(client_options)
    if retry is not None:
        plain_options["retry"] = retry
    client = redis.Redis.from_url(url, **plain_options)
    try:
        cluster_enabled = cluster_mode(client)
    except BaseException:
        client.close()
        raise
    if cluster_enabled:
        client.close()
        cluster_options = dict(client_options)
        if retry is not None and (retry_on_cluster if retry_on_cluster is not None else retry.get_retries() == 0):
            cluster_options["retry"] = retry
        return (cluster_factory or redis.RedisCluster.from_url)(url, **cluster_options)
    return client


CLUSTER_MODE_UNKNOWN = (
    "EMQNOPERM the Redis user may run neither INFO nor HELLO (ACL), so whether the server is a Redis "
    "Cluster cannot be told (a cluster taken for a single server would fail on every queue whose slot "
    "lives on another node): grant it INFO (ACL SETUSER <user> +info) or HELLO (+hello, which -@dangerous "
    "leaves allowed); nothing was read or changed")


def cluster_mode(client: Any) -> bool:
    """Whether the server of the plain ``client`` has cluster mode on.

    Asked with ``INFO cluster``; a user the ACL refuses INFO (it is in
    ``@dangerous``, which restricted users are often denied) is asked with
    ``HELLO`` instead (Redis 6+; its ``mode`` is ``cluster`` or ``standalone``),
    on a connection of its own that is closed afterwards. When neither answers,
    raises ``NoPermissionError`` (``EMQNOPERM ...`` naming INFO): taking a
    cluster for a single server would fail later, queue by queue, with MOVED.
    A database the server lacks (or any database but 0 on a cluster) is
    refused as the connection is made: that ``ResponseError`` is raised as is."""
    try:
        return str(client.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.ResponseError as exc:
        if is_missing_database(exc):
            raise
        # refused (the ACL), unknown (renamed away) or not served (a proxy): ask HELLO
    mode = _hello_mode(client)
    if mode is None:
        raise redis.exceptions.NoPermissionError(CLUSTER_MODE_UNKNOWN)
    return mode == "cluster"


def _hello_mode(client: Any) -> str | None:
    """The ``mode`` of the server's HELLO answer ("cluster", "standalone",
    "sentinel"), or None when HELLO is refused or does not say."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        # the connection's own protocol: HELLO changes nothing but answers
        connection.send_command("HELLO", getattr(connection, "protocol", None) or 2)
        reply = connection.read_response()
    except redis.ResponseError as exc:
        if is_missing_database(exc):
            raise
        return None
    finally:
        connection.disconnect()  # nothing of the probe stays on a pooled connection
        pool.release(connection)
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    if not isinstance(reply, dict):
        return None
    for key, value in reply.items():
        if (key.decode() if isinstance(key, bytes) else key) == "mode":
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def server_databases(url: str, **client_options: Any) -> int | None:
    """How many databases the server of ``url`` has (``CONFIG GET databases``,
    asked on database 0), or None when it does not say (CONFIG refused by the
    ACL or a managed server, no answer). One short-lived connection."""
    pool = redis.ConnectionPool.from_url(url, **{**client_options, "decode_responses": True})
    pool.connection_kwargs["db"] = 0  # the URL's database is the one that is missing
    client = redis.Redis(connection_pool=pool)
    try:
        try:
            if cluster_mode(client):
                return ClusterDatabases(1)
        except redis.ResponseError:
            pass  # neither INFO nor HELLO: CONFIG may still tell
        value = client.config_get("databases").get("databases")
        return int(value) if value is not None else None
    except (redis.RedisError, OSError, ValueError, TypeError, AttributeError):
        return None
    finally:
        client.close()
        pool.disconnect()
