"""The operator's Redis clients are shared by the policies naming one URL: one
policy's failure must not break another's read in flight on the same client."""

from __future__ import annotations

import threading
import time

import pytest

from stalledpolicy.controller.redis_clients import RedisClients

pytestmark = pytest.mark.redis


def test_an_invalidated_shared_client_finishes_the_other_policys_read(redis_server):
    clients = RedisClients(timeout=3.0)
    url = redis_server.url
    first = clients.client(("ns", "p1"), url)
    shared = clients.client(("ns", "p2"), url)
    assert first is shared
    started = threading.Event()
    outcome: dict = {}

    def read_in_flight() -> None:
        started.set()
        try:
            outcome["reply"] = shared.blpop(["shared-client-test:nothing"], timeout=1)
        except Exception as exc:  # noqa: BLE001 - the failure is what the test looks for
            outcome["error"] = repr(exc)

    reader = threading.Thread(target=read_in_flight)
    reader.start()
    started.wait()
    time.sleep(0.2)  # BLPOP is waiting on the server
    clients.invalidate(("ns", "p1"))  # p1's read failed (say): its client is dropped
    reader.join(5)
    assert outcome == {"reply": None}, outcome  # p2's read ran its course
    renewed = clients.client(("ns", "p2"), url)
    assert renewed is not shared and renewed.ping()  # the next use reconnects
    clients.close_all()
