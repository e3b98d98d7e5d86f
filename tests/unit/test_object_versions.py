"""The operator's memory orders objects without comparing resourceVersions.

Kubernetes resourceVersions are opaque strings: only two versions of the same
object may be compared, for equality. These tests give versions that mean
nothing as numbers (or order the wrong way as numbers) and check that the
operator still keeps the newest policy and sweeper it has seen."""

from __future__ import annotations

import copy

from stalledpolicy.controller import status_cache
from stalledpolicy.controller.apply_requests import ApplyRequest
from tests.unit.test_operator_parts import FakeApps, api_error, fake_controller, policy_body


class Names:
    """CustomObjectsApi's GET by name: the uid the API server holds under a name now."""

    def __init__(self, holder=None):
        self.holder = holder  # a policy body, or None: 404
        self.gets = 0

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.gets += 1
        if self.holder is None:
            raise api_error(404, "Not Found", "not found")
        return copy.deepcopy(self.holder)

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        pass


def policy(uid, version, created="2026-12-03T10:00:00Z", generation=1):
    body = policy_body(generation=generation)
    body["metadata"].update(uid=uid, resourceVersion=version, creationTimestamp=created)
    return body


def test_a_late_event_of_a_deleted_policy_never_takes_its_successors_state():
    """The old policy's last versions are numerically above the new one's: an
    opaque string says nothing about the order of two objects."""
    ctl = fake_controller(FakeApps())
    new = policy("u-2", "10")
    ctl.custom = Names(holder=new)
    ctl.observe_policy(policy("u-1", "90"), "ADDED")  # the old policy, seen first
    ctl.observe_policy(new, "ADDED")
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2", "the successor got no state"
    ctl.observe_policy(policy("u-1", "95"), "MODIFIED")  # the old one's stream, handled late
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    gets = ctl.custom.gets
    ctl.observe_policy(policy("u-1", "99"), "MODIFIED")
    assert ctl.custom.gets == gets, "a deleted uid is known once asked: no API call for each late event"


def test_a_predecessor_never_seen_before_its_successor_is_recognised():
    """The successor's events are handled first (kopf's streams per uid), then the
    predecessor's: the API server says which uid holds the name."""
    ctl = fake_controller(FakeApps())
    new = policy("u-2", "a1b2")
    ctl.custom = Names(holder=new)
    ctl.observe_policy(new, "ADDED")
    ctl.observe_policy(policy("u-1", "zz99"), "MODIFIED")
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    ctl.observe_policy(policy("u-1", "zz99"), "DELETED")
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"


def test_without_an_api_answer_the_policy_created_later_holds_the_name():
    ctl = fake_controller(FakeApps())  # its CustomObjectsApi cannot read policies
    ctl.observe_policy(policy("u-2", "1", created="2026-12-03T10:00:05Z"), "ADDED")
    ctl.observe_policy(policy("u-1", "7", created="2026-12-03T10:00:01Z"), "MODIFIED")
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    ctl.observe_policy(policy("u-3", "0", created="2026-12-03T10:00:09Z"), "ADDED")
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-3"


def test_a_body_older_than_the_one_known_does_not_replace_it():
    """kopf's handler body is a version the watch showed before: once the watch has
    moved on, it is older, whatever its version says as a number."""
    from stalledpolicy.controller.status import ReconcileOutcome

    ctl = fake_controller(FakeApps())
    first = policy("u-1", "b")
    ctl.observe_policy(first, "ADDED")
    annotated = copy.deepcopy(first)
    annotated["metadata"].update(resourceVersion="a", annotations={"queues.emq.dev/replay": "t1"})
    ctl.observe_policy(annotated, "MODIFIED")
    ctl.record_outcome(first, ReconcileOutcome(1, True, "Applied", "applied"))
    assert ctl.policies[("ns", "p")].body["metadata"]["annotations"] == {"queues.emq.dev/replay": "t1"}


def sweeper(uid, version, generation=1, created="2026-12-03T10:00:00Z", available=1):
    return {"metadata": {"name": "p-sweeper", "namespace": "ns", "uid": uid, "resourceVersion": version,
                         "generation": generation, "creationTimestamp": created,
                         "ownerReferences": [{"apiVersion": "queues.emq.dev/v1alpha1", "kind": "StalledPolicy",
                                              "name": "p", "uid": "u-1", "controller": True}]},
            "spec": {"replicas": 1},
            "status": {"observedGeneration": generation, "availableReplicas": available}}


def test_the_sweeper_remembered_is_the_newest_without_comparing_versions():
    ctl = fake_controller(FakeApps())
    known = ctl.deployments
    # Our apply made generation 2; a watch event from before it (generation 1,
    # a version that is larger as a number) arrives after it.
    ctl.observe_deployment(sweeper("d-1", "5", generation=1), "ADDED")
    ctl.observe_deployment(sweeper("d-1", "7", generation=2, available=0), read=True)
    ctl.observe_deployment(sweeper("d-1", "60", generation=1), "MODIFIED")
    assert known[("ns", "p-sweeper")]["metadata"]["generation"] == 2
    # The watch goes on from there, in order, whatever the versions look like.
    ctl.observe_deployment(sweeper("d-1", "8", generation=2, available=1), "MODIFIED")
    assert known[("ns", "p-sweeper")]["status"]["availableReplicas"] == 1
    # A read of the same generation is no newer than the watch: it keeps what the watch showed.
    ctl.observe_deployment(sweeper("d-1", "9", generation=2, available=0), read=True)
    assert known[("ns", "p-sweeper")]["status"]["availableReplicas"] == 1


def test_a_deleted_sweepers_late_events_do_not_hide_the_new_one():
    ctl = fake_controller(FakeApps())
    known = ctl.deployments
    ctl.observe_deployment(sweeper("d-2", "10", created="2026-12-03T10:00:05Z"), "ADDED")
    # The old Deployment (created earlier), its versions larger as numbers, handled late.
    ctl.observe_deployment(sweeper("d-1", "99", created="2026-12-03T10:00:01Z"), "MODIFIED")
    assert known[("ns", "p-sweeper")]["metadata"]["uid"] == "d-2"
    ctl.observe_deployment(sweeper("d-1", "99", created="2026-12-03T10:00:01Z"), "DELETED")
    assert known[("ns", "p-sweeper")]["metadata"]["uid"] == "d-2", "the old one's deletion took the new one"
    ctl.observe_deployment(sweeper("d-1", "100", created="2026-12-03T10:00:01Z"), "MODIFIED")
    assert known[("ns", "p-sweeper")]["metadata"]["uid"] == "d-2"


def test_a_version_turned_away_while_our_status_write_is_awaited_stays_older():
    """Our status write returned W; the watch then shows V1 (kopf's annotation
    patch, sent before the write), then W. kopf's handler for V1 runs after
    that: V1 is older than W, though it was never the body we knew."""
    from stalledpolicy.controller.status import ReconcileOutcome

    ctl = fake_controller(FakeApps())
    ctl.observe_policy(policy("u-1", "v0"), "ADDED")
    state = ctl.policies[("ns", "p")]
    written = policy("u-1", "w")
    written["status"] = {"deadLetters": 1}
    annotated = policy("u-1", "v1")  # no status yet: the write came after it
    annotated["metadata"]["annotations"] = {"kopf.zalando.org/last-handled-configuration": "{}"}
    with state.lock:  # as the status refresh's write leaves it
        status_cache.written(state, dict(written["status"]), copy.deepcopy(written), "u-1")
    ctl.observe_policy(annotated, "MODIFIED")
    assert state.body["metadata"]["resourceVersion"] == "w"
    ctl.observe_policy(written, "MODIFIED")  # the watch catches up with our write
    assert state.status_cache.awaited_version is None
    ctl.record_outcome(annotated, ReconcileOutcome(1, True, "Applied", "applied"))  # kopf's handler body
    assert state.body["metadata"]["resourceVersion"] == "w", "an older body replaced the one known"
    assert state.status_cache.stored == {"deadLetters": 1}


def test_a_policy_created_again_while_its_predecessor_is_forgotten_keeps_its_refresh():
    """forget() of the deleted policy and the first apply request of its successor
    (same name, another thread): the successor's first sync is not cancelled
    by the predecessor's removal from the scheduler."""
    from tests.unit.contention import WatchedLock, run_until_done_or_blocked

    ctl = fake_controller(FakeApps())
    old, new = policy("u-1", "1"), policy("u-2", "5", created="2026-12-03T10:00:09Z")
    ctl.custom = Names(holder=new)
    ctl.observe_policy(old, "ADDED")
    registry = WatchedLock(ctl._lock)
    ctl._lock = registry
    successor: list = []

    class Scheduler:
        def __init__(self):
            self.due: set = set()

        def kick(self, key):
            self.due.add(key)

        def remove(self, key):
            # the successor's create handler, on its own thread, gets this far first
            successor.append(run_until_done_or_blocked(
                lambda: ctl.request_policy_apply(new, ApplyRequest("the policy was created")), registry))
            self.due.discard(key)

    ctl.scheduler = Scheduler()
    ctl.forget(("ns", "p"), "u-1")
    successor[0].join(10)
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    assert ("ns", "p") in ctl.scheduler.due, "the successor's first sync was cancelled"
