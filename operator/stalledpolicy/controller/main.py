"""The kopf entry module: handler registration and operator settings only.

Run by ``stalledpolicy operator`` (or ``kopf run -m stalledpolicy.controller.main``).
No handler here adds a finalizer (no deletion handler, no kopf timer or daemon:
the status loop is our own scheduler), so a policy is deleted at once even when
the operator is down, and the sweeper goes with it through its owner reference.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import kopf

from stalledpolicy.controller import GROUP, MANAGED_BY_LABEL, MANAGED_BY_VALUE, PLURAL, VERSION
from stalledpolicy.controller.apply_requests import ApplyRequest
from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.drift import drifted_policy, revert_drift
from stalledpolicy.controller.kopf_storage import UidDiffBaseStorage, UidProgressStorage
from stalledpolicy.controller.leader import leadership
from stalledpolicy.controller.liveness import LivenessServer
from stalledpolicy.controller.objects import generation_of, plain
from stalledpolicy.controller.sweeper_events import adopt_sweeper, disowned_policy, reapply_after_deletion
from stalledpolicy.sweeper.metrics import StatusServer

if TYPE_CHECKING:  # for the annotations only: wiring, imported at startup, builds it
    from stalledpolicy.controller.runtime import Controller

log = logging.getLogger("stalledpolicy.operator")
STORAGE_PREFIX = f"operator.{GROUP}"
SWEEPER_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
_controller = None
_metrics_server = None
_liveness_server = None
_started = False
_diffbase_storage = None
_leadership = None
_startup_problem = "the operator is starting: the controller is not built and started yet"


class ListenFailed(kopf.PermanentError):
    """An endpoint could not listen at startup (its port taken after the CLI's check):
    ``stalledpolicy operator`` says the message on one line and exits 2."""


def not_ready() -> str | None:
    """Why /healthz answers 503, or None once startup built and started the controller
    (or while this replica waits for the leader lease: waiting is healthy)."""
    if _leadership is not None and _leadership.waiting:
        return None
    return None if _started else _startup_problem


def controller() -> Controller:
    if _controller is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return _controller


@kopf.on.startup()
async def serve_liveness(**_: Any) -> None:
    """``--liveness``, served in kopf's loop by our own server, not kopf's
    (docs/architecture.md, "``::`` is IPv6 only")."""
    global _liveness_server
    url = OperatorConfig.from_env().liveness
    if url is None:
        return

    try:
        _liveness_server = await LivenessServer(url, not_ready).start()
    except ValueError as exc:
        raise ListenFailed(f"--liveness {exc}") from None
    except OSError as exc:
        raise ListenFailed(f"--liveness {url}: cannot listen there ({exc.strerror or exc}); "
                           "choose another address or port") from None


@kopf.on.cleanup()
async def stop_liveness(**_: Any) -> None:
    global _liveness_server
    if _liveness_server is not None:
        await _liveness_server.stop()
        _liveness_server = None


@kopf.on.startup()
async def lead(**_: Any) -> None:
    """With --leader-election-lease: wait for the Lease before anything acts (kopf
    watches nothing until every startup handler is done)."""
    global _leadership
    config = OperatorConfig.from_env()
    if config.leader_lease is None:
        return

    _leadership = leadership(config)
    await _leadership.acquire()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _controller, _metrics_server, _diffbase_storage
    # kopf's annotations, each bound to the uid it was written for: a policy created
    # again from an export (its annotations copied) is handled as new (kopf_storage.py).
    settings.persistence.progress_storage = UidProgressStorage(prefix=STORAGE_PREFIX)
    settings.persistence.diffbase_storage = _diffbase_storage = UidDiffBaseStorage(
        prefix=STORAGE_PREFIX, key="last-handled-configuration")
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING
    config = OperatorConfig.from_env()
    if config.leader_lease and (_leadership is None or not _leadership.held):
        # kopf runs the next startup handler even when `lead` failed: never act without the Lease
        raise kopf.PermanentError("the leader lease is not held; nothing may act")
    settings.execution.max_workers = config.handler_workers
    # Only our sweepers, filtered by the API server: without it kopf lists and
    # watches every Deployment of the cluster and drops the others itself.
    settings.watching.label_selectors["apps", "v1", "deployments"] = SWEEPER_SELECTOR
    # Clean shutdown on SIGTERM: give running handlers a moment, then stop.
    settings.process.ultimate_exiting_timeout = 10
    from stalledpolicy.controller.wiring import build_controller  # looked up at startup (tests replace it)

    global _started, _startup_problem
    try:
        controller = build_controller(config)
        if config.metrics_port:
            _metrics_server = serve_metrics(config, controller)
        _controller = controller
        _controller.start()
    except BaseException as exc:  # /healthz says so until a retry succeeds
        _startup_problem = f"the operator's startup failed ({type(exc).__name__}); it is retried"
        raise
    _started = True


def serve_metrics(config: OperatorConfig, controller: Controller) -> StatusServer:
    """The Controller's metrics at /metrics (the sweeper's small HTTP server, on a
    daemon thread). A port it cannot listen on stops the operator at start."""
    try:
        server = StatusServer(config.metrics_address, config.metrics_port, controller.metrics)
    except OSError as exc:
        raise ListenFailed(
            f"--metrics-port {config.metrics_port} / --metrics-address {config.metrics_address}: cannot "
            f"listen there ({exc.strerror or exc}); choose another port, or 0 for no metrics") from None
    log.info("serving metrics", extra={"address": config.metrics_address, "port": server.port,
                                       "path": "/metrics"})
    return server.start()


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    global _metrics_server, _started, _startup_problem
    _started, _startup_problem = False, "the operator is stopping"
    if _controller is not None:
        _controller.stop()
    if _metrics_server is not None:
        _metrics_server.stop()
        _metrics_server = None
    if _leadership is not None:
        _leadership.stop()  # released last: nothing of ours acts any more


POLICY_EVENT = "policy-event"  # the ApplyRequest kind of kopf's change handlers
# How long a change handler waits for the sync that takes its request (back-pressure;
# docs/architecture.md, "kopf's handlers wait for their sync").
HANDLER_WAIT = 60.0


def _request_apply(body: kopf.Body, why: str, *, resume: bool = False) -> None:
    """Enqueue the policy for its sync, which applies it, and wait until the sync has
    taken the request (docs/architecture.md, the trigger table). The apply's failures
    are the policy's condition and sync's retries, never kopf's."""
    plain_body = plain(body)
    request = ApplyRequest(why, kind=POLICY_EVENT, body=plain_body, generation=generation_of(plain_body),
                           resume=resume, quiet=True)
    controller().request_policy_apply(plain_body, request)
    request.taken.wait(HANDLER_WAIT)


@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-create")
def on_create(body: kopf.Body, **_: Any) -> None:
    _request_apply(body, "the policy was created")


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile-resume")
def on_resume(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    # A diff base the previous version wrote (no uid) gets this policy's uid, once.
    if _diffbase_storage is not None:
        _diffbase_storage.bind_uid(body=body, patch=patch)
    # At a start: no apply while the policy's status records a DriftConflict.
    _request_apply(body, "the operator started", resume=True)


@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile-update")
def on_update(body: kopf.Body, **_: Any) -> None:
    # not kopf's ``old``: BudgetChanged compares what was applied (docs/architecture.md)
    _request_apply(body, "the policy was changed")


# Watch-event handlers are async so they never queue behind the reconciles in
# kopf's handler threads: at a cold start of 1,000 policies such a queue held
# every event in memory and outran kopf's consistency timeout, so about half the
# policies were reconciled twice. Work that may wait on a lock or the API goes
# to a thread of its own.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_policy_event(body: kopf.Body, type: str | None, **_: Any) -> None:  # noqa: A002 - kopf's argument name
    if _controller is not None:
        await asyncio.to_thread(_controller.observe_policy, body, type)


@kopf.on.event("apps", "v1", "deployments", labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE})
async def on_sweeper_event(body: kopf.Body, type: str | None, **_: Any) -> None:  # noqa: A002
    if _controller is None:
        return
    _controller.observe_deployment(body, type)  # short: one in-memory lock
    if type == "DELETED":
        await asyncio.to_thread(reapply_after_deletion, _controller, body)
        return
    key = drifted_policy(_controller, body)  # memory only: cheap on every event
    if key is not None:
        await asyncio.to_thread(revert_drift, _controller, key, body)
    elif disowned_policy(_controller, body) is not None:  # memory only too
        await asyncio.to_thread(adopt_sweeper, _controller, body)
