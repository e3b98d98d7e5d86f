"""Shared fixtures. Servers are real processes: redis-server from Debian's
package, and (in ``tests/kube_fixtures.py``) the Kubernetes control plane built
from Go modules."""

from __future__ import annotations

import shutil
import uuid

import pytest

from stalledpolicy.devenv.redis_server import start_cluster, start_redis
from stalledpolicy.keyspace import QueueKeys

pytest_plugins = ["tests.kube_fixtures"]


@pytest.fixture(scope="session")
def redis_server():
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is missing: .ci/run installs it (apt-get install -y redis-server)")
    server = start_redis()
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
def redis_cluster():
    """Three real cluster-enabled redis-server nodes on loopback, slots split evenly."""
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.fail("redis-server and redis-cli are missing: .ci/run installs them "
                    "(apt-get install -y redis-server redis-tools)")
    cluster = start_cluster(3)
    yield cluster
    cluster.stop()
    for node in cluster.nodes:
        shutil.rmtree(node.workdir, ignore_errors=True)
