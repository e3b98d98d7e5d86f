"""``stalledpolicy sweep``'s start-up checks, in process (no Redis: every case
here is refused before a connection is made)."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from stalledpolicy.cli import build_parser
from stalledpolicy.sweeper import cli


def start(capsys, *argv: str, env: dict | None = None) -> tuple[int, str]:
    args = build_parser().parse_args(["sweep", "--queue", "orders", "--once", *argv])
    code = cli.run(args, environ=env or {})
    return code, capsys.readouterr().err


HUGE = "9" * 5000  # past int()'s 4,300-digit limit
PADDED_ONE = "0" * 5000 + "1"  # small, but still past int()'s limit as written


@pytest.mark.parametrize(("argv", "env", "names", "limit"), [
    (["--max-stalled", HUGE], {}, "--max-stalled (STALLEDPOLICY_MAX_STALLED)", "2147483647"),
    (["--max-stalled", "2147483648"], {}, "--max-stalled (STALLEDPOLICY_MAX_STALLED)", "2147483647"),
    ([], {"STALLEDPOLICY_MAX_STALLED": HUGE}, "--max-stalled (STALLEDPOLICY_MAX_STALLED)", "2147483647"),
    (["--batch-size", HUGE], {}, "--batch-size (STALLEDPOLICY_BATCH_SIZE)", "10000"),
    ([], {"STALLEDPOLICY_METRICS_PORT": HUGE}, "--metrics-port (STALLEDPOLICY_METRICS_PORT)", "65535"),
    (["--lane", f"imports={HUGE}"], {}, "--lane (STALLEDPOLICY_LANES)", "2147483647"),
    (["--lane", "imports=2147483648"], {}, "--lane (STALLEDPOLICY_LANES)", "2147483647"),
    ([], {"STALLEDPOLICY_LANES": f"a=1,b={HUGE}"}, "--lane (STALLEDPOLICY_LANES)", "2147483647"),
    (["--batch-size", PADDED_ONE], {}, "--batch-size (STALLEDPOLICY_BATCH_SIZE)", "10000"),
    (["--max-stalled", "-" + PADDED_ONE], {}, "--max-stalled (STALLEDPOLICY_MAX_STALLED)", "2147483647"),
    (["--lane", f"a={PADDED_ONE}"], {}, "--lane (STALLEDPOLICY_LANES)", "2147483647"),
])
def test_integers_out_of_range_get_our_message_at_any_length(capsys, argv, env, names, limit):
    code, err = start(capsys, *argv, env=env)
    assert code == 2
    assert f"{names}: " in err and f" to {limit}" in err
    assert "4300" not in err and "Exceeds" not in err and "int_max_str_digits" not in err
    assert len(err) < 1000  # the number is not echoed whole


def test_the_largest_budget_is_accepted(capsys, monkeypatch):
    served = []
    monkeypatch.setattr(cli, "_serve", lambda config: served.append(config) or 0)
    code, err = start(capsys, "--max-stalled", "2147483647", "--lane", "a=2147483647")
    assert code == 0, err
    assert served[0].max_stalled == 2147483647 and served[0].lanes == {"a": 2147483647}


def test_a_huge_negative_number_is_refused_without_int_conversion_text(capsys):
    code, err = start(capsys, "--max-stalled", "-" + HUGE)
    assert code == 2
    assert "--max-stalled (STALLEDPOLICY_MAX_STALLED): must be from 0 to 2147483647" in err and "Exceeds" not in err


def test_other_problems_are_still_reported_next_to_a_number_out_of_range(capsys):
    code, err = start(capsys, "--max-stalled", HUGE, "--interval", "soon")
    assert code == 2
    assert "--max-stalled" in err and "--interval (STALLEDPOLICY_INTERVAL)" in err


def test_a_comma_list_in_one_lane_flag_says_the_flag_repeats(capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["sweep", "--queue", "orders", "--lane", "a=1,b=2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--lane" in err and "repeatable" in err and "--lane a=1 --lane b=2" in err


@pytest.mark.parametrize(("url", "needle"), [
    ("redis://:hunter2@127.0.0.1:6379/0?socket_timeout=abc", "socket_timeout"),
    ("redis://:hunter2@127.0.0.1:6379/0?db=x", "db"),
    ("redis://:hunter2@127.0.0.1:6379/0?protocol=9", "protocol"),
    ("redis://:hunter2@127.0.0.1:6379/0?no_such_option=1", "does not know"),
])
def test_redis_url_query_options_are_checked_at_start(capsys, url, needle):
    code, err = start(capsys, "--redis-url", url)
    assert code == 2, err
    assert "--redis-url (STALLEDPOLICY_REDIS_URL): " in err and needle in err
    assert "hunter2" not in err


@pytest.mark.parametrize(("exc", "address", "names", "words"), [
    (OSError(errno.EADDRINUSE, "Address already in use"), "127.0.0.1", "--metrics-port", "already in use"),
    (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "192.0.2.7", "--metrics-address",
     "not an address of this host"),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "nowhere.invalid", "--metrics-address",
     "not an IP address or a name"),
    (OSError(errno.EACCES, "Permission denied"), "0.0.0.0", "--metrics-port", "below 1024"),
    (OSError(errno.EAFNOSUPPORT, "Address family not supported"), "::", "--metrics-address", "no IPv6"),
])
def test_listen_errors_blame_the_setting_at_fault(exc, address, names, words):
    problem = cli._listen_problem(exc, address, 80)
    assert problem.startswith(names) and words in problem


@pytest.mark.parametrize(("argv", "env", "names"), [
    (["--queue", "redis://:s3cr3t@x"], {}, "--queue"),
    ([], {"STALLEDPOLICY_INTERVAL": "redis://:s3cr3t@h"}, "--interval"),
    (["--lane", "redis://:s3cr3t@x=1"], {}, "--lane"),
    (["--lane", "redis://:s3cr3t@redis:6379/0"], {}, "--lane"),  # no '=': not NAME=BUDGET
    ([], {"STALLEDPOLICY_LANES": "redis://:s3cr3t@redis:6379/0"}, "--lane"),
    ([], {"STALLEDPOLICY_METRICS_ADDRESS": "redis://:s3cr3t@redis:6379/0"}, "--metrics-address"),
    ([], {"STALLEDPOLICY_MAX_STALLED": "rediss://:s3cr3tpasswordlong@h:6380/0"}, "--max-stalled"),
])
def test_a_url_in_the_wrong_setting_shows_no_password(capsys, argv, env, names):
    """Variables swapped in a Deployment put the Redis URL where a value is
    quoted back: the setting is named, the password never shown."""
    code, err = start(capsys, *argv, env=env)
    assert code == 2 and f"error: {names} " in err
    assert "s3c" not in err  # not even the start of it, where the value is cut short


def sweep_process(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    return subprocess.run([sys.executable, "-m", "stalledpolicy", "sweep", *argv], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("argv", "env"), [
    (["--log-format", "json", "--interval", "zz", "--batch-size", "0"], {}),
    (["--interval", "zz"], {"STALLEDPOLICY_LOG_FORMAT": " JSON ", "STALLEDPOLICY_BATCH_SIZE": "0"}),
])
def test_with_json_logs_bad_settings_are_json_lines_too(argv, env):
    """A pod whose logs are parsed as JSON got its only lines, the refusal, as plain text."""
    done = sweep_process("--queue", "orders", "--once", *argv, env=env)
    assert done.returncode == 2, done.stderr
    entries = [json.loads(line) for line in done.stderr.strip().splitlines()]
    assert [e["msg"].split(" ")[0] for e in entries] == ["--interval", "--batch-size"]
    assert all(e["level"] == "error" and e["exit_code"] == 2 for e in entries), entries
    assert done.stdout == ""


def test_a_bad_log_format_itself_is_refused_in_plain_text():
    done = sweep_process("--queue", "orders", "--once", "--interval", "zz", env={"STALLEDPOLICY_LOG_FORMAT": "xml"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith("stalledpolicy sweep: ") for line in lines), lines
    assert any("--log-format (STALLEDPOLICY_LOG_FORMAT): must be text or json" in line for line in lines), lines
