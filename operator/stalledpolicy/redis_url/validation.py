"""Checking a Redis URL before any connection, and the forms our messages teach.

:func:`check_redis_url` says what is wrong with a URL in our words (its
messages never hold any part of the URL); :func:`stored_url` is how a setting
or a Secret value is read as a URL; ``URL_FORM``, ``INLINE_URL_FORM`` and
their advice are the forms those messages (and others') show.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from stalledpolicy.lazy import lazy_module

if TYPE_CHECKING:
    import redis
else:
    # deferred: every stalledpolicy command imports this module, only those that check a URL (and then
    # talk to Redis) pay for redis-py (0.1 s)
    redis = lazy_module("redis")

SCHEMES = ("redis://", "rediss://", "unix://")
NETWORK_SCHEMES = ("redis://", "rediss://")
# The forms our messages teach. A URL with the password (--redis-url, a Secret's value):
URL_FORM = "redis://[:password@]host[:port][/db]"
# spec.redis.url, which refuses credentials (they go in the Secret of spec.redis.secretRef):
INLINE_URL_FORM = "redis://host[:port][/db]"
INLINE_URL_ADVICE = (f"write {INLINE_URL_FORM} (rediss:// for TLS), without a user or password: "
                     "a URL with a password goes in a Secret, named by spec.redis.secretRef")
_WRITE = f"write {URL_FORM}"
# unix:// is refused for a StalledPolicy (check_redis_url(unix=False)): no pod it runs mounts a socket
UNIX_IN_POLICY = ("unix:// (a socket) is not supported for a StalledPolicy: the sweeper pods and the "
                  "operator mount no socket and reach Redis over the network")
_ENCODE = ("percent-encode a '/', '?', '#' or '@' in the user or password "
           "as %2F, %3F, %23 or %40")
_DB_PATH = re.compile(r"/?|/[0-9]+/?")
_DB_MAX = 2_147_483_647  # SELECT takes a 32-bit index
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")
_TIMEOUT_MAX_S = 86_400


def stored_url(text: str) -> str:
    """The Redis URL a setting or a Secret value holds: ``text`` without the
    whitespace around it. ``kubectl create secret --from-file`` keeps a file's
    trailing newline (``echo URL > file`` writes one), and no URL ends in one.
    The one rule for the sweeper, which reads its URL through this, and for the
    operator, whose digest of the Secret value (which rolls the sweeper's pods)
    is taken over what this returns: a value that differs only in such
    whitespace is the same URL, and rolls nothing."""
    return text.strip()


@functools.lru_cache(maxsize=1024)
def check_redis_url(url: str, *, unix: bool = True, credentials: bool = True) -> str | None:
    """What is wrong with ``url`` as a Redis URL, or None when redis-py will
    read it as written.

    ``unix=False``: a unix:// URL is refused too (a StalledPolicy's: its pods
    mount no socket). ``credentials=False``: the URL of a field that refuses
    credentials (``spec.redis.url``; the caller refuses them): the fixes show
    its own form, never one with a password.

    The contract: the problem is a phrase to follow the name of the setting
    (``f"--redis-url: {problem}"``, ``f"spec.redis.url {problem}"``); it says
    which part is wrong and how to fix it and never holds any part of ``url``
    (nor a library's error text, which may quote it), so it is safe in logs,
    events and status. Checked: the scheme (redis://, rediss:// or unix://, as
    redis-py wants them, lower case), a host, a port from 1 to 65535, a path
    that is a database number (redis-py would silently take ``/1x`` for DB 0),
    the query options redis-py converts (``db=``, ``socket_timeout=``, ...), and
    delimiters left unencoded in a password (urlsplit and redis-py cut the URL
    there and would connect elsewhere, or show the rest of the password), and
    what redis-py refuses only when it builds a connection: an option it does
    not know (``?foo=1``) or a value it checks there (``?protocol=9``). Building
    one connection object opens no socket, so these are found at start rather
    than mistaken later for an unreachable server.
    """
    write = _WRITE if credentials else INLINE_URL_ADVICE
    if not url.strip():
        return f"is empty; {write}"
    if not unix and url.startswith("unix://"):
        return f"must start with redis:// or rediss:// (TLS); {UNIX_IN_POLICY}; {write}"
    if not url.startswith(SCHEMES if unix else NETWORK_SCHEMES):
        schemes = "redis://, rediss:// (TLS) or unix://" if unix else "redis:// or rediss:// (TLS)"
        return f"must start with {schemes}; {write}"
    if "#" in url:
        fix = _ENCODE if credentials else "remove it (a URL with a password goes in a Secret, spec.redis.secretRef)"
        return f"holds a '#', which ends the URL for redis-py; {fix}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return ("has a malformed host: close the [brackets] of an IPv6 address, and "
                "percent-encode characters of the host, user or password that change "
                "under Unicode (NFKC) normalization")
    if "@" in parts.path or any("@" in key for key, _ in parse_qsl(parts.query, keep_blank_values=True)):
        return f"has an '@' after the host, which redis-py does not read as the password; {_ENCODE}"
    if parts.scheme == "unix":
        if not parts.path:
            return "has no socket path; write unix:///path/to/redis.sock?db=0"
        return _check_query(url) or _check_connection_options(url)
    return _check_host_and_path(parts, write) or _check_query(url) or _check_connection_options(url)


def url_database(url: str) -> int:
    """The database a URL connects to, read as redis-py reads it: ``?db=``
    wins over the path (``redis://h/0?db=3`` is database 3); 0 when neither
    names one. Raises ValueError for a URL redis-py cannot read."""
    return int(redis.connection.parse_url(url.strip()).get("db", 0))


def _check_host_and_path(parts: Any, write: str) -> str | None:
    if "," in parts.netloc.rpartition("@")[2]:
        # redis://a:7000,b:7001/0 read as a port "7000,b:7001", redis://a,b/0 as a host "a,b"
        return ("names several hosts (a ',' after the '@'); a Redis URL names one node: for a Redis Cluster, "
                f"any one of its nodes (the client learns the others from it); {write}")
    try:
        port = parts.port  # raises on a non-numeric or out-of-range port
    except ValueError:
        # an '@' past the host: most likely a password cut short by a delimiter
        hint = f"; {_ENCODE}" if "@" in parts.geturl() and "@" not in parts.netloc else ""
        return f"has a port that is not a number from 1 to 65535; {write}{hint}"
    if not parts.hostname:
        return f"has no host; {write}"
    try:
        # as the socket layer encodes a host name before any lookup: an empty
        # label (redis..svc) or one over 63 characters fails there, and was
        # taken for an unreachable server (or a failed pass, retried forever)
        parts.hostname.encode("idna")
    except UnicodeError:
        return ("has a malformed host: each part of a host name between dots must be 1 to 63 "
                f"characters (no '..', no leading dot); {write}")
    if port == 0:
        return "has port 0; use the server's port (6379 by default)"
    if not _DB_PATH.fullmatch(unquote(parts.path)):
        return "has a path that is not a database number; write /0, /1, ... after the host (or no path for 0)"
    return None


def _check_query(url: str) -> str | None:
    parsers = redis.connection.URL_QUERY_ARGUMENT_PARSERS
    try:
        options = redis.connection.parse_url(url)
    except ValueError as exc:
        # "Invalid value for 'db' in connection URL.": the name is one of
        # redis-py's own options (so no secret); the value is never taken.
        named = re.search(r"'([a-z_]+)'", str(exc))
        name = named.group(1) if named and named.group(1) in parsers else None
        if name is None:
            return "has a query option redis-py cannot read; check the options after '?'"
        kinds: dict[object, str] = {int: "a whole number", float: "a number"}
        kind = kinds.get(parsers[name], "a value redis-py accepts")
        return f"has query option {name} with a value that is not {kind}"
    if not 0 <= options.get("db", 0) <= _DB_MAX:
        return f"has a database number outside 0..{_DB_MAX}; use a database number such as db=0"
    for name in _TIMEOUTS:
        # nan, inf, 0 and below are read fine here and fail (or block) only on connect
        if name in options and not 0 < options[name] < _TIMEOUT_MAX_S:
            return f"has query option {name} that is not a number of seconds above 0 and below {_TIMEOUT_MAX_S:g}"
    return None


def _check_connection_options(url: str) -> str | None:
    try:
        redis.ConnectionPool.from_url(url).make_connection()
    except TypeError:
        # the option's name is not shown: with an unencoded '&' in a password,
        # what redis-py takes for a name is part of the password
        return ("has a query option redis-py does not know; remove it or spell it as "
                "redis-py does (db=0, socket_timeout=5, protocol=3, ...); ssl_ options need rediss://")
    except Exception:  # noqa: BLE001 - redis-py raises what its option parsers raise (AttributeError too)
        return ("has a query option whose value redis-py refuses; check protocol (2 or 3), "
                "ssl_cert_reqs (none, optional or required) and the other options after '?'")
    return None
