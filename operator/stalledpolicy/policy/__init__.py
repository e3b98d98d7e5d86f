"""The StalledPolicy API in pure Python: the spec models, the sweeper
Deployment builder and the status condition helpers. Nothing here does I/O or
imports kopf or the kubernetes client, so the operator, the tests and tools
share it cheaply.

- :mod:`.crd`: API names (group, version, kind, plural), printer columns, and the CRD manifest.
- :mod:`.models`: :class:`StalledPolicySpec` (``from_k8s``, ``sweeper_env``), :class:`PolicyError`.
- :mod:`.resource`: the whole object and its status, as the CRD declares them.
- :mod:`.schema`: the markers (CEL rules, CRD keywords) hack/gen-crd.py reads beside each field.
- :mod:`.builder`: :func:`build_sweeper_deployment`, :func:`sweeper_name`.
- :mod:`.conditions`: :func:`set_condition`.
"""

from stalledpolicy.policy.builder import (
    CONFIG_HASH_ANNOTATION,
    FIELD_MANAGER,
    build_sweeper_deployment,
    sweeper_labels,
    sweeper_name,
)
from stalledpolicy.policy.conditions import (
    READY,
    REDIS_REACHABLE,
    SWEEPER_AVAILABLE,
    Condition,
    set_condition,
)
from stalledpolicy.policy.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from stalledpolicy.policy.models import PolicyError, StalledPolicySpec

__all__ = [
    "API_VERSION",
    "CONFIG_HASH_ANNOTATION",
    "Condition",
    "FIELD_MANAGER",
    "GROUP",
    "KIND",
    "PLURAL",
    "PolicyError",
    "READY",
    "REDIS_REACHABLE",
    "SWEEPER_AVAILABLE",
    "StalledPolicySpec",
    "VERSION",
    "build_sweeper_deployment",
    "set_condition",
    "sweeper_labels",
    "sweeper_name",
]
