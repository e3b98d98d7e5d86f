"""Names of the StalledPolicy API, and the CRD manifest itself.

The manifest lives at the repository root, ``crds/stalledpolicies.yaml``: the
one source that the tests apply and the Helm chart copies. It is not package
data (a wheel cannot reach ``crds/``), so :func:`load_crd` reads it from a
source checkout, or from the path in ``$STALLEDPOLICY_CRD`` (for an installed
package, point it at the chart's copy). The operator itself never needs the
manifest at run time: the chart installs the CRD.
"""

from __future__ import annotations

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
    import copy

    return copy.deepcopy(_load(str(crd_path())))


def spec_schema() -> dict[str, Any]:
    """The OpenAPI schema of ``spec`` in the served version (for consistency checks)."""
    versions = load_crd()["spec"]["versions"]
    served = next(v for v in versions if v["name"] == VERSION)
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema
