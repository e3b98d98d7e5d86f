"""The kopf operator: reconciles StalledPolicy resources into sweeper Deployments.

docs/architecture.md has the shape: kopf is the event source; every trigger
enqueues a policy key; ``sync`` (sync.py) is the one place that applies a
sweeper Deployment (``reconcile``) and refreshes the status
(``status_refresh``). ``main`` registers the kopf handlers (and nothing else);
``runtime`` holds the operator's memory (the ``Controller``); the triggers are
``drift`` (a sweeper changed outside its policy; ``drift_reverts``: its revert
budget) and ``sweeper_events`` (a sweeper deleted or disowned), each an
``ApplyRequest`` (apply_requests.py); ``retry`` is the one retry policy. Only
``cli.run`` and ``main`` import kopf.
"""

# The API's names and the sweeper's labels are the policy package's (one place each).
from stalledpolicy.policy.builder import FIELD_MANAGER, MANAGED_BY_LABEL
from stalledpolicy.policy.builder import MANAGED_BY as MANAGED_BY_VALUE
from stalledpolicy.policy.crd import GROUP, KIND, PLURAL, VERSION

__all__ = ["FIELD_MANAGER", "GROUP", "KIND", "MANAGED_BY_LABEL", "MANAGED_BY_VALUE", "PLURAL",
           "REPLAY_ANNOTATION", "REPLAY_LANE_ANNOTATION", "VERSION"]

REPLAY_ANNOTATION = f"{GROUP}/replay"
REPLAY_LANE_ANNOTATION = f"{GROUP}/replay-lane"
