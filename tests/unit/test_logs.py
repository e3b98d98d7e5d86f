"""The log formatters: one record is one line, whatever its fields hold."""

from __future__ import annotations

import json
import logging

import pytest

from stalledpolicy.logs import JsonFormatter, KeyValueFormatter


def record(**extra) -> logging.LogRecord:
    rec = logging.LogRecord("stalledpolicy.sweeper", logging.INFO, __file__, 1, "sweep pass", None, None)
    rec.__dict__.update(extra)
    return rec


@pytest.mark.parametrize("lanes", [
    "tenant\n2026-12-03T10:00:00\terror\tstalledpolicy.sweeper:\tFORGED:0/2",  # a lane name from a job row
    "a\rb:0/1",
    "a\x1b[31mred:0/1",
    "JOB\udcff:0/1",  # a byte that is not UTF-8, kept as a lone surrogate
])
def test_a_field_from_redis_cannot_split_or_drive_a_text_line(lanes):
    line = KeyValueFormatter().format(record(queue="q", lanes=lanes))
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line.isprintable() and " lanes=" in line
    assert line.endswith(" lanes=" + repr(lanes))


def test_plain_and_spaced_values_read_as_before():
    line = KeyValueFormatter().format(record(queue="q", error="Connection refused.", calls=3))
    assert line.endswith(" queue=q error='Connection refused.' calls=3")


def test_json_lines_escape_them_already():
    lanes = "tenant\nFORGED"
    line = JsonFormatter().format(record(lanes=lanes))
    assert "\n" not in line and json.loads(line)["lanes"] == lanes
