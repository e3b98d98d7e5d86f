"""What a Redis server's refusal or a failed connection means, in our words.

Classifies errors (credentials wanted or refused, a database the server lacks,
a read-only replica, a URL scheme that does not match the server's TLS, a
cluster slot being migrated, Redis unreachable) and says what to fix without
any part of the URL (:func:`refusal_in_our_words`). redis-py is imported on
first use (``lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalledpolicy.lazy import lazy_module
from stalledpolicy.redis_url.validation import url_database

if TYPE_CHECKING:
    import ssl

    import redis
else:
    # deferred: every stalledpolicy command imports this module, only those that talk to Redis pay for
    # redis-py (0.1 s)
    redis = lazy_module("redis")
    ssl = lazy_module("ssl")  # deferred with redis-py: only its errors are read with it


def _says(exc: BaseException, refusals: tuple[str, ...]) -> bool:
    """Whether the error's text holds one of the server's ``refusals`` as words of
    its own: at its start, or after a space (a script or a pipeline wraps them)."""
    text = str(exc)
    return any(text.startswith(words) or f" {words}" in text for words in refusals)


# what a server says when it wants credentials or refuses ours (redis-py maps
# most to AuthenticationError; these come as another error)
_AUTH_REFUSALS = ("NOAUTH", "WRONGPASS", "Authentication required", "HELLO must be called with the client "
                  "already authenticated", "invalid username-password pair", "invalid password")
CREDENTIALS_ADVICE = ("put them in the URL, redis://user:password@host:port/db (or redis://:password@host:port/db "
                      "for the default user; percent-encode a '/', '?', '#' or '@' in them)")


def is_credentials_refusal(exc: BaseException) -> bool:
    """The server wants credentials, or refuses the URL's."""
    return isinstance(exc, redis.AuthenticationError) or _says(exc, _AUTH_REFUSALS)


# a replica's refusal of a write (redis-py raises ReadOnlyError for it; inside a
# script or a pipeline it may come as a plain ResponseError)
_READ_ONLY_REFUSALS = ("READONLY", "You can't write against a read only replica")
READ_ONLY_ADVICE = "point the URL at the primary (the server that takes writes)"


def is_read_only_refusal(exc: BaseException) -> bool:
    """A replica refused a write: reachable, but the URL names a replica (or a
    failover has just demoted the server)."""
    return isinstance(exc, redis.ReadOnlyError) or _says(exc, _READ_ONLY_REFUSALS)


def is_missing_database(exc: BaseException) -> bool:
    """SELECT refused as a connection is made: the URL names a database the
    server lacks (also any database but 0 on a Redis Cluster node)."""
    return "DB index is out of range" in str(exc) or is_cluster_database(exc)


def is_cluster_database(exc: BaseException) -> bool:
    """A Redis Cluster node refused the URL's database: a cluster has only database 0."""
    return "SELECT is not allowed in cluster mode" in str(exc)


class ClusterDatabases(int):
    """What :func:`server_databases` says of a Redis Cluster node: one
    database, 0, whatever its ``databases`` setting."""


def missing_database_problem(url: str, databases: int | None = None,
                             exc: BaseException | None = None) -> str:
    """A phrase to follow the URL (``url`` already checked by :func:`check_redis_url`);
    ``databases``: the server's own count, when known (:func:`server_databases`);
    ``exc``: the server's refusal, when at hand (it tells a cluster node's)."""
    db = url_database(url)
    if isinstance(databases, ClusterDatabases) or (exc is not None and is_cluster_database(exc)):
        return (f"names database {db}, but the server is a Redis Cluster node and a Redis Cluster has only "
                "database 0; write /0 after the host (or no path)")
    if databases is not None and databases > 0:
        return (f"the database {db} does not exist on this server: it has {databases} "
                f"('databases {databases}' in its configuration), numbered 0 to {databases - 1}; "
                "use one of them, such as /0")
    return (f"the database {db} does not exist on this server (it has fewer: 'databases' in its "
            "configuration, 16 by default, numbered from 0); use a database the server has, such as /0")


# A URL whose scheme does not match the server's TLS fails in ways redis-py
# reports as an outage: rediss:// to a plain port sends a TLS handshake that a
# plain Redis never answers (it waits for a command line: a timeout) or answers
# in RESP (an SSL error: not TLS); redis:// to a TLS-only port sends a command
# that the server's TLS layer drops the connection on, with no reply.
PLAIN_SERVER_ADVICE = ("is the server speaking TLS? rediss:// needs the server's TLS port (tls-port); "
                       "a server without TLS takes redis://")
TLS_SERVER_ADVICE = ("is the server speaking TLS only? then use rediss:// (and the server's TLS port); "
                     "else check that the host and port are a Redis server's")
# OpenSSL's reasons for a handshake answered with bytes that are not TLS
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                              "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "UNEXPECTED_EOF_WHILE_READING"})


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (redis-py
    raises its own from the socket's or ssl's)."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def is_tls_handshake_timeout(exc: BaseException) -> bool:
    """The server accepted the connection but did not answer the TLS handshake
    in time (redis-py says only "Timeout connecting to server")."""
    return any(isinstance(link, TimeoutError) and "handshake" in str(link).lower() for link in _chain(exc))


def tls_mismatch_problem(exc: BaseException, url: str, timeout_s: float | None = None) -> str | None:
    """When ``exc`` is how a connection fails with the URL's scheme wrong for
    the server (rediss:// to a server without TLS, redis:// to a TLS-only one):
    what was seen and the question to ask, in our words, without any part of
    the URL; else None. ``timeout_s``: the wait a handshake timeout ran out, to name it."""
    if not isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return None  # an error reply, a refusal: the server spoke our protocol
    chain = _chain(exc)
    if url.startswith("rediss://"):
        if is_tls_handshake_timeout(exc):
            within = f" within {timeout_s:g} s" if timeout_s is not None else ""
            return f"no answer to the TLS handshake{within}: {PLAIN_SERVER_ADVICE}"
        if any(isinstance(link, ssl.SSLError) and not isinstance(link, ssl.SSLCertVerificationError)
               and (isinstance(link, ssl.SSLEOFError) or link.reason in _NOT_TLS_REASONS) for link in chain):
            return f"the answer to the TLS handshake is not TLS: {PLAIN_SERVER_ADVICE}"
    elif url.startswith("redis://"):
        if any(isinstance(link, ConnectionResetError) for link in chain) or \
                "Connection closed by server" in str(exc):
            return f"the server closed the connection without an answer: {TLS_SERVER_ADVICE}"
    return None


NOT_REDIS_PROBLEM = ("the server at this host and port does not answer in Redis's protocol (another service, "
                     "such as an HTTP server or a proxy, or the wrong port): check the URL's host and port")


def not_redis_problem(exc: BaseException) -> str | None:
    """NOT_REDIS_PROBLEM when ``exc`` is redis-py's reading of an answer that is
    not Redis's protocol ("Protocol Error: b'HTTP/1.1 400 ..."), else None."""
    return NOT_REDIS_PROBLEM if any(isinstance(link, redis.InvalidResponse) for link in _chain(exc)) else None


def refusal_in_our_words(exc: BaseException, url: str, *, connected: bool = False) -> str | None:
    """What a person must fix in ``url`` when ``exc`` says so (credentials, a
    database, a replica, a scheme that does not match the server's TLS, a
    server that is not Redis), in our words and without any part of the URL;
    else None. ``connected``: Redis has answered on this URL before, so a
    dropped connection is no sign of a wrong scheme or port (a proxy in front
    of a Redis that went down closes connections the way a TLS-only server
    does): those two readings are not offered."""
    if not connected and not_redis_problem(exc):
        return NOT_REDIS_PROBLEM
    if is_credentials_refusal(exc):
        return f"Redis requires a password (or refused this user/password): {CREDENTIALS_ADVICE}"
    if is_missing_database(exc):
        return missing_database_problem(url, exc=exc)
    if is_read_only_refusal(exc):
        return f"Redis is a read-only replica and refused a write: {READ_ONLY_ADVICE}"
    return None if connected else tls_mismatch_problem(exc, url)


def is_slot_migrating(exc: BaseException) -> bool:
    """Whether ``exc`` says the queue's slot is being moved between cluster
    nodes (resharding): a script met a key already on the other node ('non
    local key'), the importing node refused a key not there yet (TRYAGAIN;
    inside a script Redis says 'non local key' for it too, Valkey 8 'undeclared
    keys were accessed during rehashing of the slot'), or redis-py gave up
    following the redirections ('TTL exhausted'). Every script (the sweep's and
    the morgue's) reads before it writes, so such a call changed nothing. The
    one test the sweeper and the morgue CLI share."""
    text = str(exc)
    return (isinstance(exc, redis.exceptions.TryAgainError) or text.startswith("TRYAGAIN")
            or any(words in text for words in _SLOT_MIGRATING_IN_A_SCRIPT)
            or (isinstance(exc, redis.exceptions.ClusterError) and "TTL exhausted" in text))


# A command inside a script refused because the slot is being migrated, in
# each server's words: the same refusal at the same command, worded apart.
_SLOT_MIGRATING_IN_A_SCRIPT = (
    "attempted to access a non local key",  # Redis; Valkey for a key on the other node
    "undeclared keys were accessed during rehashing of the slot",  # Valkey 8: a key not there yet
)


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """Errors meaning "Redis cannot serve us now" (an outage, wrong credentials,
    a cluster mid-failover), as opposed to "this call is wrong"."""
    return (
        redis.ConnectionError,  # also AuthenticationError, BusyLoadingError
        redis.TimeoutError,
        redis.InvalidResponse,  # not Redis's protocol: another service on that port (not_redis_problem)
        redis.exceptions.ClusterDownError,
        redis.exceptions.TryAgainError,
        redis.exceptions.MasterDownError,
        redis.ReadOnlyError,
        redis.RedisClusterException,
        OSError,
    )
