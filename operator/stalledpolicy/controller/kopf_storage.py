"""kopf's state on a policy, bound to the object it was written for (its uid).

kopf keeps two things in a policy's annotations: the last handled configuration
(the diff base: the spec it last reconciled) and, while a handler is retried,
its progress. Annotations travel with the object: an export (``kubectl get -o
yaml``, Velero, a GitOps repository) keeps them, and an object created again
from it carries the state of its predecessor. kopf then compares the new
object with its predecessor's last handled spec, finds no change and runs no
handler, so the new policy got no sweeper and no status until a restart.

Here each value records the uid of the object it was written for, and a value
written for another uid reads as absent: the object is handled as new (kopf's
create handlers), its predecessor's retry count and delay are not inherited.

Values written before this module (no uid) are trusted as kopf always trusted
them, so an upgrade changes nothing for existing policies (a resume, no create,
no write), unless the API server's managed fields say the annotation was set by
someone other than kopf (``kubectl create``, Velero, a GitOps tool: a copy made
before the upgrade). Managed fields say nothing (stripped, or a server without
them): trusted. kopf stores the diff base again only when the spec changes, so
a trusted uid-less value would stay forever, and with it the trust: a copy of
such a policy created again with kopf named as the annotation's manager (the
API server names a create's own field manager, whatever managed fields the
copy kept) was taken for the same object and got no sweeper. The
resume handler therefore rewrites a trusted uid-less diff base once with the
object's uid (:meth:`UidDiffBaseStorage.bind_uid`: the stored essence
unchanged, the uid added; one annotation in the resume's own patch, no handler
runs for it).

Where the uid goes, so an older operator still reads the values (a rollback):

- diff base: an annotation inside the stored essence, under our prefix
  (``<prefix>/handled-uid``). kopf's annotations progress storage of the same
  prefix strips every ``<prefix>/`` annotation from both essences before it
  diffs them, so an older version sees no change;
- progress: a ``uid`` key in the record; kopf reads the keys it knows.
"""

from __future__ import annotations

import copy
import json
import logging
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from typing import Any, cast

import kopf

log = logging.getLogger("stalledpolicy.operator")

# The field manager the API server records for kopf's own patches: the
# User-Agent ("kopf/<version>") up to its first "/", kopf sets no fieldManager.
KOPF_FIELD_MANAGERS: frozenset[str] = frozenset({"kopf"})
UID_NAME = "handled-uid"      # the annotation inside a stored essence
PROGRESS_UID_KEY = "uid"      # the key inside a progress record
_REPORTED_MAX = 4096


def annotation_owners(body: Mapping[str, Any], key: str) -> frozenset[str] | None:
    """The field managers owning ``metadata.annotations[key]``; None when the
    object has no managed fields at all (nothing to judge by)."""
    entries = (body.get("metadata") or {}).get("managedFields")
    if not entries:
        return None
    owners = set()
    field = f"f:{key}"
    for entry in entries:
        fields = (entry or {}).get("fieldsV1") or {}
        annotations = (fields.get("f:metadata") or {}).get("f:annotations") or {}
        if field in annotations and entry.get("manager"):
            owners.add(entry["manager"])
    return frozenset(owners)


class _UidBinding:
    """What both storages share: whose value is it, and saying so once."""

    def __init__(self, *, own_managers: Collection[str]) -> None:
        self.own_managers = frozenset(own_managers)
        self._reported: OrderedDict[tuple[str, str], None] = OrderedDict()

    def copied(self, body: Mapping[str, Any], full_key: str, stored_uid: str | None) -> bool:
        """True when the value under ``full_key`` was not written for this object."""
        uid = (body.get("metadata") or {}).get("uid")
        if stored_uid is not None:
            return bool(uid) and stored_uid != uid
        owners = annotation_owners(body, full_key)
        # No managed fields, or the annotation in none of them: no evidence of a copy.
        return owners is not None and bool(owners) and not (owners & self.own_managers)

    def report(self, body: Mapping[str, Any], full_key: str, stored_uid: str | None) -> None:
        """One INFO line per object and annotation (fetch runs on every event)."""
        meta = body.get("metadata") or {}
        mark = (str(meta.get("uid")), full_key)
        if mark in self._reported:
            return
        self._reported[mark] = None
        while len(self._reported) > _REPORTED_MAX:
            self._reported.popitem(last=False)
        whose = (f"the object with uid {stored_uid}" if stored_uid is not None
                 else "another object (set by "
                      f"{', '.join(sorted(annotation_owners(body, full_key) or ()))}, not kopf)")
        log.info(f"kopf state {full_key} was written for {whose}: ignored, this policy is "
                 "handled as a new one",
                 extra={"namespace": meta.get("namespace"), "policy": meta.get("name"),
                        "uid": meta.get("uid")})


class UidDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotations diff base, valid only for the object it was written for."""

    def __init__(self, *, prefix: str, key: str = "last-handled-configuration",
                 own_managers: Collection[str] = KOPF_FIELD_MANAGERS,
                 ignored_fields: Iterable[Any] | None = None) -> None:
        super().__init__(prefix=prefix, key=key, ignored_fields=ignored_fields)
        self.uid_annotation = f"{prefix}/{UID_NAME}"
        self._binding = _UidBinding(own_managers=own_managers)

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        """kopf's essence of ``body``, the same, without deep-copying what it drops:
        kopf copies the whole body, then drops ``status`` and ``metadata`` (keeping
        the labels and annotations). Built on every policy event, the copy of
        ``metadata.managedFields`` and ``status`` was a fifth of kopf's loop at a
        cold start of 10,000 policies. With extra fields (none of our handlers asks
        for any) kopf's own build, unchanged."""
        if extra_fields:
            return super().build(body=body, extra_fields=extra_fields)
        slim = {k: v for k, v in body.items() if k != "status"}
        metadata = body.get("metadata")
        if isinstance(metadata, Mapping):
            slim["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
        return super().build(body=kopf.Body(cast(kopf.RawBody, slim)), extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        for full_key in self.make_keys(self.key, body=body):
            encoded = body.metadata.annotations.get(full_key, None)
            decoded = json.loads(encoded) if encoded is not None else None
            if decoded is None:
                continue
            stored_uid = self._pop_uid(decoded)
            if self._binding.copied(body, full_key, stored_uid):
                self._binding.report(body, full_key, stored_uid)
                return None
            return cast(kopf.BodyEssence, decoded)
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        uid = body.metadata.uid
        if uid:
            essence = copy.deepcopy(essence)
            metadata = essence.setdefault("metadata", {})
            metadata.setdefault("annotations", {})[self.uid_annotation] = uid
        super().store(body=body, patch=patch, essence=essence)

    def bind_uid(self, *, body: kopf.Body, patch: kopf.Patch) -> bool:
        """Put into ``patch`` the diff base of ``body`` written before uids (no uid,
        trusted by :meth:`fetch`) with ``body``'s uid added, the essence unchanged.
        False, and nothing patched, for any other value (bound, copied, absent)."""
        uid = body.metadata.uid
        if not uid:
            return False
        for full_key in self.make_keys(self.key, body=body):
            encoded = body.metadata.annotations.get(full_key, None)
            decoded = json.loads(encoded) if encoded is not None else None
            if decoded is None:
                continue
            if self._pop_uid(decoded) is not None or self._binding.copied(body, full_key, None):
                return False
            self.store(body=body, patch=patch, essence=decoded)
            log.info(f"kopf state {full_key} written before uids were recorded: bound to this policy's uid",
                     extra={"namespace": body.metadata.namespace, "policy": body.metadata.name, "uid": uid})
            return True
        return False

    def _pop_uid(self, essence: kopf.BodyEssence) -> str | None:
        annotations = (essence.get("metadata") or {}).get("annotations") or {}
        uid = annotations.pop(self.uid_annotation, None)
        self.remove_empty_stanzas(essence)
        return uid if isinstance(uid, str) else None


class UidProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotations progress storage, each record valid only for the
    object it was written for."""

    def __init__(self, *, prefix: str, own_managers: Collection[str] = KOPF_FIELD_MANAGERS,
                 **kwargs: Any) -> None:
        super().__init__(prefix=prefix, **kwargs)
        self._binding = _UidBinding(own_managers=own_managers)

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        for full_key in self.make_keys(key, body=body):
            encoded = body.metadata.annotations.get(full_key, None)
            decoded = json.loads(encoded) if encoded is not None else None
            if decoded is None:
                continue
            stored_uid = decoded.pop(PROGRESS_UID_KEY, None) if isinstance(decoded, dict) else None
            if self._binding.copied(body, full_key, stored_uid):
                self._binding.report(body, full_key, stored_uid)
                return None
            return cast(kopf.ProgressRecord, decoded)
        return None

    def store(self, *, key: kopf.HandlerId, record: kopf.ProgressRecord, body: kopf.Body,
              patch: kopf.Patch) -> None:
        uid = body.metadata.uid
        if uid:
            record = cast(kopf.ProgressRecord, {**record, PROGRESS_UID_KEY: uid})  # a key kopf does not read
        super().store(key=key, record=record, body=body, patch=patch)
