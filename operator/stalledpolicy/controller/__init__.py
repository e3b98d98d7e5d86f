"""The kopf operator: reconciles StalledPolicy resources into sweeper Deployments.

``main`` registers the kopf handlers (and nothing else); the work is done by
small modules: ``reconcile`` (policy -> Deployment), ``sweeper_image`` (the
image allowlist), ``reapply`` (re-applies outside kopf's handlers: a deleted
sweeper, a changed Secret), ``drift`` (a sweeper changed outside its policy;
``drift_reverts``: its revert budget),
``apply`` (server-side apply), ``runtime`` (the operator's memory, the
``Controller``), ``status_loop`` (each policy's status refreshed and written),
``queue_reading`` (the queue read for it), ``objects`` (kopf's bodies, and which
is newer), ``status`` (what the operator observes, and the conditions),
``status_document`` (the whole status, and the patch that writes it),
``replay`` (the replay annotation), ``replay_serving`` (the status loop serving
it), ``queue_claims`` (one sweeper per queue), ``redis_hosts`` (one Redis
named two ways), ``events`` and ``redis_clients``. Only ``cli.run`` and ``main`` import kopf.
"""

# The API's names and the sweeper's labels are the policy package's (one place each).
from stalledpolicy.policy.builder import FIELD_MANAGER, MANAGED_BY_LABEL
from stalledpolicy.policy.builder import MANAGED_BY as MANAGED_BY_VALUE
from stalledpolicy.policy.crd import GROUP, KIND, PLURAL, VERSION

__all__ = ["FIELD_MANAGER", "GROUP", "KIND", "MANAGED_BY_LABEL", "MANAGED_BY_VALUE", "PLURAL",
           "REPLAY_ANNOTATION", "REPLAY_LANE_ANNOTATION", "VERSION"]

REPLAY_ANNOTATION = f"{GROUP}/replay"
REPLAY_LANE_ANNOTATION = f"{GROUP}/replay-lane"
