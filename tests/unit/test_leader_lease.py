"""Leader election's rule and its Lease writes, without a cluster (the kube test
tests/kube/test_leader_election.py runs replicas on the real control plane)."""

from __future__ import annotations

import datetime as dt
import types

import pytest
from kubernetes.client.exceptions import ApiException

from stalledpolicy.controller.config import parse_lease
from stalledpolicy.controller.leader import Leadership, LeaseElector, decide

T0 = dt.datetime(2026, 12, 4, 12, 0, 0, tzinfo=dt.UTC)


def spec(holder, renewed=T0, seconds=15):
    return {"holderIdentity": holder, "renewTime": renewed, "acquireTime": renewed, "leaseDurationSeconds": seconds}


@pytest.mark.parametrize("lease, unchanged_for, action", [
    (None, 0.0, "create"),
    (spec("me"), 0.0, "renew"),
    (spec("me"), 3600.0, "renew"),  # ours, however late: renewed
    (spec("other"), 14.0, "wait"),
    (spec("other"), 15.0, "wait"),
    (spec("other"), 15.001, "take"),  # seen unchanged for the Lease's whole duration
    (spec("other", seconds=60), 30.0, "wait"),  # the Lease's own duration counts
    (spec(None), 0.0, "take"),  # released
    (spec(""), 0.0, "take"),
    # renewTime is the holder's clock, never compared with ours: a renewTime an hour old
    # (that node's clock an hour behind) is no lapse until seen unchanged for 15 s here
    (spec("other", renewed=T0 - dt.timedelta(hours=1)), 1.0, "wait"),
])
def test_decide(lease, unchanged_for, action):
    assert decide(lease, "me", unchanged_for, 15.0) == action


class FakeLeases:
    """CoordinationV1Api over one stored Lease, with resourceVersion checks."""

    def __init__(self):
        self.stored = None
        self.rv = 0

    def _obj(self):
        s = self.stored
        spec = types.SimpleNamespace(holder_identity=s["spec"].get("holderIdentity"),
                                     acquire_time=s["spec"].get("acquireTime"))
        obj = types.SimpleNamespace(metadata=types.SimpleNamespace(resource_version=str(self.rv)), spec=spec)
        obj.to_dict = lambda: {"spec": {"holder_identity": s["spec"].get("holderIdentity"),
                                        "renew_time": s["spec"].get("renewTime"),
                                        "acquire_time": s["spec"].get("acquireTime"),
                                        "lease_duration_seconds": s["spec"].get("leaseDurationSeconds"),
                                        "lease_transitions": s["spec"].get("leaseTransitions")}}
        return obj

    def read_namespaced_lease(self, name, namespace):
        if self.stored is None:
            raise ApiException(status=404)
        return self._obj()

    def create_namespaced_lease(self, namespace, body):
        if self.stored is not None:
            raise ApiException(status=409)
        self.stored, self.rv = body, self.rv + 1

    def replace_namespaced_lease(self, name, namespace, body):
        if isinstance(body, types.SimpleNamespace):  # release: the object read, holder cleared
            self.stored["spec"]["holderIdentity"] = body.spec.holder_identity
            self.rv += 1
            return
        if body["metadata"]["resourceVersion"] != str(self.rv):
            raise ApiException(status=409)
        self.stored, self.rv = body, self.rv + 1


def test_one_candidate_holds_the_lease_the_other_takes_it_once_it_lapses_or_is_released():
    api, now, ticks = FakeLeases(), [T0], [0.0]

    def later(seconds):
        now[0] += dt.timedelta(seconds=seconds)
        ticks[0] += seconds

    a = LeaseElector(api, "ns", "op", "a", 15.0, now=lambda: now[0], clock=lambda: ticks[0])
    b = LeaseElector(api, "ns", "op", "b", 15.0, now=lambda: now[0], clock=lambda: ticks[0])
    assert a.try_hold() and not b.try_hold() and b.holder == "a"
    later(10)
    assert a.try_hold()  # renewed
    assert not b.try_hold()  # b sees the renewal: its wait starts again
    later(14)
    assert not b.try_hold()  # unchanged for 14 s: still a's
    later(2)
    assert b.try_hold() and api.stored["spec"]["leaseTransitions"] == 1  # a stopped renewing
    assert not a.try_hold() and a.holder == "b"
    b.release()
    assert api.stored["spec"]["holderIdentity"] is None
    assert a.try_hold() and api.stored["spec"]["leaseTransitions"] == 2  # at once, not 15 s later


def test_a_candidate_whose_clock_is_ahead_never_takes_a_renewed_lease():
    """The holder's renewTime an hour behind this replica's clock (skewed nodes):
    the Lease is renewed, so it is never taken; once renewals stop, a duration later it is."""
    api, ticks = FakeLeases(), [0.0]
    a = LeaseElector(api, "ns", "op", "a", 15.0, now=lambda: T0 + dt.timedelta(seconds=ticks[0]),
                     clock=lambda: ticks[0])
    b = LeaseElector(api, "ns", "op", "b", 15.0, now=lambda: T0 + dt.timedelta(hours=1, seconds=ticks[0]),
                     clock=lambda: ticks[0])
    assert a.try_hold()
    for _ in range(10):
        ticks[0] += 5
        assert a.try_hold() and not b.try_hold()
    ticks[0] += 15.5
    assert b.try_hold()


def test_two_candidates_writing_at_once_never_both_win():
    api = FakeLeases()
    a = LeaseElector(api, "ns", "op", "a", 15.0, now=lambda: T0)
    b = LeaseElector(api, "ns", "op", "b", 15.0, now=lambda: T0)
    a.try_hold()
    api.stored["spec"]["holderIdentity"] = None  # released: both try to take it
    read = api.read_namespaced_lease
    seen = read("op", "ns")
    api.read_namespaced_lease = lambda name, ns: seen  # both read the same version
    assert [a.try_hold(), b.try_hold()].count(True) == 1


def test_a_leader_not_renewed_in_time_stops_even_while_its_call_hangs():
    """The watchdog judges the time since the last renewal began, whatever the calls
    do: a renewal hanging on a frozen API server no longer held the leader acting for
    4 retries of each call (reviewer: 25 s with a 15 s Lease, 21 s after another took it)."""
    api, ticks = FakeLeases(), [0.0]
    elector = LeaseElector(api, "ns", "op", "a", 3.0, now=lambda: T0, clock=lambda: ticks[0])
    assert elector.try_hold()
    lost = []
    leadership = Leadership(elector, on_lost=lambda: lost.append(True), clock=lambda: ticks[0])
    leadership._renewed_at = 0.0
    waits = iter([False, False, False, True])

    def tick(timeout):
        ticks[0] += 1.0  # 1 s, 2 s (at the deadline: 2/3 of 3 s), 3 s
        return next(waits)

    leadership._stop.wait = tick
    leadership._watch()
    assert lost == [True] and leadership.lost and ticks[0] == 3.0
    leadership.stop()
    assert api.stored["spec"]["holderIdentity"] == "a"  # a lost lease is not released: it may be another's


def test_a_leader_whose_lease_was_taken_stops_at_its_next_renewal():
    api = FakeLeases()
    a = LeaseElector(api, "ns", "op", "a", 15.0, now=lambda: T0)
    assert a.try_hold()
    api.stored["spec"]["holderIdentity"] = "b"
    api.rv += 1
    lost = []
    leadership = Leadership(a, on_lost=lambda: lost.append(True))
    leadership._stop.wait = lambda timeout: False
    leadership._renew()
    assert lost == [True]


def test_a_shutdown_during_a_renewal_is_no_loss():
    lost = []
    leadership = Leadership(LeaseElector(FakeLeases(), "ns", "op", "a", 3.0), on_lost=lambda: lost.append(True))
    leadership._stop.set()  # SIGTERM: stop() began
    leadership._lose("not renewed")
    assert lost == [] and not leadership.lost


def test_a_lease_the_api_refuses_while_waiting_ends_the_replica_with_the_api_s_words(caplog):
    """No grant (or no such namespace): every replica waited, healthy, for ever, with one
    warning (reviewer's reproduction); now the process ends (exit 2) and says what to grant."""
    api = FakeLeases()
    refusal = ApiException(status=403, reason="Forbidden")
    refusal.body = ('{"message": "leases.coordination.k8s.io \\"op\\" is forbidden: User \\"system:serviceaccount:'
                    'sys:op\\" cannot get resource \\"leases\\""}')
    api.read_namespaced_lease = lambda name, ns: (_ for _ in ()).throw(refusal)
    ended = []
    leadership = Leadership(LeaseElector(api, "ns", "op", "a", 15.0), on_misconfigured=lambda: ended.append(2))
    with caplog.at_level("ERROR", logger="stalledpolicy.operator"):
        assert not leadership._round(waiting=True)
    assert ended == [2]
    [error] = caplog.records
    message = error.getMessage()
    assert 'cannot get resource "leases"' in message and "leases create, get and update" in message


@pytest.mark.parametrize("text", ["ns/op", "stalledpolicy-system/stalledpolicy-operator", "a/b.c"])
def test_lease_names(text):
    assert parse_lease(text) == tuple(text.split("/"))


@pytest.mark.parametrize("text", ["op", "/op", "ns/", "NS/op", "ns/op/x", "ns/Op", "a" * 64 + "/op"])
def test_bad_lease_names_say_the_form(text):
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_lease(text)


def test_the_operator_refuses_a_bad_lease_name_at_start(capsys):
    from stalledpolicy.cli import main

    with pytest.raises(SystemExit) as exited:  # argparse's refusal
        main(["operator", "--all-namespaces", "--leader-election-lease", "operator"])
    assert exited.value.code == 2 and "NAMESPACE/NAME" in capsys.readouterr().err


def test_the_operator_refuses_a_lease_duration_below_3s(capsys):
    from stalledpolicy.cli import main

    assert main(["operator", "--all-namespaces", "--leader-election-lease", "ns/op",
                 "--leader-election-duration", "2s"]) == 2
    assert "--leader-election-duration must be at least 3s" in capsys.readouterr().err


def test_the_lease_settings_travel_to_the_kopf_module_through_the_environment():
    from stalledpolicy.controller.config import OperatorConfig

    config = OperatorConfig(leader_lease="ns/op", lease_seconds=6.0)
    assert OperatorConfig.from_env(config.to_env()) == config
    assert OperatorConfig.from_env({}).leader_lease is None


def test_a_failed_renewal_is_logged_once_while_it_lasts(caplog):
    """A holder's renewals failing every 2 s (the API server down): one warning, until it changes."""
    api = FakeLeases()
    api.read_namespaced_lease = lambda name, ns: (_ for _ in ()).throw(ApiException(status=503, reason="Unavailable"))
    leadership = Leadership(LeaseElector(api, "ns", "op", "a", 15.0, now=lambda: T0), on_lost=lambda: None)
    with caplog.at_level("WARNING", logger="stalledpolicy.operator"):
        assert not any(leadership._round() for _ in range(5))
    [warning] = caplog.records
    assert "503" in warning.getMessage()
