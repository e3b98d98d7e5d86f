"""Everything we do with a Redis URL: show it, keep its secrets out of text, connect to it.

A Redis URL carries the password (``redis://user:pw@host/0`` or
``?password=pw``), so the sweeper, the morgue CLI and the operator all show a
URL through :func:`redact_url`, pass library error text through :func:`scrub`
and open clients with :func:`connect`. redis-py is imported inside the
functions: commands that never talk to Redis stay light.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, unquote_plus, urlencode, urlsplit, urlunsplit

MASK = "***"
UNPARSEABLE = "<unparseable URL>"


def _is_password_key(name: str) -> bool:
    # redis-py passes every query argument to the connection: password= and
    # ssl_password= (the passphrase of the TLS key) both carry a secret.
    return "password" in name.lower()


def _is_secret_query_key(name: str) -> bool:
    return _is_password_key(name) or name.lower() == "username"


def redact_url(url: str) -> str:
    """``url`` safe to show: the user and password become ``:***@`` and secret
    query values (``password=``, ``username=``, ``ssl_password=``) become ``***``;
    scheme, host, port, database and other options stay readable."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return UNPARSEABLE
    netloc = parts.netloc
    if "@" in netloc:
        # rpartition: an unencoded '@' in a password belongs to the userinfo
        netloc = f":{MASK}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if _is_secret_query_key(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _netloc_and_query(url: str) -> tuple[str, str]:
    try:
        parts = urlsplit(url)
        return parts.netloc, parts.query
    except ValueError:
        # urlsplit refuses a malformed host (an unclosed '['), but the password
        # beside it is still a secret: split by hand the way urlsplit would.
        rest = url.partition("//")[2] or url
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        query = url.partition("?")[2].partition("#")[0]
        return netloc, query


def secrets_of(url: str) -> list[str]:
    """Every form a password of ``url`` may take in someone's message: as
    written and percent-decoded, from the userinfo and from password query
    arguments; longest first, so no form is left half-masked."""
    netloc, query = _netloc_and_query(url)
    written = []
    if "@" in netloc:
        written.append(netloc.rpartition("@")[0].partition(":")[2])
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if _is_password_key(unquote_plus(key)):
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


def connect(url: str, *, retry: Any = None, **client_options: Any) -> Any:
    """A client for ``url``: a ``RedisCluster`` when the server has cluster mode
    on, else a plain ``Redis``. ``client_options`` (timeouts, ``decode_responses``)
    go to either; ``retry`` only to the plain client, because a RedisCluster's
    own retry also rides out failovers and MOVED storms, and cutting it to the
    plain client's one quick retry would turn every failover into an error."""
    import redis
    from redis.cluster import RedisCluster

    plain_options = dict(client_options)
    if retry is not None:
        plain_options["retry"] = retry
    client = redis.Redis.from_url(url, **plain_options)
    try:
        cluster_enabled = str(client.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.ResponseError:
        # INFO refused (a proxy, a managed server's restricted ACL user): treat as a plain server
        cluster_enabled = False
    except BaseException:
        client.close()
        raise
    if cluster_enabled:
        client.close()
        return RedisCluster.from_url(url, **client_options)
    return client


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
