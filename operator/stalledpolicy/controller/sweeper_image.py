"""The sweeper's image: the operator's own by default, any other only when the
operator's admin allows it (``spec.sweeper.image`` against the allowlist), and
a sweeper already running a refused image scaled to zero."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from stalledpolicy.controller import events
from stalledpolicy.controller.api_errors import api_error_types, describe_api_error
from stalledpolicy.controller.apply import conflict_reason, read_deployment, scale_to_zero
from stalledpolicy.controller.config import image_allowed
from stalledpolicy.controller.objects import asks_for_pods, sweeper_name
from stalledpolicy.controller.retry import InvalidPolicy, RetryLater
from stalledpolicy.controller.status import ReconcileOutcome

if TYPE_CHECKING:  # for the annotations only: runtime imports this module (through sync)
    from stalledpolicy.controller.runtime import Controller


log = logging.getLogger("stalledpolicy.operator")


SWEEPER_REPOSITORY = "ghcr.io/stalledpolicy/stalledpolicy-operator"


def default_sweeper_image() -> str:
    """The operator's own image at its own version (one image runs both)."""
    from importlib.metadata import PackageNotFoundError, version  # deferred: read only when no sweeper image is set

    try:
        return f"{SWEEPER_REPOSITORY}:{version('stalledpolicy-operator')}"
    except PackageNotFoundError:
        return f"{SWEEPER_REPOSITORY}:latest"


def own_sweeper_image(ctl: Controller) -> str:
    """The image a policy without ``spec.sweeper.image`` runs (always allowed)."""
    return ctl.config.sweeper_image or default_sweeper_image()


def sweeper_image_allowed(ctl: Controller, image: str) -> bool:
    return image_allowed(image, ctl.config.allowed_sweeper_images, own_sweeper_image(ctl))


def _deployment_images(deployment: Mapping[str, Any]) -> list[str]:
    pod = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {})
    return [c.get("image") or "" for key in ("initContainers", "containers")
            for c in pod.get(key) or [] if isinstance(c, Mapping)]


def refuse_image(ctl: Controller, body: dict[str, Any], generation: int, image: str) -> NoReturn:
    """``spec.sweeper.image`` is not on the operator's allowlist: the sweeper gets the
    Redis URL from a Secret of the namespace, so an image of the policy author's
    choosing could read any Secret there. InvalidSpec, like any spec the operator
    will not run (see :func:`_stop_refused_sweeper` for a sweeper already running)."""
    meta = body.get("metadata") or {}
    own = own_sweeper_image(ctl)
    allowed = ", ".join(repr(p) for p in ctl.config.allowed_sweeper_images)
    message = (f"spec.sweeper.image {image!r} is not an allowed sweeper image (the operator allows "
               f"{own!r}" + (f" and {allowed}" if allowed else " only") + "): remove spec.sweeper.image "
               "to run the default image, or ask the operator's admin to add this image to the chart "
               "value sweeperAllowedImages (--allowed-sweeper-image)")
    try:
        message += _stop_refused_sweeper(ctl, meta)
    except api_error_types() as exc:
        deployment_name = sweeper_name(str(meta.get("name") or ""))
        message += (f"; Deployment {meta.get('namespace')}/{deployment_name} may still run a refused image, "
                    f"checking it or scaling it to 0 failed: {describe_api_error(exc)}")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, message))
        raise RetryLater(message, events.INVALID_SPEC) from None
    ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, message))
    raise InvalidPolicy(message)


def _stop_refused_sweeper(ctl: Controller, meta: Mapping[str, Any]) -> str:
    """As for any InvalidSpec, the policy's existing sweeper keeps its last applied
    spec, but only while that runs allowed images: one that runs a refused image
    (the list was narrowed, or the sweeper predates the list) is scaled to 0
    replicas (the operator may not delete Deployments) until the spec is fixed
    and applied again. What was found, as a clause for the InvalidSpec message."""
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    deployment_name = sweeper_name(name)
    existing = read_deployment(ctl.apps, namespace, deployment_name)
    if existing is None or conflict_reason(existing, str(meta.get("uid") or ""), name) is not None:
        return ""
    refused = [i for i in _deployment_images(existing) if not sweeper_image_allowed(ctl, i)]
    if not refused:
        return f"; Deployment {deployment_name} keeps running its last applied spec"
    # One message whether scaled now or before: one event, not one per reconcile.
    if asks_for_pods(existing):
        scale_to_zero(ctl.apps, namespace, deployment_name)
        log.warning("sweeper Deployment runs a refused image; scaled to 0", extra={
            "namespace": namespace, "policy": name, "deployment": deployment_name})
    return f"; Deployment {deployment_name} runs a refused image ({refused[0]!r}) and is scaled to 0 replicas"
