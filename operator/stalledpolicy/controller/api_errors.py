"""The Kubernetes API's refusals, in the API server's own words."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from stalledpolicy.controller.status import api_text


def api_error_types() -> tuple[type[BaseException], ...]:
    import urllib3  # deferred: with the kubernetes client
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    return ApiException, urllib3.exceptions.HTTPError, OSError


def describe_api_error(exc: BaseException) -> str:
    """The API server's own words for a refused request: ``HTTP 422 Unprocessable
    Entity: Deployment.apps "x" is invalid: ...``. The request was our sweeper
    Deployment, which holds no secret (the Redis URL of a Secret arrives by
    secretKeyRef, an inline URL is credential-free by validation), so neither
    does the message; any ``user:password@`` in it is masked all the same."""
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    if isinstance(exc, ApiException):
        text = f"HTTP {exc.status} {exc.reason}"
        detail = None
        try:
            detail = json.loads(exc.body).get("message") if exc.body else None
        except (TypeError, ValueError, AttributeError):
            pass
        if detail:
            text += f": {detail}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return api_text(text)


# Fields of the sweeper Deployment that a StalledPolicy sets, by the names the API
# server gives them in a refusal: the message then names the policy's field too.
_POLICY_FIELDS = (
    (re.compile(r"spec\.template\.spec\.containers\[0\]\.resources"), "spec.sweeper.resources"),
    (re.compile(r"spec\.template\.spec\.containers\[0\]\.image\b"), "spec.sweeper.image"),
    (re.compile(r"spec\.template\.spec\.priorityClassName"), "spec.sweeper.priorityClassName"),
    (re.compile(r"spec\.template\.spec\.nodeSelector"), "spec.sweeper.nodeSelector"),
    (re.compile(r"spec\.template\.spec\.tolerations"), "spec.sweeper.tolerations"),
    (re.compile(r"spec\.template\.spec\.imagePullSecrets"), "spec.sweeper.imagePullSecrets"),
    (re.compile(r"(?<![\w.])spec\.replicas\b"), "spec.sweeper.replicas"),
)


def with_policy_fields(message: str) -> str:
    """``message`` (an API refusal of the sweeper Deployment), followed by the
    StalledPolicy fields that set the Deployment fields it names: the user edits
    the policy, not the Deployment."""
    fields = [field for pattern, field in _POLICY_FIELDS if pattern.search(message)]
    if not fields:
        return message
    return f"{message} (set by the StalledPolicy's {', '.join(fields)})"


def namespace_terminating(exc: BaseException) -> bool:
    """The API server refused a create because the namespace is being deleted
    (403 with the NamespaceTerminating cause)."""
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    if not isinstance(exc, ApiException) or exc.status != 403 or not exc.body:
        return False
    try:
        causes = (json.loads(exc.body).get("details") or {}).get("causes") or []
    except (TypeError, ValueError, AttributeError):
        return False
    return any(isinstance(c, Mapping) and c.get("reason") == "NamespaceTerminating" for c in causes)
