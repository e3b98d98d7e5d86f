"""Where the operator's liveness and metrics endpoints listen: by default, as the
sweeper's, every address (IPv4 and IPv6); an explicit address as given. Real
listeners, probed over IPv4 and IPv6."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.sweeper.config import SweeperConfig
from tests.unit.test_listen import has_ipv6_loopback, ipv4_only
from tests.unit.test_operator_parts import FakeApps, fake_controller

needs_dual_stack = pytest.mark.skipif(not (has_ipv6_loopback() and socket.has_dualstack_ipv6()),
                                      reason="no IPv6 loopback, or no IPv4 on an IPv6 socket, here")

ENV = ("STALLEDPOLICY_OPERATOR_METRICS_PORT", "STALLEDPOLICY_OPERATOR_METRICS_ADDRESS",
       "STALLEDPOLICY_OPERATOR_LIVENESS")


@pytest.fixture(autouse=True)
def no_operator_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def get(url: str) -> tuple[int, str] | None:
    """(status, body), or None when nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def test_the_operator_listens_where_the_sweeper_does_by_default():
    assert OperatorConfig().metrics_address == SweeperConfig(queue="q").metrics_address == "::"


@needs_dual_stack
def test_the_metrics_server_answers_ipv4_and_ipv6_probes_by_default():
    from stalledpolicy.controller.main import serve_metrics

    server = serve_metrics(OperatorConfig(metrics_port=0), fake_controller(FakeApps()))
    try:
        for host in ("127.0.0.1", "[::1]"):
            assert get(f"http://{host}:{server.port}/metrics")[0] == 200, host
    finally:
        server.stop()


def serving(url: str, probes, monkeypatch=None):
    """Start the liveness server for ``url`` in an event loop, as kopf's startup does,
    and return what ``probes(port)`` returns, run while it serves."""
    from stalledpolicy.controller.liveness import LivenessServer

    async def run():
        server = await LivenessServer(url).start()
        try:
            return await asyncio.to_thread(probes, server.port)
        finally:
            await server.stop()

    return asyncio.run(run())


@needs_dual_stack
def test_liveness_on_every_address_answers_ipv4_and_ipv6_probes():
    """kopf's own server made http://[::]:PORT IPv6 only: an IPv4 pod's probe failed."""
    answers = serving("http://[::]:0/healthz",
                      lambda port: [get(f"http://{host}:{port}/healthz") for host in ("127.0.0.1", "[::1]")])
    assert answers == [(200, "{}"), (200, "{}")]


def test_liveness_on_every_address_falls_back_to_ipv4_without_ipv6(monkeypatch):
    ipv4_only(monkeypatch)
    answer = serving("http://[::]:0/healthz", lambda port: get(f"http://127.0.0.1:{port}/healthz"))
    assert answer == (200, "{}")


def test_liveness_on_an_explicit_address_listens_there_only():
    def probes(port):
        ipv6 = get(f"http://[::1]:{port}/healthz") if has_ipv6_loopback() else None
        return get(f"http://127.0.0.1:{port}/healthz"), get(f"http://127.0.0.1:{port}/other"), ipv6

    healthz, other, ipv6 = serving("http://127.0.0.1:0/healthz", probes)
    assert healthz == (200, "{}") and other[0] == 404 and ipv6 is None
    if has_ipv6_loopback():
        healthz, _, ipv6 = serving("http://[::1]:0/healthz", probes)
        assert healthz is None and ipv6 == (200, "{}")


def test_the_liveness_url_reaches_the_startup_handler_through_the_env(monkeypatch):
    """stalledpolicy operator --liveness URL: the URL travels in the config's env (as every
    setting does, for `kopf run -m`), and kopf is not asked to serve it itself."""
    import kopf

    from stalledpolicy.cli import build_parser
    from stalledpolicy.cli import main as cli_main
    from stalledpolicy.controller import cli, main
    from stalledpolicy.controller.cli import config_from_args

    args = build_parser().parse_args(["operator", "-A", "--liveness", "http://[::]:8080/healthz"])
    config = config_from_args(args)
    assert config.liveness == "http://[::]:8080/healthz"
    assert OperatorConfig.from_env(config.to_env()) == config
    assert OperatorConfig().liveness is None and "STALLEDPOLICY_OPERATOR_LIVENESS" not in OperatorConfig().to_env()

    import os

    monkeypatch.setattr(os, "environ", dict(os.environ))  # run() writes its settings there
    ran = {}
    monkeypatch.setattr(cli, "credentials_problem", lambda: None)
    monkeypatch.setattr(kopf, "run", lambda **kwargs: ran.update(kwargs))
    monkeypatch.setattr("stalledpolicy.logs.configure", lambda *a: None)
    monkeypatch.setattr("stalledpolicy.controller.logfilter.install", lambda: None)
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    assert cli_main(["operator", "-A", "--liveness", url]) == 0
    assert ran.get("liveness_endpoint") is None
    # the env the command line left behind is what the startup handler serves
    assert os.environ["STALLEDPOLICY_OPERATOR_LIVENESS"] == url

    monkeypatch.setattr(main, "_started", True)  # as after startup (tested below)

    async def start_probe_stop():
        await main.serve_liveness()
        try:
            return await asyncio.to_thread(get, url)
        finally:
            await main.stop_liveness()

    assert asyncio.run(start_probe_stop()) == (200, "{}")
    assert get(url) is None  # stopped at cleanup


def _startup_with(monkeypatch, build):
    """main's startup handlers as kopf runs them, the controller built by ``build``."""
    import kopf

    from stalledpolicy.controller import main, wiring

    monkeypatch.setattr(wiring, "build_controller", build)
    monkeypatch.setattr(main, "_controller", None)
    monkeypatch.setattr(main, "_started", False)
    monkeypatch.setattr(main, "_startup_problem", main._startup_problem)
    return lambda: main.startup(settings=kopf.OperatorSettings())


def _liveness_while(monkeypatch, steps):
    """Serve /healthz through main.serve_liveness on a real listener; run each of
    ``steps`` (in a thread, as kopf runs sync handlers) and probe after it."""
    from stalledpolicy.controller import main

    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    monkeypatch.setenv("STALLEDPOLICY_OPERATOR_LIVENESS", url)

    async def run():
        await main.serve_liveness()
        answers = []
        try:
            for step in steps:
                try:
                    await asyncio.to_thread(step)
                except Exception as exc:
                    answers.append(type(exc).__name__)
                answers.append(await asyncio.to_thread(get, url))
        finally:
            await main.stop_liveness()
            main.cleanup()
        return answers

    return asyncio.run(run())


def test_liveness_answers_503_until_the_controller_is_built_and_started(monkeypatch):
    """It answered 200 as soon as kopf's loop ran: a startup failing again and
    again, or hanging, looked healthy and the pod was never restarted."""
    import threading

    building = threading.Event()
    release = threading.Event()

    def slow_build(config):
        building.set()
        release.wait(10)
        return fake_controller(FakeApps())

    startup = _startup_with(monkeypatch, slow_build)
    holder = {}

    def start_in_background():
        holder["thread"] = threading.Thread(target=startup)
        holder["thread"].start()
        building.wait(5)

    def finish():
        release.set()
        holder["thread"].join(10)

    before, while_building, after = _liveness_while(monkeypatch, [lambda: None, start_in_background, finish])
    for answer in (before, while_building):
        assert answer[0] == 503, answer
        assert json.loads(answer[1]) == {
            "ready": False, "reason": "the operator is starting: the controller is not built and started yet"}
    assert after == (200, "{}")


def test_liveness_says_a_failed_startup_until_a_retry_succeeds(monkeypatch):
    attempts = []

    def build(config):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("the API server is unreachable")
        return fake_controller(FakeApps())

    startup = _startup_with(monkeypatch, build)
    failed, first, second = _liveness_while(monkeypatch, [startup, startup])
    assert failed == "RuntimeError"
    assert first[0] == 503 and json.loads(first[1])["reason"] == (
        "the operator's startup failed (RuntimeError); it is retried")
    assert second == (200, "{}")


def test_a_liveness_port_taken_after_the_check_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    """The race after the CLI's check: the server's own bind failed at kopf's
    startup, and the operator ended with kopf's ActivityError and a traceback.
    Real kopf.run, real listener; the check is made to pass as if the port were
    taken just after it."""
    import os

    from stalledpolicy.cli import main as cli_main
    from stalledpolicy.controller import cli, main, wiring

    for name in ("_controller", "_started", "_startup_problem", "_metrics_server"):
        monkeypatch.setattr(main, name, getattr(main, name))  # restored after the test

    monkeypatch.setattr(os, "environ", dict(os.environ))  # run() writes its settings there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({  # an API server nobody serves: kopf's watchers only retry
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    # read at import time by the kubernetes client (imported by earlier tests)
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.setattr(cli, "liveness_problem", lambda url: None)
    monkeypatch.setattr(wiring, "build_controller", lambda config: fake_controller(FakeApps()))
    monkeypatch.setattr("stalledpolicy.logs.configure", lambda *a: None)
    monkeypatch.setattr("stalledpolicy.controller.logfilter.install", lambda: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli_main(["operator", "-A", "--kubeconfig", str(kubeconfig),
                         "--liveness", f"http://127.0.0.1:{port}/healthz"])
    main.cleanup()  # the other startup handler built (a fake) controller
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stalledpolicy operator:")]
    assert len(lines) == 1
    assert lines[0].startswith(f"stalledpolicy operator: --liveness http://127.0.0.1:{port}/healthz: "
                               "cannot listen there (")


@pytest.mark.parametrize("url, words", [
    ("https://[::]:8080/healthz", "give an http:// URL"),
    ("http://[::]:99999/healthz", "the port must be a number from 0 to 65535"),
])
def test_a_liveness_url_that_cannot_be_served_is_one_line_and_exit_2(capsys, url, words):
    from stalledpolicy.cli import main

    assert main(["operator", "-A", "--liveness", url]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("stalledpolicy operator: --liveness ") and words in line


def test_a_liveness_port_in_use_is_one_line_and_exit_2(capsys):
    from stalledpolicy.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["operator", "-A", "--liveness", f"http://127.0.0.1:{port}/healthz"])
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"stalledpolicy operator: --liveness http://127.0.0.1:{port}/healthz: "
                           "cannot listen there (")


def test_every_address_is_no_problem_on_a_host_without_ipv6(monkeypatch):
    """The check before kopf starts listens as the servers will: :: falls back to IPv4."""
    from stalledpolicy.controller.cli import liveness_problem, metrics_listen_problem

    ipv4_only(monkeypatch)
    assert metrics_listen_problem("::", 0) is None
    assert liveness_problem("http://[::]:0/healthz") is None
    assert metrics_listen_problem("::1", 0) is not None  # one IPv6 address: as given
