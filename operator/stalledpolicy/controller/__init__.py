"""The kopf operator: reconciles StalledPolicy resources into sweeper Deployments.

``main`` registers the kopf handlers (and nothing else); the work is done by
small modules: ``reconcile`` (policy -> Deployment), ``apply`` (server-side
apply), ``status`` (queue numbers and conditions), ``replay`` (the replay
annotation), ``events`` and ``redis_clients``. Only ``cli.run`` and ``main``
import kopf.
"""

GROUP = "queues.emq.dev"
VERSION = "v1alpha1"
PLURAL = "stalledpolicies"
KIND = "StalledPolicy"
FIELD_MANAGER = "stalledpolicy-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "stalledpolicy-operator"
REPLAY_ANNOTATION = f"{GROUP}/replay"
REPLAY_LANE_ANNOTATION = f"{GROUP}/replay-lane"
