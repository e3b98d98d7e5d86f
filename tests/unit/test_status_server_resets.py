"""A scraper or TCP probe that hangs up with a reset writes nothing to stderr
(socketserver's default wrote a bare traceback per connection, which broke the
sweeper's JSON logs); any other failure of a request is one log record."""

from __future__ import annotations

import logging
import socket
import struct
import time
import urllib.request

from stalledpolicy.sweeper.metrics import Health, StatusServer, SweeperMetrics, _Server


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
