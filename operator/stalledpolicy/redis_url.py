"""Everything we do with a Redis URL: check it, show it, keep its secrets out of text, connect to it.

A Redis URL carries the password (``redis://user:pw@host/0`` or
``?password=pw``), so the sweeper, the morgue CLI and the operator all check a
URL with :func:`check_redis_url` (whose messages never hold a value), show it
through :func:`redact_url`, pass library error text through :func:`scrub` and
open clients with :func:`connect`. redis-py is imported inside the functions:
commands that never talk to Redis stay light.

Masking never parses the URL: urlsplit ends the userinfo at the first '/', '?'
or '#', so a password holding one of those (written unencoded, a common slip)
would be shown in part. Everything between ``//`` and the last ``@`` is taken
for the credentials instead; when in doubt we mask too much, never too little.
A user name is no secret: the part before the first ':' of the credentials is
shown when it is plain (no delimiter a password cut short would leave in it).
"""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

MASK = "***"
UNPARSEABLE = "<unparseable URL>"
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


def _is_password_key(name: str) -> bool:
    # redis-py passes every query argument to the connection: password= and
    # ssl_password= (the passphrase of the TLS key) both carry a secret.
    return "password" in name.lower()


def _is_secret_query_key(name: str) -> bool:
    return _is_password_key(name) or name.lower() == "username"


def _split_credentials(url: str) -> tuple[str, str | None, str]:
    """``(head, credentials, rest)`` without parsing: ``credentials`` is all
    between ``//`` (or the start, when there is none) and the last ``@`` of the
    whole URL, None when no '@' follows; ``head`` ends with the ``//``."""
    slashes = url.find("//")
    start = slashes + 2 if slashes >= 0 else 0
    at = url.rfind("@")
    if at < start:
        return url[:start], None, url[start:]
    return url[:start], url[start:at], url[at + 1:]


def _query_pairs(text: str) -> list[tuple[str, str | None]]:
    """``(key, value)`` of each ``&``-separated argument after the first '?' of
    ``text``, as written; a value runs to the next '&' or the end ('#' ends no
    value: a password may hold one). ``value`` is None without an '='."""
    query = text.partition("?")[2]
    pairs: list[tuple[str, str | None]] = []
    for pair in query.split("&") if query else ():
        key, equals, value = pair.partition("=")
        pairs.append((key, value if equals else None))
    return pairs


# characters a user name is shown without: a "user" holding one is a guess
# that took a query value or part of a host for the credentials
_NOT_IN_SHOWN_USER = frozenset("/?#@&=[]% \t\r\n")


def _shown_user(credentials: str) -> str:
    """The user name of ``credentials`` (``user:password``) when it is safe to
    show: the part before the first ':', when there is a ':' and that part is
    plain; else "" (everything is masked)."""
    user, colon, _ = credentials.partition(":")
    if not colon or any(char in _NOT_IN_SHOWN_USER for char in user):
        return ""
    return user


def redact_url(url: str) -> str:
    """``url`` safe to show: the credentials (all between ``//`` and the last
    ``@``) become ``user:***@`` (the user name, the part before the first
    ':', is no secret; without a ':' there is no telling a user from a
    password and all of it becomes ``:***@``) and secret query values (``password=``,
    ``username=``, ``ssl_password=``, the key read percent-decoded) become
    ``***``; scheme, host, port, database and other options stay as written.
    A URL urlsplit refuses (an unclosed '[') is not shown at all."""
    try:
        urlsplit(url)
    except ValueError:
        return UNPARSEABLE
    head, credentials, rest = _split_credentials(url)
    if credentials is not None:
        head = f"{head}{_shown_user(credentials)}:{MASK}@"
    before, question, _ = rest.partition("?")
    if not question:
        return head + rest
    query = "&".join(
        f"{key}={MASK}" if value is not None and _is_secret_query_key(unquote_plus(key))
        else key if value is None else f"{key}={value}"
        for key, value in _query_pairs(rest)
    )
    return f"{head}{before}?{query}"


def secrets_of(url: str) -> list[str]:
    """Every form a password of ``url`` may take in someone's message: the
    whole credential part (``user:password``) and the password alone, as written
    and percent-decoded, and the values of password query arguments found
    anywhere in the URL; longest first, so no form is left half-masked.
    A user without a password is no secret (it would mask common words)."""
    _, credentials, _ = _split_credentials(url)
    written = []
    if credentials is not None:
        user, colon, password = credentials.partition(":")
        if colon and password:
            written.append(password)
            if user:
                written.append(credentials)
    # the whole URL, not only what follows the last '@': a '@' in a query
    # value (?password=a@b) is no end of credentials to redis-py
    for key, value in _query_pairs(url):
        if value and _is_password_key(unquote_plus(key)):
            written.append(value)
    forms = {form for raw in written for form in (raw, unquote(raw), unquote_plus(raw)) if form}
    return sorted(forms, key=lambda form: (-len(form), form))


def scrub(text: str, url: str | None) -> str:
    """``text`` (a library's error message: not ours to trust) with ``url``
    shown redacted and any password of it masked, in every spelling."""
    if not url:
        return text
    text = text.replace(url, redact_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    return text


# a URL runs to the next whitespace: a quote may be part of its password (the
# credentials end at its last '@', so a quote after the URL changes nothing)
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_URL_START = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


# Forms of a URL our own messages teach: placeholders ("password", "[:port]"),
# no one's value. redact_urls shows them as written (the brackets would make
# redact_url call them unparseable, the "@" take "[:password" for credentials).
# Only a whole match counts, give or take trailing punctuation; anything else
# that looks like one (a real password in the place of "password") is masked.
URL_FORMS = frozenset({
    URL_FORM,
    INLINE_URL_FORM,
    "redis://[:password@]host:port/db",
    "redis://[user:password@]host:port/db",
    "redis://[user:password@]host[:port][/db]",
    "redis://user:password@host:port/db",
    "redis://:password@host:port/db",
})
_AFTER_A_FORM = ".,;:)'\""


def _redact_found(url: str) -> str:
    if url.rstrip(_AFTER_A_FORM) in URL_FORMS:
        return url
    return redact_url(url)


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`), for text we
    did not write: argparse's complaints, an API server's or a library's message.
    A password holding whitespace cannot be told from the text after it: in a
    value that is a URL, :func:`redact_value` finds it. The forms of
    :data:`URL_FORMS` (placeholders our messages teach) are left as written."""
    return _URL_IN_TEXT.sub(lambda url: _redact_found(url.group(0)), text)


def stored_url(text: str) -> str:
    """The Redis URL a setting or a Secret value holds: ``text`` without the
    whitespace around it. ``kubectl create secret --from-file`` keeps a file's
    trailing newline (``echo URL > file`` writes one), and no URL ends in one.
    The one rule for the sweeper, which reads its URL through this, and for the
    operator, whose digest of the Secret value (which rolls the sweeper's pods)
    is taken over what this returns: a value that differs only in such
    whitespace is the same URL, and rolls nothing."""
    return text.strip()


def redact_value(value: str) -> str:
    """A setting's or a field's value, to quote in a message: redacted whole when
    it is a URL (so a password holding a space is masked too), else any URL in it."""
    return redact_url(value) if _URL_START.match(value) else redact_urls(value)


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


def _check_host_and_path(parts: Any, write: str) -> str | None:
    try:
        port = parts.port  # raises on a non-numeric or out-of-range port
    except ValueError:
        # an '@' past the host: most likely a password cut short by a delimiter
        hint = f"; {_ENCODE}" if "@" in parts.geturl() and "@" not in parts.netloc else ""
        return f"has a port that is not a number from 1 to 65535; {write}{hint}"
    if not parts.hostname:
        return f"has no host; {write}"
    if port == 0:
        return "has port 0; use the server's port (6379 by default)"
    if not _DB_PATH.fullmatch(unquote(parts.path)):
        return "has a path that is not a database number; write /0, /1, ... after the host (or no path for 0)"
    return None


def _check_query(url: str) -> str | None:
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url

    try:
        options = parse_url(url)
    except ValueError as exc:
        # "Invalid value for 'db' in connection URL.": the name is one of
        # redis-py's own options (so no secret); the value is never taken.
        named = re.search(r"'([a-z_]+)'", str(exc))
        name = named.group(1) if named and named.group(1) in URL_QUERY_ARGUMENT_PARSERS else None
        if name is None:
            return "has a query option redis-py cannot read; check the options after '?'"
        kind = {int: "a whole number", float: "a number"}.get(URL_QUERY_ARGUMENT_PARSERS[name],
                                                               "a value redis-py accepts")
        return f"has query option {name} with a value that is not {kind}"
    if not 0 <= options.get("db", 0) <= _DB_MAX:
        return f"has a database number outside 0..{_DB_MAX}; use a database number such as db=0"
    for name in _TIMEOUTS:
        # nan, inf, 0 and below are read fine here and fail (or block) only on connect
        if name in options and not 0 < options[name] < _TIMEOUT_MAX_S:
            return f"has query option {name} that is not a number of seconds above 0 and below {_TIMEOUT_MAX_S:g}"
    return None


def _check_connection_options(url: str) -> str | None:
    import redis

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


def single_attempt() -> Any:
    """The ``retry`` of a client whose scripts change data: none.

    redis-py sends a command again after a timeout or a dropped reply, and a
    script that ran but answered late would then run twice: its moves are
    not repeated (each script re-reads where a job is), but the second answer
    reports them as jobs someone else moved, and the first answer is lost. A
    connection the server closed while idle costs no attempt: the pool
    replaces it when it hands it out."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def connect(url: str, *, retry: Any = None, **client_options: Any) -> Any:
    """A client for ``url``: a ``RedisCluster`` when the server has cluster mode
    on (:func:`cluster_mode`: INFO, else HELLO; a user allowed neither is
    refused with ``EMQNOPERM``), else a plain ``Redis``. ``client_options`` (timeouts, ``decode_responses``)
    go to either; ``retry`` only to the plain client, because a RedisCluster's
    own retry also rides out failovers and MOVED storms, and cutting it to the
    plain client's one quick retry would turn every failover into an error.
    :func:`single_attempt` is the exception: a change must never be sent twice,
    on a cluster either (a failover during it is then an error to check)."""
    import redis
    from redis.cluster import RedisCluster

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
        if retry is not None and retry.get_retries() == 0:
            cluster_options["retry"] = retry
        return RedisCluster.from_url(url, **cluster_options)
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
    import redis
    from redis.exceptions import NoPermissionError

    try:
        return str(client.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.ResponseError as exc:
        if is_missing_database(exc):
            raise
        # refused (the ACL), unknown (renamed away) or not served (a proxy): ask HELLO
    mode = _hello_mode(client)
    if mode is None:
        raise NoPermissionError(CLUSTER_MODE_UNKNOWN)
    return mode == "cluster"


def _hello_mode(client: Any) -> str | None:
    """The ``mode`` of the server's HELLO answer ("cluster", "standalone",
    "sentinel"), or None when HELLO is refused or does not say."""
    import redis

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
    import redis

    return isinstance(exc, redis.AuthenticationError) or _says(exc, _AUTH_REFUSALS)


# a replica's refusal of a write (redis-py raises ReadOnlyError for it; inside a
# script or a pipeline it may come as a plain ResponseError)
_READ_ONLY_REFUSALS = ("READONLY", "You can't write against a read only replica")
READ_ONLY_ADVICE = "point the URL at the primary (the server that takes writes)"


def is_read_only_refusal(exc: BaseException) -> bool:
    """A replica refused a write: reachable, but the URL names a replica (or a
    failover has just demoted the server)."""
    from redis.exceptions import ReadOnlyError

    return isinstance(exc, ReadOnlyError) or _says(exc, _READ_ONLY_REFUSALS)


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
    from redis.connection import parse_url

    db = int(parse_url(url).get("db", 0))
    if isinstance(databases, ClusterDatabases) or (exc is not None and is_cluster_database(exc)):
        return (f"names database {db}, but the server is a Redis Cluster node and a Redis Cluster has only "
                "database 0; write /0 after the host (or no path)")
    if databases is not None and databases > 0:
        return (f"the database {db} does not exist on this server: it has {databases} "
                f"('databases {databases}' in its configuration), numbered 0 to {databases - 1}; "
                "use one of them, such as /0")
    return (f"the database {db} does not exist on this server (it has fewer: 'databases' in its "
            "configuration, 16 by default, numbered from 0); use a database the server has, such as /0")


def server_databases(url: str, **client_options: Any) -> int | None:
    """How many databases the server of ``url`` has (``CONFIG GET databases``,
    asked on database 0), or None when it does not say (CONFIG refused by the
    ACL or a managed server, no answer). One short-lived connection."""
    import redis

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


# A URL whose scheme does not match the server's TLS fails in ways redis-py
# reports as an outage: rediss:// to a plain port sends a TLS handshake that a
# plain Redis never answers (it waits for a command line: a timeout) or answers
# in RESP (an SSL error: not TLS); redis:// to a TLS-only port sends a command
# that the server's TLS layer drops the connection on, with no reply.
PLAIN_SERVER_ADVICE = ("is the server speaking TLS? rediss:// needs the server's TLS port (tls-port); "
                       "a server without TLS takes redis://")
TLS_SERVER_ADVICE = "is the server speaking TLS only? then use rediss:// (and the server's TLS port)"
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
    import ssl

    import redis

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


def refusal_in_our_words(exc: BaseException, url: str) -> str | None:
    """What a person must fix in ``url`` when ``exc`` says so (credentials, a
    database, a replica, a scheme that does not match the server's TLS), in our
    words and without any part of the URL; else None."""
    if is_credentials_refusal(exc):
        return f"Redis requires a password (or refused this user/password): {CREDENTIALS_ADVICE}"
    if is_missing_database(exc):
        return missing_database_problem(url, exc=exc)
    if is_read_only_refusal(exc):
        return f"Redis is a read-only replica and refused a write: {READ_ONLY_ADVICE}"
    return tls_mismatch_problem(exc, url)


def is_slot_migrating(exc: BaseException) -> bool:
    """Whether ``exc`` says the queue's slot is being moved between cluster
    nodes (resharding): a script met a key already on the other node ('non
    local key'), the importing node refused a key not there yet (TRYAGAIN), or
    redis-py gave up following the redirections ('TTL exhausted'). Every
    script (the sweep's and the morgue's) reads before it writes, so such a
    call changed nothing. The one test the sweeper and the morgue CLI share."""
    from redis.exceptions import ClusterError, TryAgainError

    text = str(exc)
    return (isinstance(exc, TryAgainError) or text.startswith("TRYAGAIN")
            or "attempted to access a non local key" in text
            or (isinstance(exc, ClusterError) and "TTL exhausted" in text))


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """Errors meaning "Redis cannot serve us now" (an outage, wrong credentials,
    a cluster mid-failover), as opposed to "this call is wrong"."""
    import redis
    from redis.exceptions import (
        ClusterDownError, MasterDownError, ReadOnlyError, RedisClusterException, TryAgainError,
    )

    return (
        redis.ConnectionError,  # also AuthenticationError, BusyLoadingError
        redis.TimeoutError,
        ClusterDownError,
        TryAgainError,
        MasterDownError,
        ReadOnlyError,
        RedisClusterException,
        OSError,
    )
