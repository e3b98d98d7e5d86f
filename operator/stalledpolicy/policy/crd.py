"""The StalledPolicy API's names and declaration, and the CRD manifest itself.

The names, the printer columns, the resource's description and its versions
are declared here; the fields are the models' (:mod:`.resource`, :mod:`.models`).
``hack/gen-crd.py`` writes the manifest from both into the repository's
``crds/stalledpolicies.yaml`` (and the Helm chart's copy): ``make crd``. It is
not package data (a wheel cannot reach ``crds/``), so :func:`load_crd` reads it
from a source checkout, or from the path in ``$STALLEDPOLICY_CRD`` (for an
installed package, point it at the chart's copy). The operator itself never
needs the manifest at run time: the chart installs the CRD.
"""

from __future__ import annotations

import copy
import os
from functools import cache
from pathlib import Path
from typing import Any

GROUP = "queues.emq.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StalledPolicy"
PLURAL = "stalledpolicies"
SINGULAR = "stalledpolicy"
SHORT_NAME = "stp"
CRD_NAME = f"{PLURAL}.{GROUP}"
LIST_KIND = f"{KIND}List"
SCOPE = "Namespaced"
CATEGORIES = ("emq",)
LABELS = {"app.kubernetes.io/name": "stalledpolicy-operator", "app.kubernetes.io/component": "crd"}

DESCRIPTION = (
    "StalledPolicy bounds stalled-job recovery for one EchoMQ queue. When a worker's lease on a job lapses, a "
    "sweeper (a Deployment the operator runs for this policy) counts the stall on the job and either returns it "
    "to its queue or, once the job's stall count reaches the budget, dead-letters it into the queue's morgue "
    "(emq:{queue}:dead). The status reports the morgue size and the queue's depth."
)

_READY = '.status.conditions[?(@.type=="Ready")]'
# `kubectl get`'s columns (priority 1: with -o wide only), in the CRD's shape.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Queue", "type": "string", "jsonPath": ".spec.queue",
     "description": "The EchoMQ queue this policy sweeps."},
    {"name": "Max-Stalled", "type": "integer", "jsonPath": ".spec.maxStalled",
     "description": "The stall budget (0 = never dead-letter)."},
    {"name": "Interval", "type": "string", "jsonPath": ".spec.sweepInterval",
     "description": "Time between two sweeps."},
    {"name": "Dead", "type": "integer", "jsonPath": ".status.deadLetters",
     "description": "Jobs in the queue's morgue now."},
    {"name": "Ready", "type": "string", "jsonPath": f"{_READY}.status",
     "description": "Whether the sweeper runs and Redis is reachable."},
    {"name": "Reason", "type": "string", "jsonPath": f"{_READY}.reason",
     "description": "Why Ready is what it is (Suspended and ScaledToZero are Ready True with nothing sweeping); "
                    "the message is in status.conditions."},
    {"name": "Pending", "type": "integer", "jsonPath": ".status.pending", "priority": 1,
     "description": "Jobs waiting in the queue's flat pending set (lanes are in status.lanes)."},
    {"name": "Active", "type": "integer", "jsonPath": ".status.active", "priority": 1,
     "description": "Jobs claimed by workers now."},
    {"name": "Uncounted", "type": "integer", "jsonPath": ".status.uncountedLapsesTotal", "priority": 1,
     "description": "Lapsed leases other reapers returned before the sweep counted them (the budget did not see "
                    "those stalls)."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)
# The one version: served, stored, with the status subresource (only the operator writes status).
SUBRESOURCES: dict[str, Any] = {"status": {}}

CRD_PATH_ENV = "STALLEDPOLICY_CRD"
_REPO_CRD = Path(__file__).resolve().parents[3] / "crds" / "stalledpolicies.yaml"


def crd_path() -> Path:
    """Where the CRD manifest is: ``$STALLEDPOLICY_CRD``, else the source checkout's."""
    override = os.environ.get(CRD_PATH_ENV)
    path = Path(override) if override else _REPO_CRD
    if not path.is_file():
        raise FileNotFoundError(
            f"StalledPolicy CRD manifest not found at {path}; run from a source checkout "
            f"or set {CRD_PATH_ENV} to the chart's crds/stalledpolicies.yaml"
        )
    return path


@cache
def _load(path: str) -> dict[str, Any]:
    import yaml  # only callers that need the manifest pay for the import

    with open(path, encoding="utf-8") as handle:
        manifest: dict[str, Any] = yaml.safe_load(handle)
    return manifest


def load_crd() -> dict[str, Any]:
    """The CRD manifest as a dict (a fresh deep copy: callers may mutate it)."""
    return copy.deepcopy(_load(str(crd_path())))

