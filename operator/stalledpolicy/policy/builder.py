"""The sweeper Deployment of a StalledPolicy, as a pure function of the policy.

:func:`build_sweeper_deployment` returns the full object (a dict) the operator
server-side-applies; it does no I/O and returns the same dict for the same
input, so a second reconcile changes nothing. The container runs
``stalledpolicy sweep`` configured only through env (see
:meth:`StalledPolicySpec.sweeper_env`); the Redis URL of a ``secretRef``
arrives by ``secretKeyRef`` and is never inlined.

The pod template carries :data:`CONFIG_HASH_ANNOTATION`: a sha256 over the
sweep configuration (env values, the Secret's name and key, never its content),
the Lua scripts' digest and a digest of the referenced Secret value (computed
by the caller, also shown in :data:`SECRET_DIGEST_ANNOTATION`). Any change
to the budget, lanes, interval, the scripts or the Secret (a rotated password)
changes the template and so rolls the pods; replicas, suspend and metadata do
not. What the template shows itself (image, resources, scheduling, image pull
Secrets) is not hashed: a change of it changes the template directly, which
rolls the pods just the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stalledpolicy.policy.crd import API_VERSION, KIND
from stalledpolicy.policy.models import DEFAULT_METRICS_PORT, StalledPolicySpec

CONTAINER_NAME = "sweeper"
SWEEPER_COMMAND = ["stalledpolicy", "sweep"]
METRICS_PORT_NAME = "metrics"
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
METRICS_PATH = "/metrics"
RUN_AS_USER = 65532  # the image's unprivileged user (Dockerfile)

FIELD_MANAGER = "stalledpolicy-operator"
CONFIG_HASH_ANNOTATION = "queues.emq.dev/config-hash"
# The digest of the spec.redis.secretRef value the pods were started with.
SECRET_DIGEST_ANNOTATION = "queues.emq.dev/redis-secret-digest"
# The generation of the policy the Deployment was built from (the operator tells a
# budget edit made while it was down from a hand edit of the sweeper by it).
POLICY_GENERATION_ANNOTATION = "queues.emq.dev/policy-generation"
# A digest of the whole Deployment as built (this annotation aside): when the one
# on the sweeper equals the one the operator would apply at its start, whatever
# that apply changes was changed by someone else while it was down (drift), not by
# an edit of the policy, a rotated Secret or another version of the operator.
APPLIED_DIGEST_ANNOTATION = "queues.emq.dev/applied-digest"
POLICY_LABEL = "queues.emq.dev/policy"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
SWEEPER_APP = "stalledpolicy-sweeper"
MANAGED_BY = "stalledpolicy-operator"

DEFAULT_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
_SUFFIX = "-sweeper"
_MAX_NAME = 253
_MAX_LABEL_VALUE = 63


def _fit(name: str, limit: int) -> str:
    """``name`` if it fits in ``limit`` characters, else a prefix plus a short
    hash of the whole name (stable, and distinct for distinct long names)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-.')}-{digest}"


def sweeper_name(policy_name: str) -> str:
    """The sweeper Deployment's name: ``<policy>-sweeper`` (hash-shortened past 253 characters)."""
    return _fit(policy_name, _MAX_NAME - len(_SUFFIX)) + _SUFFIX


def sweeper_labels(policy_name: str) -> dict[str, str]:
    """Labels of the Deployment and its pods (the first two are the selector)."""
    value = _fit(policy_name, _MAX_LABEL_VALUE)
    return {
        NAME_LABEL: SWEEPER_APP,
        INSTANCE_LABEL: value,
        MANAGED_BY_LABEL: MANAGED_BY,
        COMPONENT_LABEL: "sweeper",
        POLICY_LABEL: value,
    }


def sweeper_selector(policy_name: str) -> dict[str, str]:
    """The Deployment's ``matchLabels`` (immutable once created, so kept minimal)."""
    labels = sweeper_labels(policy_name)
    return {NAME_LABEL: labels[NAME_LABEL], INSTANCE_LABEL: labels[INSTANCE_LABEL]}


def owner_reference(policy_name: str, uid: str) -> dict[str, Any]:
    """The controller reference from a sweeper to its policy (garbage collection)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": policy_name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def config_hash(env: list[dict[str, Any]], scripts_digest: str, secret_digest: str | None = None) -> str:
    """sha256 over the container env (values and secretKeyRef names, never
    secret contents), the Lua scripts' digest and the digest of the referenced
    Secret value (when known; without one the hash is what it always was)."""
    config: dict[str, Any] = {"env": env, "scripts": scripts_digest}
    if secret_digest is not None:
        config["secretDigest"] = secret_digest
    canonical = json.dumps(config, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _restricted_container_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def build_sweeper_deployment(
    policy_name: str,
    namespace: str,
    uid: str,
    spec: StalledPolicySpec,
    *,
    image: str,
    generation: int | None = None,
    scripts_digest: str | None = None,
    metrics_port: int = DEFAULT_METRICS_PORT,
    secret_digest: str | None = None,
) -> dict[str, Any]:
    """The sweeper Deployment (apps/v1) for one policy, ready for server-side apply.

    ``image`` is the default image (the operator's own); ``spec.sweeper.image``
    overrides it. ``generation`` (the policy's metadata.generation) is recorded
    in a Deployment annotation only, so it never rolls the pods.
    ``scripts_digest`` defaults to :func:`stalledpolicy.lua.scripts_digest`
    (injectable for tests). ``suspend`` gives zero replicas.
    ``secret_digest`` is an opaque digest of the value of ``spec.redis.secretRef``
    (the operator passes a digest of that key's value, never the value; None:
    unknown): a new one changes the pod template, so a rotated password reaches
    the pods. Used as given, never read from the Secret here. Ignored for an inline URL.
    """
    if scripts_digest is None:
        # deferred: stalledpolicy.lua imports redis-py; every command imports this module (through controller/)
        from stalledpolicy.lua import scripts_digest as current_digest

        scripts_digest = current_digest()

    overrides = spec.sweeper
    labels = sweeper_labels(policy_name)
    env = spec.sweeper_env(metrics_port=metrics_port)
    env.append({"name": "STALLEDPOLICY_POLICY", "value": f"{namespace}/{policy_name}"})

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": overrides.image or image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(SWEEPER_COMMAND),
        "env": env,
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": metrics_port, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": LIVENESS_PATH, "port": METRICS_PORT_NAME},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": READINESS_PATH, "port": METRICS_PORT_NAME},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "resources": overrides.resources.to_k8s() if overrides.resources else _copy(DEFAULT_RESOURCES),
        "securityContext": _restricted_container_context(),
        # A read-only root still needs somewhere for Python's temp files.
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }

    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
    }
    if overrides.node_selector:
        pod_spec["nodeSelector"] = dict(overrides.node_selector)
    if overrides.tolerations:
        pod_spec["tolerations"] = [t.to_k8s() for t in overrides.tolerations]
    if overrides.priority_class_name:
        pod_spec["priorityClassName"] = overrides.priority_class_name
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [secret.to_k8s() for secret in overrides.image_pull_secrets]

    if spec.redis.secret_ref is None:
        secret_digest = None
    template_annotations = {
        CONFIG_HASH_ANNOTATION: config_hash(env, scripts_digest, secret_digest),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(metrics_port),
        "prometheus.io/path": METRICS_PATH,
    }
    if secret_digest is not None:
        template_annotations[SECRET_DIGEST_ANNOTATION] = secret_digest

    annotations = {}
    if generation is not None:
        annotations[POLICY_GENERATION_ANNOTATION] = str(generation)

    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": sweeper_name(policy_name),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(policy_name, uid)],
        },
        "spec": {
            "replicas": 0 if spec.suspend else overrides.replicas,
            "revisionHistoryLimit": 3,
            "strategy": {
                "type": "RollingUpdate",
                # Start the new sweeper before stopping the old: two sweepers at
                # once are safe (every sweep call is one atomic script).
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "selector": {"matchLabels": sweeper_selector(policy_name)},
            "template": {
                "metadata": {
                    "labels": dict(labels),
                    "annotations": template_annotations,
                },
                "spec": pod_spec,
            },
        },
    }
    annotations[APPLIED_DIGEST_ANNOTATION] = applied_digest(deployment)
    return deployment


def applied_digest(deployment: dict[str, Any]) -> str:
    """The digest of ``deployment`` as built, without its own annotation."""
    annotations = {k: v for k, v in deployment["metadata"]["annotations"].items() if k != APPLIED_DIGEST_ANNOTATION}
    body = {**deployment, "metadata": {**deployment["metadata"], "annotations": annotations}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied
