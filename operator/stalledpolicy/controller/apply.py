"""Server-side apply of the sweeper Deployment, and the ownership check before it
(or, for a first apply, a precondition that nothing of that name exists).

Apply (``application/apply-patch+yaml``) with one field manager makes the
reconcile level-based: the API server merges our intent with what others own,
and an unchanged intent is a no-op (no write, same resourceVersion). ``force``
is right for a controller: the fields in our intent are ours, and a drift made
by someone else (a manual ``kubectl scale``) is taken back. It is only ever used
on a Deployment this policy controls (``conflict_reason`` first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from stalledpolicy.controller import FIELD_MANAGER, GROUP, KIND
from stalledpolicy.policy.builder import (
    APPLIED_DIGEST_ANNOTATION,
    CONTAINER_NAME,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POLICY_LABEL,
    sweeper_labels,
)
from stalledpolicy.sweeper.config import ENV_PREFIX

log = logging.getLogger("stalledpolicy.operator")

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
JSON_PATCH_CONTENT_TYPE = "application/json-patch+json"


def controller_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            found: Mapping[str, Any] = ref
            return found
    return None


def policy_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controller owner of ``obj`` when it is a StalledPolicy (of our API group), else None."""
    owner = controller_owner(obj)
    if owner is None or owner.get("kind") != KIND:
        return None
    if str(owner.get("apiVersion") or "").split("/")[0] != GROUP:
        return None
    return owner


def adoptable(existing: Mapping[str, Any], policy_name: str) -> bool:
    """Whether ``existing``, a Deployment of the sweeper's name with no controller
    owner, is this policy's sweeper that lost its owner reference (a hand edit, a
    GitOps tool, ``kubectl delete stalledpolicy --cascade=orphan``): it carries
    the labels the operator writes for this policy and our field manager wrote
    it. The apply puts the owner reference back."""
    meta = existing.get("metadata") or {}
    labels = meta.get("labels") or {}
    managers = {e.get("manager") for e in meta.get("managedFields") or [] if isinstance(e, Mapping)}
    return (controller_owner(existing) is None and FIELD_MANAGER in managers
            and labels.get(MANAGED_BY_LABEL) == MANAGED_BY
            and labels.get(POLICY_LABEL) == sweeper_labels(policy_name)[POLICY_LABEL])


def conflict_reason(existing: Mapping[str, Any] | None, policy_uid: str, policy_name: str) -> str | None:
    """Why ``existing`` (a Deployment with our name) must not be taken over, or None."""
    if existing is None:
        return None
    owner = controller_owner(existing)
    if owner is None:
        if adoptable(existing, policy_name):
            return None
        return "it has no controller owner (it was not created by this operator)"
    if owner.get("uid") != policy_uid:
        return (f"it is controlled by {owner.get('kind', '?')} {owner.get('name', '?')} "
                f"(uid {owner.get('uid', '?')}), not by this policy")
    return None


def earlier_policy_uid(existing: Mapping[str, Any] | None, policy_name: str, policy_uid: str) -> str | None:
    """The uid of the earlier StalledPolicy of this name (deleted, since the name
    is now another object's) that still controls ``existing``, or None. Such a
    Deployment is the garbage collector's to delete: not a name conflict."""
    owner = policy_owner(existing or {})
    if owner is None or owner.get("name") != policy_name:
        return None
    uid = owner.get("uid")
    return uid if uid and uid != policy_uid else None


def _json(response: Any) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(response.data)
    return decoded


def read_deployment(apps: Any, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    try:
        return _json(apps.read_namespaced_deployment(name, namespace, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _sweeper_container(deployment: Mapping[str, Any]) -> tuple[int, Mapping[str, Any]] | None:
    containers = ((((deployment.get("spec") or {}).get("template") or {}).get("spec") or {})
                  .get("containers") or [])
    for index, container in enumerate(containers):
        if isinstance(container, Mapping) and container.get("name") == CONTAINER_NAME:
            return index, container
    return None


def foreign_settings_patch(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch operations that take out of the stored sweeper container what
    another writer added and the sweeper would run with: ``args`` (flags win over
    the environment), ``envFrom`` (it may bring any variable) and
    ``STALLEDPOLICY_*`` variables the policy does not set.
    Server-side apply never removes them: they are another field manager's, not
    in our intent. Each removal is guarded by a ``test`` of what it removes (a
    write in between fails the patch, and the next event tries again). Other
    variables (a proxy, a CA bundle) are left to their writer."""
    found, wanted = _sweeper_container(stored), _sweeper_container(desired)
    if found is None or wanted is None:
        return []
    index, container = found
    base = f"/spec/template/spec/containers/{index}"
    ops: list[dict[str, Any]] = [{"op": "test", "path": f"{base}/name", "value": CONTAINER_NAME}]
    ours = {entry.get("name") for entry in wanted[1].get("env") or []}
    env = container.get("env") or []
    for position in reversed(range(len(env))):  # from the end: the indexes before stay valid
        name = env[position].get("name") if isinstance(env[position], Mapping) else None
        if isinstance(name, str) and name.startswith(ENV_PREFIX) and name not in ours:
            ops += [{"op": "test", "path": f"{base}/env/{position}/name", "value": name},
                    {"op": "remove", "path": f"{base}/env/{position}"}]
    for field in ("args", "envFrom"):  # envFrom: a ConfigMap's or Secret's STALLEDPOLICY_* variables
        if container.get(field) and not wanted[1].get(field):
            ops += [{"op": "test", "path": f"{base}/{field}", "value": container[field]},
                    {"op": "remove", "path": f"{base}/{field}"}]
    return ops if len(ops) > 1 else []


def already_applied(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether applying ``desired`` would change nothing on ``existing`` (the Deployment
    as just read): it carries the applied digest of ``desired`` (a cheap no: an edit,
    a rotated Secret, another operator version), every field of ``desired`` with its
    value (another writer's change or removal since our apply shows here; fields only
    the API server or others set are not looked at), and nothing another writer
    added that the sweeper would run with (``foreign_settings_patch``).
    docs/architecture.md, "No apply that would change nothing"."""
    if existing is None:
        return False
    digest = ((desired.get("metadata") or {}).get("annotations") or {}).get(APPLIED_DIGEST_ANNOTATION)
    if digest is None or ((existing.get("metadata") or {}).get("annotations") or {}).get(
            APPLIED_DIGEST_ANNOTATION) != digest:
        return False
    return _holds(existing, desired) and not foreign_settings_patch(existing, desired)


def _holds(live: Any, wanted: Any) -> bool:
    """Whether ``live`` has every field of ``wanted`` with its value. Lists of named
    items (containers, env, ports, volumes) are matched by name, as server-side apply
    merges them; other lists must be equal item by item."""
    if isinstance(wanted, Mapping):
        return isinstance(live, Mapping) and all(k in live and _holds(live[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        if not isinstance(live, list):
            return False
        if wanted and all(isinstance(item, Mapping) and "name" in item for item in wanted):
            named = {item.get("name"): item for item in live if isinstance(item, Mapping)}
            return all(item["name"] in named and _holds(named[item["name"]], item) for item in wanted)
        return len(live) == len(wanted) and all(_holds(a, b) for a, b in zip(live, wanted))
    return type(live) is type(wanted) and live == wanted


# A resourceVersion no stored object has: etcd numbers the empty store's revision 1,
# every write gets a later one, and an object's resourceVersion is its last write's.
NO_STORED_VERSION = "1"


def create_deployment(apps: Any, deployment: Mapping[str, Any]) -> dict[str, Any] | None:
    """Server-side apply ``deployment`` only when no Deployment of its name exists:
    the object as created, or None when one exists (nothing was written; read it
    and judge it, as before any apply). The apply carries ``NO_STORED_VERSION`` as
    its resourceVersion, a precondition: the API server refuses it (409) against
    any stored object, and drops it when the apply creates the object.
    docs/architecture.md, "A first apply without a read"."""
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    meta = deployment["metadata"]
    intent = {**deployment, "metadata": {**meta, "resourceVersion": NO_STORED_VERSION}}
    try:
        response = apps.patch_namespaced_deployment(
            meta["name"], meta["namespace"], intent,
            field_manager=FIELD_MANAGER, force=True,
            _content_type=APPLY_CONTENT_TYPE, _preload_content=False,
        )
    except ApiException as exc:
        if exc.status == 409:  # force: no field conflict, so the precondition: it exists
            return None
        raise
    return _json(response)


def apply_deployment(apps: Any, deployment: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply ``deployment``, then take out what another writer added
    that the sweeper would run with (:func:`foreign_settings_patch`); returns the
    object as stored."""
    meta = deployment["metadata"]
    response = apps.patch_namespaced_deployment(
        meta["name"], meta["namespace"], dict(deployment),
        field_manager=FIELD_MANAGER, force=True,
        _content_type=APPLY_CONTENT_TYPE, _preload_content=False,
    )
    stored = _json(response)
    ops = foreign_settings_patch(stored, deployment)
    if not ops:
        return stored
    removed = [op["value"] if op["path"].endswith("/name") else op["path"].rsplit("/", 1)[1]
               for op in ops[1::2]]
    log.info("taking out of the sweeper what another writer added to it", extra={
        "namespace": meta["namespace"], "deployment": meta["name"], "removed": ",".join(removed)})
    response = apps.patch_namespaced_deployment(
        meta["name"], meta["namespace"], ops, field_manager=FIELD_MANAGER,
        _content_type=JSON_PATCH_CONTENT_TYPE, _preload_content=False)
    return _json(response)


def scale_to_zero(apps: Any, namespace: str, name: str) -> None:
    """Scale a sweeper Deployment of ours to 0 replicas (kept: the operator may not delete it)."""
    apps.patch_namespaced_deployment(name, namespace, {"spec": {"replicas": 0}},
                                     field_manager=FIELD_MANAGER,
                                     _content_type="application/merge-patch+json")
