"""sync(key): the one path that applies a policy's sweeper, the requests it takes,
and the one retry policy (docs/architecture.md)."""

from __future__ import annotations

import copy

from stalledpolicy.controller.apply_requests import ApplyRequest
from tests.unit.test_operator_parts import api_error, b64, fake_controller, policy_body, retry_due

KEY = ("ns", "p")
SECRETS = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}


class CountingApps:
    """FakeApps that counts the applies (server-side apply patches)."""

    def __new__(cls):
        from tests.unit.test_operator_parts import FakeApps

        apps = FakeApps()
        apps.applies = 0
        patch = apps.patch_namespaced_deployment

        def counted(*args, **kwargs):
            apps.applies += 1
            return patch(*args, **kwargs)

        apps.patch_namespaced_deployment = counted
        return apps


def test_a_trigger_only_enqueues_the_sync_applies_and_then_lets_the_handler_go():
    apps = CountingApps()
    ctl = fake_controller(apps, dict(SECRETS))
    body = policy_body()
    request = ApplyRequest("created", kind="policy-event", body=body, generation=1)
    ctl.request_policy_apply(body, request)
    assert apps.applies == 0 and not request.taken.is_set(), "a trigger applies nothing itself"
    ctl.sync(KEY)
    assert apps.applies == 1 and request.taken.is_set()
    assert ctl.policies[KEY].outcome.ok


def test_requests_pending_together_are_one_apply():
    apps = CountingApps()
    ctl = fake_controller(apps, dict(SECRETS))
    body = policy_body()
    requests = [ApplyRequest("created", kind="policy-event", body=body, generation=1),
                ApplyRequest("created again", kind="policy-event", body=body, generation=1),
                ApplyRequest("the sweeper Deployment was deleted", kind="sweeper-deleted")]
    for request in requests:
        ctl.request_policy_apply(body, request)
    assert requests[0].taken.is_set(), "replaced by the newer request of its kind"
    ctl.sync(KEY)
    assert apps.applies == 1 and all(r.taken.is_set() for r in requests)


def test_a_failed_apply_waits_its_backoff_but_a_new_event_is_applied_at_once():
    apps = CountingApps()
    ctl = fake_controller(apps, dict(SECRETS))
    body = policy_body()
    apps.refuse = api_error(500, "Internal Server Error", "etcd is down")
    ctl.request_policy_apply(body, ApplyRequest("created", kind="policy-event", body=body, generation=1))
    ctl.sync(KEY)
    assert apps.applies == 1 and ctl.retries.wait(KEY) == 5
    ctl.sync(KEY)
    assert apps.applies == 1, "the retry is not due yet"
    edited = copy.deepcopy(body)
    edited["metadata"].update(generation=2, resourceVersion="2")
    edited["spec"]["maxStalled"] = 4
    ctl.request_policy_apply(edited, ApplyRequest("changed", kind="policy-event", body=edited, generation=2))
    ctl.sync(KEY)
    assert apps.applies == 2, "an edit is applied at once, whatever the backoff"
    assert ctl.retries.wait(KEY) == 10, "failed again: the delay doubles"
    apps.refuse = None
    retry_due(ctl)
    ctl.sync(KEY)
    outcome = ctl.policies[KEY].outcome
    assert apps.applies == 3 and outcome.ok and outcome.generation == 2
    assert ctl.retries.failures(KEY) == 0, "reset by the success"


def test_a_forgotten_policy_lets_its_waiting_handler_go_and_is_not_applied():
    apps = CountingApps()
    ctl = fake_controller(apps, dict(SECRETS))
    body = policy_body()
    request = ApplyRequest("created", kind="policy-event", body=body, generation=1)
    ctl.request_policy_apply(body, request)
    ctl.forget(KEY, "u-1")
    assert request.taken.is_set()
    assert ctl.sync(KEY) is None and apps.applies == 0


def test_a_stopped_operator_lets_every_waiting_handler_go():
    apps = CountingApps()
    ctl = fake_controller(apps, dict(SECRETS))
    body = policy_body()
    pending = ApplyRequest("created", kind="policy-event", body=body, generation=1)
    ctl.request_policy_apply(body, pending)
    ctl.stop()
    late = ApplyRequest("changed", kind="policy-event", body=body, generation=1)
    ctl.request_policy_apply(body, late)
    assert pending.taken.is_set() and late.taken.is_set() and apps.applies == 0


def test_the_watch_event_of_an_edit_enqueues_the_policy_whose_sync_applies_it():
    """No kopf handler needed: the policy's watch event enqueues its key (the status
    interval is an hour here: only the event can bring the sync within the test)."""
    import time

    from stalledpolicy.controller.config import OperatorConfig

    apps = CountingApps()
    ctl = fake_controller(apps, dict(SECRETS), OperatorConfig(sweeper_image="img:1", max_backoff=60,
                                                              status_interval=3600))
    body = policy_body()
    ctl.request_policy_apply(body, ApplyRequest("created", kind="policy-event", body=body, generation=1))
    ctl.sync(KEY)
    ctl.start()
    try:
        edited = copy.deepcopy(body)
        edited["metadata"].update(generation=2, resourceVersion="2")
        edited["spec"]["maxStalled"] = 4
        ctl.observe_policy(edited, "MODIFIED")
        deadline = time.monotonic() + 30
        while ctl.policies[KEY].outcome.generation != 2:
            assert time.monotonic() < deadline, "the edit was never applied"
            time.sleep(0.05)
    finally:
        ctl.stop()
    assert apps.applies == 2
