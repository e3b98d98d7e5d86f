"""Redis clients of the policies: the URL from ``spec.redis.url`` or a Secret.

A password lives only in the URL, so the URL itself is never logged, put in an
event, a condition or an exception message: errors name the Secret and the key,
and a client is identified by a digest of its URL. Clients are cached per
policy and shared between policies naming the same URL (one pool per server).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stalledpolicy.redis_url import connecting, errors, validation

PolicyKey = tuple[str, str]  # (namespace, name)


class RedisConfigError(Exception):
    """The operator cannot build a client; ``reason`` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def url_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def check_url(url: str, where: str, *, inline: bool = False) -> str:
    """``url`` when redis-py can use it; else RedisConfigError naming ``where``
    and the wrong part in our own words (check_redis_url's), never urllib's or
    redis-py's error text: theirs quotes the URL, password included.

    A policy's URL is never unix:// (no pod of the policy mounts a socket);
    ``inline`` (spec.redis.url, which refuses credentials): the fixes give that
    field's form, without a password."""
    problem = validation.check_redis_url(url, unix=False, credentials=not inline)
    if problem is not None:
        raise RedisConfigError("InvalidRedisURL", f"{where} {problem}")
    return url


def secret_value(secret_data: Mapping[str, str] | None, key: str) -> str | None:
    """The URL the value of ``key`` in a Secret's base64 ``data`` holds, as the sweeper
    reads it (validation.stored_url); None when the key is absent."""
    if not secret_data or key not in secret_data or secret_data[key] is None:
        return None
    return validation.stored_url(base64.b64decode(secret_data[key]).decode("utf-8"))


class SecretData(dict[str, Any]):
    """A Secret's ``data``, with the Secret's ``uid`` (None when unknown)."""

    def __init__(self, data: Mapping[str, Any], uid: str | None = None) -> None:
        super().__init__(data)
        self.uid = uid


def secret_value_digest(namespace: str, name: str, key: str, url: str, secret_uid: str | None) -> str:
    """A digest of the URL one Secret value holds (decoded, and through
    validation.stored_url as the sweeper reads it: a trailing newline added by an
    edit or by ``kubectl create secret --from-file`` rolls nothing) for the
    sweeper's pod template: it changes when that URL does, and shows nothing of it.

    Anyone who may read pods sees it, far more people than may read the Secret:
    keyed with the Secret's uid (known to those who may read the Secret anyway),
    a weak password cannot be guessed from it offline. Salted with the Secret's
    namespace, name and key, so equal values of two Secrets differ; a Secret
    deleted and created again (a new uid) rolls the pods once."""
    salted = f"{namespace}\0{name}\0{key}\0{url}".encode()
    if secret_uid is None:
        return hashlib.sha256(salted).hexdigest()[:16]
    return hmac.new(secret_uid.encode(), salted, hashlib.sha256).hexdigest()[:16]


@dataclass
class _CachedSecret:
    fetched_at: float
    data: Mapping[str, str] | None  # None: not found


class SecretReader:
    """Reads Secrets through the API, reusing a found Secret for ``ttl`` seconds.

    ``read(namespace, name)`` returns the Secret's ``data`` or None when it does
    not exist; a missing Secret is not cached, so its creation is seen at once.
    """

    def __init__(self, read: Callable[[str, str], Mapping[str, str] | None], ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, str], _CachedSecret] = {}
        self._lock = threading.Lock()

    def get(self, namespace: str, name: str) -> Mapping[str, str] | None:
        now = self._clock()
        with self._lock:
            hit = self._cache.get((namespace, name))
        if hit is not None and now - hit.fetched_at < self._ttl:
            return hit.data
        data = self._read(namespace, name)
        with self._lock:
            if data is None:
                self._cache.pop((namespace, name), None)
            else:
                self._cache[(namespace, name)] = _CachedSecret(now, data)
        return data

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._cache.pop((namespace, name), None)


def resolve_url(namespace: str, redis_spec: Mapping[str, Any], secrets: SecretReader) -> str:
    """The Redis URL of a policy's ``spec.redis``; RedisConfigError names what is wrong."""
    url = redis_spec.get("url")
    ref = redis_spec.get("secretRef")
    if url and ref:
        raise RedisConfigError("InvalidSpec", "spec.redis: set either url or secretRef, not both")
    if url:
        return check_url(url, "spec.redis.url", inline=True)
    if not ref or not ref.get("name"):
        raise RedisConfigError("InvalidSpec", "spec.redis: set url or secretRef {name, key}")
    name, key = ref["name"], ref.get("key") or "url"
    data = secrets.get(namespace, name)
    if data is None:
        raise RedisConfigError(
            "SecretNotFound",
            f"Secret {namespace}/{name} (spec.redis.secretRef.name) does not exist; "
            f"create it with the Redis URL under key {key!r}")
    try:
        value = secret_value(data, key)
    except (UnicodeDecodeError, ValueError):  # binascii.Error is a ValueError
        # A binary value (a keystore, a DER certificate: the wrong key). The
        # decoder's own text is not shown: it quotes bytes of the value.
        raise RedisConfigError(
            "InvalidRedisURL",
            f"the value of key {key!r} in Secret {namespace}/{name} is not UTF-8 text, so not a Redis URL "
            "(spec.redis.secretRef.key names the wrong key?); store the URL, "
            "redis://[user:password@]host:port/db, under that key") from None
    if value is None:
        raise RedisConfigError(
            "SecretKeyNotFound",
            f"Secret {namespace}/{name} has no key {key!r} (spec.redis.secretRef.key); "
            f"keys present: {sorted(data)}")
    if not value:
        # The key is there, its value blank (nothing but whitespace, which
        # stored_url drops): the sweeper refuses it too. Nothing of the value
        # is quoted, its length neither.
        raise RedisConfigError(
            "SecretValueEmpty",
            f"the value of key {key!r} in Secret {namespace}/{name} (spec.redis.secretRef) is empty or only "
            "whitespace; store the Redis URL, redis://[user:password@]host:port/db, under that key")
    return check_url(value, f"the value of key {key!r} in Secret {namespace}/{name}")


def secret_digest(secrets: SecretReader, namespace: str, ref: Mapping[str, Any]) -> str | None:
    """A digest of the value the sweeper reads from ``spec.redis.secretRef`` (the
    Secret read again once ``secrets``' cache has expired): a new one rolls the
    sweeper, a label or annotation on the Secret does not. None when that value is
    no usable Redis URL now (Secret missing or unreadable, key missing, not a Redis
    URL): the caller keeps what the pods have."""
    try:
        url = resolve_url(namespace, {"secretRef": dict(ref)}, secrets)
        secret = secrets.get(namespace, ref["name"])  # cached by resolve_url's read
    except Exception:  # noqa: BLE001 - RedisConfigError, or the API down: keep what we have
        return None
    return secret_value_digest(namespace, ref["name"], ref.get("key") or "url", url, getattr(secret, "uid", None))


def connect(url: str, timeout: float) -> Any:  # a redis-py client
    """The operator's decoded client for ``url`` (a RedisCluster on a cluster node).

    A database the server lacks (``/16`` on a server with 16) is the URL's
    fault, not an outage: RedisConfigError InvalidRedisURL naming the database
    and the server's count (when CONFIG GET tells it), no part of the URL."""
    import redis  # deferred: redis-py loads only once a Redis is used

    try:
        return connecting.connect(url, decode_responses=True, socket_timeout=timeout,
                                 socket_connect_timeout=timeout)
    except redis.ResponseError as exc:
        if not errors.is_missing_database(exc):
            raise
        databases = connecting.server_databases(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        raise RedisConfigError(
            "InvalidRedisURL",
            f"spec.redis: {errors.missing_database_problem(url, databases)}") from None


class RedisClients:
    """One client per distinct URL, remembered per policy, closed when unused."""

    def __init__(self, timeout: float = 2.0,
                 connect_fn: Callable[[str, float], Any] = connect) -> None:
        self._timeout = timeout
        self._connect = connect_fn
        self._lock = threading.Lock()
        self._by_digest: dict[str, Any] = {}
        self._policy_digest: dict[PolicyKey, str] = {}
        # How many policies name each digest (the values of _policy_digest counted):
        # whether a client is still used is one look-up, not a scan of every policy.
        self._users: dict[str, int] = {}
        # URLs (digests) Redis has answered a read on, while a policy names them:
        # past that, a dropped connection is an outage, no sign of a wrong scheme or
        # port (a proxy in front of a Redis that went down closes connections the way
        # a TLS-only server does).
        self._answered: set[str] = set()

    def mark_answered(self, url: str) -> None:
        with self._lock:
            self._answered.add(url_digest(url))

    def answered(self, url: str) -> bool:
        with self._lock:
            return url_digest(url) in self._answered

    def client(self, policy: PolicyKey, url: str) -> Any:  # a redis-py client
        digest = url_digest(url)
        with self._lock:
            stale = self._policy_digest.get(policy)
            self._policy_digest[policy] = digest
            if stale != digest:
                self._users[digest] = self._users.get(digest, 0) + 1
                if stale:
                    self._release(stale)
            existing = self._by_digest.get(digest)
        if stale and stale != digest:
            self._close_unused(stale)
        if existing is not None:
            return existing
        # Connect outside the lock: an unreachable server must not block other policies.
        created = self._connect(url, self._timeout)
        with self._lock:
            winner = self._by_digest.setdefault(digest, created)
        if winner is not created:
            created.close()
        return winner

    def drop(self, policy: PolicyKey) -> None:
        """The policy is gone (or its client failed): release its client."""
        with self._lock:
            digest = self._policy_digest.pop(policy, None)
            if digest:
                self._release(digest)
        if digest:
            self._close_unused(digest)

    def invalidate(self, policy: PolicyKey) -> None:
        """Forget the policy's client after an error so the next use reconnects.

        Closed only when no other policy uses it: closing a shared client's
        pool closes the sockets of other policies' reads in flight on other
        threads (they failed with ValueError: I/O operation on closed file).
        A shared one is left to them; it is closed when the last of them lets
        it go (redis-py closes a client it frees)."""
        with self._lock:
            digest = self._policy_digest.get(policy)
            client = self._by_digest.pop(digest, None) if digest else None
            shared = digest is not None and self._users.get(digest, 0) > 1  # another policy names it too
        if client is not None and not shared:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close
                pass

    def _release(self, digest: str) -> None:
        """One policy fewer names ``digest`` (under the lock)."""
        left = self._users.get(digest, 0) - 1
        if left > 0:
            self._users[digest] = left
        else:
            self._users.pop(digest, None)

    def _close_unused(self, digest: str) -> None:
        with self._lock:
            if self._users.get(digest):
                return
            self._answered.discard(digest)
            client = self._by_digest.pop(digest, None)
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass

    def close_all(self) -> None:
        with self._lock:
            clients = list(self._by_digest.values())
            self._by_digest.clear()
            self._policy_digest.clear()
            self._users.clear()
            self._answered.clear()
        for client in clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
