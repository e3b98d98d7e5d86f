"""The operator's own metrics (controller/metrics.py): each Controller counts on a
registry of its own, read here after reconciles, drift, status refreshes; the
flag and the server that serve them."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.metrics import OperatorMetrics
from stalledpolicy.controller.scheduler import Scheduler
from tests.unit.test_operator_parts import FakeApps, api_error, b64, fake_controller, policy_body, reconciled_policy

RECONCILES = "stalledpolicy_operator_reconciles_total"
FAILURES = "stalledpolicy_operator_status_refresh_failures_total"
REFRESHES = "stalledpolicy_operator_status_refreshes_total"
SECRET = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}


def reconciles(ctl) -> dict[str, float]:
    return {result: ctl.metrics.value(RECONCILES, result=result)
            for result in ("ok", "invalid_spec", "apply_failed", "conflict")}


def test_every_series_exists_at_zero_from_the_start():
    text = OperatorMetrics().exposition().decode()
    for line in ('stalledpolicy_operator_reconciles_total{result="ok"} 0.0',
                 'stalledpolicy_operator_reconciles_total{result="conflict"} 0.0',
                 'stalledpolicy_operator_status_refresh_failures_total{reason="RedisUnreachable"} 0.0',
                 'stalledpolicy_operator_replays_total{result="done"} 0.0',
                 "stalledpolicy_operator_drift_reverts_total 0.0",
                 "stalledpolicy_operator_status_loop_lag_seconds_count 0.0"):
        assert line in text, line


def test_refused_credentials_are_counted_apart_from_an_outage():
    """Redis answered but refused the Secret's password: its own reason, so an
    alert on RedisUnreachable does not page the owners of a Redis that is up."""
    import redis

    from stalledpolicy.controller.queue_figures import failure_reason
    from stalledpolicy.controller.status import Problem

    metrics = OperatorMetrics()
    for exc in (redis.AuthenticationError("invalid username-password pair"),
                redis.ConnectionError("Error 111 connecting to db:6379. Connection refused.")):
        metrics.count_refresh(Problem(failure_reason(exc), "cannot read queue q"))
    assert metrics.value(FAILURES, reason="RedisCredentialsRefused") == 1
    assert metrics.value(FAILURES, reason="RedisUnreachable") == 1
    assert metrics.value(FAILURES, reason="Other") == 0


def test_each_controller_counts_on_its_own_registry():
    _, one, _ = reconciled_policy()
    other = fake_controller(FakeApps())
    assert one.metrics.registry is not other.metrics.registry
    assert reconciles(one)["ok"] == 1 and reconciles(other)["ok"] == 0


def test_reconciles_are_counted_by_result():
    from stalledpolicy.controller.reconcile import InvalidPolicy, RetryLater, reconcile

    apps, ctl, body = reconciled_policy()
    assert reconciles(ctl) == {"ok": 1, "invalid_spec": 0, "apply_failed": 0, "conflict": 0}
    reconcile(ctl, body)  # nothing to change: still a reconcile, ok
    assert reconciles(ctl)["ok"] == 2

    invalid = policy_body({"queue": "orders"}, generation=2)  # no spec.redis
    with pytest.raises(InvalidPolicy):
        reconcile(ctl, invalid)
    assert reconciles(ctl)["invalid_spec"] == 1

    apps.refuse = api_error(422, "Unprocessable Entity", "spec.template: invalid")
    with pytest.raises(RetryLater):
        reconcile(ctl, policy_body(generation=3))
    assert reconciles(ctl)["apply_failed"] == 1

    apps.refuse = None
    apps.stored["metadata"]["ownerReferences"] = []  # someone else's Deployment of that name
    with pytest.raises(RetryLater):
        reconcile(ctl, policy_body(generation=4))
    assert reconciles(ctl) == {"ok": 2, "invalid_spec": 1, "apply_failed": 1, "conflict": 1}


def test_a_drift_revert_and_a_drift_conflict_are_counted():
    from stalledpolicy.controller import drift

    apps, ctl, body = reconciled_policy()
    now = [1000.0]
    ctl.clock = lambda: now[0]
    drift.revert_drift(ctl, ("ns", "p"), apps.scale_by_hand(0))
    ctl.sync(("ns", "p"))
    assert ctl.metrics.value("stalledpolicy_operator_drift_reverts_total") == 1
    assert reconciles(ctl)["ok"] == 2  # the revert is a reconcile too
    for _ in range(drift.DRIFT_MAX_REVERTS + 2):
        now[0] += 10
        drift.revert_drift(ctl, ("ns", "p"), apps.scale_by_hand(0))
        ctl.sync(("ns", "p"))
    assert ctl.metrics.value("stalledpolicy_operator_drift_reverts_total") == drift.DRIFT_MAX_REVERTS
    assert ctl.metrics.value("stalledpolicy_operator_drift_conflicts_total") == 1


def test_status_refreshes_are_counted_and_timed_and_failures_have_their_reason():
    secrets = dict(SECRET)
    apps, ctl, body = reconciled_policy(secrets)
    ctl.sync(("ns", "p"))
    assert ctl.metrics.value(REFRESHES) == 1
    assert ctl.metrics.value("stalledpolicy_operator_status_refresh_duration_seconds_count") == 1
    assert sum(ctl.metrics.value(FAILURES, reason=r) for r in ("RedisUnreachable", "SecretNotFound",
                                                                "StatusWriteFailed", "Other")) == 0

    secrets.pop(("ns", "creds"))
    ctl.sync(("ns", "p"))
    assert ctl.metrics.value(FAILURES, reason="SecretNotFound") == 1

    import redis

    secrets[("ns", "creds")] = SECRET[("ns", "creds")]

    def down(*_args, **_kwargs):
        raise redis.ConnectionError("Connection refused")

    ctl.snapshot_fn = down
    ctl.sync(("ns", "p"))
    assert ctl.metrics.value(FAILURES, reason="RedisUnreachable") == 1
    assert ctl.metrics.value(REFRESHES) == 3
    assert ctl.metrics.value("stalledpolicy_operator_status_refresh_duration_seconds_count") == 3


def test_a_status_write_that_fails_is_a_failed_refresh():
    from stalledpolicy.controller.objects import plain

    _, ctl, _ = reconciled_policy(dict(SECRET))

    class Refusing:
        def patch_namespaced_custom_object_status(self, *args, **kwargs):
            raise api_error(403, "Forbidden", "cannot patch stalledpolicies/status")

    ctl.custom = Refusing()
    ctl.sync(("ns", "p"))
    assert ctl.metrics.value(FAILURES, reason="StatusWriteFailed") == 1
    assert plain(ctl.policies[("ns", "p")].status) == {}  # nothing written


def test_a_refresh_of_a_policy_deleted_meanwhile_is_not_a_failure():
    _, ctl, _ = reconciled_policy(dict(SECRET))

    class Gone:
        def patch_namespaced_custom_object_status(self, *args, **kwargs):
            raise api_error(404, "Not Found", "gone")

    ctl.custom = Gone()
    assert ctl.sync(("ns", "p")) is None
    assert ctl.metrics.value(FAILURES, reason="StatusWriteFailed") == 0
    assert ctl.metrics.value(REFRESHES) == 0


def test_the_policies_gauge_follows_the_policies_known():
    _, ctl, body = reconciled_policy()
    assert ctl.metrics.value("stalledpolicy_operator_policies") == 1
    ctl.observe_policy(dict(body, metadata=dict(body["metadata"], name="q", uid="u-2")), "ADDED")
    assert ctl.metrics.value("stalledpolicy_operator_policies") == 2
    ctl.observe_policy(body, "DELETED")
    assert ctl.metrics.value("stalledpolicy_operator_policies") == 1


def test_the_scheduler_reports_how_late_each_run_starts():
    lags: list[float] = []
    done = threading.Event()
    gate = threading.Event()

    def work(key):
        if key == "slow":
            gate.wait(2)
        else:
            done.set()
        return None

    scheduler = Scheduler(work, workers=1, on_lag=lags.append)
    try:
        scheduler.kick("slow")
        time.sleep(0.05)
        scheduler.kick("waiting")  # due now, but the one worker is busy for 0.2 s
        time.sleep(0.2)
        gate.set()
        assert done.wait(2)
    finally:
        scheduler.stop()
    assert len(lags) == 2
    assert lags[0] < 0.05 and lags[1] >= 0.15


def test_the_controllers_status_loop_observes_its_lag():
    _, ctl, _ = reconciled_policy(dict(SECRET))
    ctl.start()
    try:
        ctl.kick(("ns", "p"))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and ctl.metrics.value(REFRESHES) < 1:
            time.sleep(0.01)
    finally:
        ctl.stop()
    assert ctl.metrics.value("stalledpolicy_operator_status_loop_lag_seconds_count") >= 1


# -- serving ------------------------------------------------------------------------------------

def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_metrics_server_serves_the_controllers_registry_and_stops():
    from stalledpolicy.controller.main import serve_metrics

    _, ctl, _ = reconciled_policy()
    server = serve_metrics(OperatorConfig(metrics_port=0, metrics_address="127.0.0.1"), ctl)
    try:
        status, text = get(f"http://127.0.0.1:{server.port}/metrics")
        assert status == 200
        assert 'stalledpolicy_operator_reconciles_total{result="ok"} 1.0' in text
        assert "stalledpolicy_operator_policies 1.0" in text
        assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 404  # kopf's liveness serves that
    finally:
        server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=2)


def test_a_metrics_port_in_use_stops_the_operator_at_start():
    import socket

    import kopf

    from stalledpolicy.controller.main import serve_metrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(kopf.PermanentError, match=f"--metrics-port {port} / --metrics-address 127.0.0.1: "
                                                      "cannot listen there"):
            serve_metrics(OperatorConfig(metrics_port=port, metrics_address="127.0.0.1"),
                          fake_controller(FakeApps()))


def test_startup_serves_metrics_only_when_a_port_is_set(monkeypatch):
    import kopf

    from stalledpolicy.controller import main, wiring

    served = []
    monkeypatch.setattr(wiring, "build_controller", lambda config: fake_controller(FakeApps()))
    monkeypatch.setattr(main, "serve_metrics", lambda config, ctl: served.append(config.metrics_port))
    for name, value in (("STALLEDPOLICY_OPERATOR_METRICS_PORT", "0"),
                        ("STALLEDPOLICY_OPERATOR_METRICS_PORT", "18081")):
        monkeypatch.setenv(name, value)
        monkeypatch.setattr(main, "_controller", None)
        main.startup(settings=kopf.OperatorSettings())
        main.cleanup()
    assert served == [18081]


def test_metrics_port_and_address_from_flags_and_env(monkeypatch, capsys):
    from stalledpolicy.cli import build_parser
    from stalledpolicy.controller.cli import config_from_args

    for name in ("STALLEDPOLICY_OPERATOR_METRICS_PORT", "STALLEDPOLICY_OPERATOR_METRICS_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    parser = build_parser()
    assert config_from_args(parser.parse_args(["operator", "-A"])).metrics_port == 0  # off by default
    config = config_from_args(parser.parse_args(["operator", "-A", "--metrics-port", "8081",
                                                 "--metrics-address", "::"]))
    assert (config.metrics_port, config.metrics_address) == (8081, "::")
    assert OperatorConfig.from_env(config.to_env()) == config
    monkeypatch.setenv("STALLEDPOLICY_OPERATOR_METRICS_PORT", "9100")
    assert config_from_args(parser.parse_args(["operator", "-A"])).metrics_port == 9100
    assert config_from_args(parser.parse_args(["operator", "-A", "--metrics-port", "0"])).metrics_port == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["operator", "-A", "--metrics-port", "70000"])
    assert "between 0 (off) and 65535" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="STALLEDPOLICY_OPERATOR_METRICS_PORT='http'"):
        OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_METRICS_PORT": "http"})


def test_a_metrics_port_in_use_is_one_line_and_exit_2_before_kopf_starts(capsys, monkeypatch):
    import socket

    from stalledpolicy.cli import main

    for name in ("STALLEDPOLICY_OPERATOR_METRICS_PORT", "STALLEDPOLICY_OPERATOR_METRICS_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["operator", "-A", "--metrics-port", str(port), "--metrics-address", "127.0.0.1"])
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"stalledpolicy operator: --metrics-port {port} / --metrics-address 127.0.0.1: "
                           "cannot listen there (")
