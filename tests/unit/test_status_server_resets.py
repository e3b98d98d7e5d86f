"""A scraper or TCP probe that hangs up with a reset writes nothing to stderr
(socketserver's default wrote a bare traceback per connection, which broke the
sweeper's JSON logs); any other failure of a request is one log record."""

from __future__ import annotations

import logging
import socket
import struct
import time
import urllib.request

from stalledpolicy.sweeper.metrics import Health, StatusServer, SweeperMetrics, _Handler, _Server


def reset_connection(port: int, request: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        if request:
            sock.sendall(request)


def test_connections_reset_by_the_client_leave_no_traceback(capfd):
    server = StatusServer("127.0.0.1", 0, SweeperMetrics("orders"), Health(60.0)).start()
    try:
        for i in range(40):
            reset_connection(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" if i % 2 else b"GET /met")
        time.sleep(0.5)  # the handler threads meet the resets
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            assert response.status == 200  # still serving
    finally:
        server.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[:2000]


def test_another_failure_is_one_log_record(caplog, capfd):
    try:
        raise ValueError("boom")
    except ValueError:
        with caplog.at_level(logging.WARNING, logger="stalledpolicy.metrics"):
            _Server.handle_error(None, None, ("127.0.0.1", 5555))  # type: ignore[arg-type]
    [record] = caplog.records
    assert record.getMessage() == "metrics request failed" and record.client == "127.0.0.1"
    assert record.exc_info[0] is ValueError
    assert capfd.readouterr().err == ""


def test_an_idle_connection_is_closed_and_holds_no_thread(monkeypatch):
    """A connection that sends nothing, or half a request, held a handler
    thread for ever (2,000 of them: 2,000 threads, +50 MB; reviewer's
    reproduction): the handler's socket timeout closes it."""
    import threading

    assert _Handler.timeout is not None and 0 < _Handler.timeout <= 30  # as shipped (socketserver: None)
    monkeypatch.setattr(_Handler, "timeout", 0.5)  # the same, shorter here
    server = StatusServer("127.0.0.1", 0, SweeperMetrics("orders"), Health(60.0)).start()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        idle[0].sendall(b"GET /met")  # half a request
        time.sleep(0.2)
        held = threading.active_count()
        for sock in idle:
            sock.settimeout(5)
            assert sock.recv(100) == b""  # closed by the server, unanswered
        deadline = time.monotonic() + 5
        while threading.active_count() > held - 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= held - 20, (held, threading.active_count())
    finally:
        for sock in idle:
            sock.close()
        server.stop()
