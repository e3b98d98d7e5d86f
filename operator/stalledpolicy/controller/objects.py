"""kopf's bodies as plain objects, and which of two is the newer.

Kubernetes resourceVersions are opaque: only two versions of the same object may
be compared, and only for equality. What the operator's memory needs to order, it
orders by other means: one object's watch events arrive in order; a version seen
once and since replaced is older than the current one; ``metadata.generation``
grows with each spec change of one object; of two objects that held one name, the
one created earlier was deleted before the other was created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stalledpolicy.controller.redis_clients import PolicyKey
from stalledpolicy.policy import builder


def plain(value: Any) -> Any:
    """kopf's bodies are mapping views; keep plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of an object to keep in memory, without ``managedFields``
    (about half of each object, never read here)."""
    copy: dict[str, Any] = plain(body)
    (copy.get("metadata") or {}).pop("managedFields", None)
    return copy


def policy_key(body: Mapping[str, Any]) -> PolicyKey:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


# Versions of one policy kept to recognise an older one delivered again (kopf's
# handler body, a watch event re-sent): a few reconciles' worth of events.
SEEN_VERSIONS = 32
# Seconds a status write of ours waits for the watch to deliver its version; the
# watch does so in milliseconds, so it was missed (a relist): trust the watch again.
WRITE_ECHO_TIMEOUT = 30.0
# Uids of deleted (or replaced) objects remembered: their late events are ignored.
RETIRED_UIDS = 4096


def metadata_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def resource_version(obj: Mapping[str, Any] | None) -> str | None:
    return metadata_of(obj).get("resourceVersion")


def generation_of(obj: Mapping[str, Any] | None) -> int:
    return int(metadata_of(obj).get("generation") or 0)


def created_before(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool | None:
    """Whether ``one`` was created before ``other`` (two objects that held the same
    name, one after the other); None when their creation times cannot tell
    (missing, or within the same second: the API keeps seconds)."""
    a, b = metadata_of(one).get("creationTimestamp"), metadata_of(other).get("creationTimestamp")
    if not a or not b or a == b:
        return None
    return str(a) < str(b)  # RFC 3339 UTC, one format: text order is time order


class RetiredUids:
    """Uids of deleted objects, the most recent RETIRED_UIDS (uids are never reused)."""

    def __init__(self, size: int = RETIRED_UIDS) -> None:
        self._uids: dict[str, None] = {}
        self._size = size

    def add(self, uid: str | None) -> None:
        if uid:
            self._uids.pop(uid, None)
            self._uids[uid] = None
            while len(self._uids) > self._size:
                self._uids.pop(next(iter(self._uids)))

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


def newer_deployment(body: Mapping[str, Any], known: Mapping[str, Any] | None, read: bool,
                      retired: RetiredUids) -> bool:
    """Whether ``body`` tells more about a sweeper Deployment than ``known`` (the
    one remembered under its name). One object: its watch events arrive in order,
    a read or apply of ours is newer only with a newer ``metadata.generation`` (its
    equal is no newer than the watch, which goes on from there; a status seen
    since would be lost). Another object of that name: not a deleted one, nor
    one created before ``known``."""
    uid = metadata_of(body).get("uid")
    if known is None:
        return read or uid not in retired
    if metadata_of(known).get("uid") == uid:
        if read:
            return generation_of(body) > generation_of(known)
        return generation_of(body) >= generation_of(known)
    if read:
        return True  # what the API server holds now
    return uid not in retired and created_before(body, known) is not True


def asks_for_pods(deployment: Mapping[str, Any] | None) -> bool:
    """Whether a Deployment asks for any pod (``spec.replicas``, 1 when unset, is not 0)."""
    return int(((deployment or {}).get("spec") or {}).get("replicas", 1) or 0) != 0


def sweeper_name(policy_name: str) -> str:
    return builder.sweeper_name(policy_name)


def is_deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))
