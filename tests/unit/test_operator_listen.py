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

    from stalledpolicy.cli import build_parser, main as cli_main
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

    async def start_probe_stop():
        await main.serve_liveness()
        try:
            return await asyncio.to_thread(get, url)
        finally:
            await main.stop_liveness()

    assert asyncio.run(start_probe_stop()) == (200, "{}")
    assert get(url) is None  # stopped at cleanup


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
