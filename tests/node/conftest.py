"""The real node's session (marker ``node``): every test under tests/node runs
inside the node's network namespace, which hack/node/run_tests.py creates and
starts this session in (`make test` runs it after the main session, which
deselects ``node``). Run by hand: ``.venv/bin/python hack/node/run_tests.py
[tests/node/test_x.py ...]`` as root.

- ``real_node``: the node (hack/node/realnode.Node), up and Ready for the whole
  session: control plane, containerd, kubelet, scheduler, the pause image and
  `make image`'s image imported, the ``kubernetes`` Service DNATed to the API.
  Its teardown sweeps, and fails the session when anything had to be swept.
- ``control_plane`` (overriding tests/kube_fixtures.py's): the node's plane, so
  ``kube_api``, ``kubeconfig`` and ``kube_namespace`` work as in tests/kube.

Started anywhere but inside the namespace run_tests.py made, the fixture fails
with the command to use: it never skips. This process refuses, by an audit
hook, to address anything but loopback from outside that namespace.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "node"))

import realnode  # noqa: E402
from run_tests import SYSCTLS_ENV, WORK_ENV  # noqa: E402

from stalledpolicy.devenv.controlplane import ensure_binaries  # noqa: E402

TEARDOWN_TEST = "test_teardown_stops_everything_and_leaves_nothing"


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def pytest_configure(config):
    """SIGTERM (run_tests.py passes it on) ends the session as Ctrl-C does: pytest then
    runs the fixtures' teardown, the node's included."""
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(config, items):
    """Every test here is a ``node`` test; the teardown test, which stops the node, runs last."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.node)
    items.sort(key=lambda item: item.name == TEARDOWN_TEST)


@pytest.fixture(scope="session")
def real_node(request):
    netns = os.environ.get(realnode.NETNS_ENV)
    if not netns or not os.environ.get(WORK_ENV):
        pytest.fail("the real-node tests run inside the node's network namespace: run them with `make test` or, "
                    "as root, `.venv/bin/python hack/node/run_tests.py [tests/node/...]`", pytrace=False)
    if not realnode.thread_in_namespace(netns):
        pytest.fail(f"{realnode.NETNS_ENV}={netns}, but this process is not inside that namespace", pytrace=False)
    guard = realnode.NetworkGuard.install(netns)
    image = realnode.default_image()
    if not image.is_file():
        pytest.fail(f"no image {image}: `make image` builds it", pytrace=False)
    node = realnode.Node(Path(os.environ[WORK_ENV]), netns, sysctls_before=json.loads(os.environ[SYSCTLS_ENV]))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    try:
        node.start(image, realnode.node_binaries(), ensure_binaries())
    except realnode.NodeError as exc:
        node.teardown()
        pytest.fail(f"the node did not come up: {exc}", pytrace=False)
    if reporter is not None:
        reporter.write_line(f"real node {realnode.NODE_NAME} Ready in namespace {netns}, API {node.plane.server_url}")
    yield node
    left = node.teardown()
    assert not left, f"the node's teardown had to sweep: {left}"
    assert not guard.refused, f"the network guard refused addresses during the session: {guard.refused}"


@pytest.fixture(scope="session")
def control_plane(real_node):
    return real_node.plane
