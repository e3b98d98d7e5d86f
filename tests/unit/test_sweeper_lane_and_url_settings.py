"""``stalledpolicy sweep`` settings once accepted or misnamed: a lane name
holding an undecodable byte, a blank --redis-url beside a set variable, a
malformed --metrics-address with --once."""

from __future__ import annotations

import pytest

from stalledpolicy import keyspace
from stalledpolicy.sweeper import cli
from stalledpolicy.sweeper.config import ConfigError, load_config
from tests.unit.test_sweeper_config import flags_of, parse

UNDECODABLE = "l\udcfe"  # what the byte 0xfe of a command line or environment becomes


@pytest.mark.parametrize("argv, env", [
    (["--queue", "emails", "--lane", f"{UNDECODABLE}=1"], {}),
    (["--queue", "emails"], {"STALLEDPOLICY_LANES": f"{UNDECODABLE}=1"}),
    (["--queue", "emails"], {"STALLEDPOLICY_LANES": f"ok=1,{UNDECODABLE}=2"}),
])
def test_a_lane_name_with_an_undecodable_byte_is_refused_at_start(argv, env):
    # before: accepted, and every pass then failed with UnicodeEncodeError
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(argv), env)
    [problem] = caught.value.problems
    assert problem.startswith("--lane (STALLEDPOLICY_LANES): ")
    assert "an undecodable byte" in problem and "U+DCFE" in problem


def test_the_lane_rule_is_the_keyspace_rule():
    """Every character the keyspace refuses in a lane name, the sweeper refuses at start."""
    for bad in ("{", "}", ":", ",", "=", " ", "\t", "\x07", "\u00a0", "\u2028", "\udcff"):
        name = f"a{bad}b"
        with pytest.raises(keyspace.InvalidLaneName):
            keyspace.validate_lane_name(name)
        entry = [(name, 1)]  # a pair: ',' and '=' reach the name check too
        with pytest.raises(ConfigError):
            load_config({"queue": "q", "lanes": entry}, {})
    assert load_config({"queue": "q", "lanes": [("l\ufffd", 1)]}, {}).lanes == {"l\ufffd": 1}


def test_the_cli_exits_2_for_an_undecodable_lane(capsys):
    assert cli.run(parse(["--queue", "emails", "--once", "--redis-url", "redis://127.0.0.1:1/0",
                          "--lane", f"{UNDECODABLE}=1"]), environ={}) == 2
    err = capsys.readouterr().err
    assert "error: --lane (STALLEDPOLICY_LANES): " in err and "undecodable byte" in err


@pytest.mark.parametrize("blank", ["", " ", "\n"])
def test_a_blank_redis_url_flag_beside_a_set_variable_names_the_flag_alone(blank, capsys):
    # before: "--redis-url (STALLEDPOLICY_REDIS_URL): is set but empty", blaming a valid variable too
    env = {"STALLEDPOLICY_REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(["--queue", "q", "--redis-url", blank]), env)
    [problem] = caught.value.problems
    assert problem.startswith("--redis-url: is set but empty (or only whitespace); ")
    assert "STALLEDPOLICY_REDIS_URL" not in problem
    assert cli.run(parse(["--queue", "q", "--once", "--redis-url", blank]), environ=env) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "error: --redis-url: is set but empty" in err and "STALLEDPOLICY_REDIS_URL" not in err.splitlines()[0]


def test_a_blank_redis_url_variable_without_the_flag_names_the_variable_alone():
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(["--queue", "q"]), {"STALLEDPOLICY_REDIS_URL": "  "})
    [problem] = caught.value.problems
    assert problem.startswith("STALLEDPOLICY_REDIS_URL: is set but empty (or only whitespace); ")
    assert "--redis-url" not in problem
