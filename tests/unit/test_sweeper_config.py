"""Settings of ``stalledpolicy sweep``: flags, environment, validation, redaction."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from stalledpolicy.sweeper import cli
from stalledpolicy.sweeper.config import ConfigError, SweeperConfig, load_config


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stalledpolicy sweep")
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def flags_of(argv: list[str]) -> dict:
    args = parse(argv)
    return {field: getattr(args, field) for field in vars(args)}


def test_defaults_with_only_a_queue():
    config = load_config({"queue": "orders"}, {})
    assert config.queue == "orders"
    assert config.redis_url.get_secret_value() == "redis://127.0.0.1:6379/0"
    assert config.max_stalled == 1
    assert config.lanes == {}
    assert config.interval == 30.0
    assert config.batch_size == 1000
    assert config.metrics_port == 9090
    assert config.once is False
    assert (config.log_format, config.log_level) == ("text", "info")


def test_every_setting_from_the_environment():
    env = {
        "STALLEDPOLICY_REDIS_URL": "rediss://:pw@redis.example:6380/3",
        "STALLEDPOLICY_QUEUE": "orders",
        "STALLEDPOLICY_MAX_STALLED": "3",
        "STALLEDPOLICY_LANES": "imports=1, billing=0",
        "STALLEDPOLICY_INTERVAL": "2m",
        "STALLEDPOLICY_BATCH_SIZE": "500",
        "STALLEDPOLICY_METRICS_PORT": "0",
        "STALLEDPOLICY_METRICS_ADDRESS": "127.0.0.1",
        "STALLEDPOLICY_ONCE": "true",
        "STALLEDPOLICY_LOG_FORMAT": "json",
        "STALLEDPOLICY_LOG_LEVEL": "DEBUG",
    }
    config = load_config(flags_of([]), env)
    assert config.redis_url.get_secret_value() == "rediss://:pw@redis.example:6380/3"
    assert config.queue == "orders"
    assert config.max_stalled == 3
    assert config.lanes == {"imports": 1, "billing": 0}
    assert config.interval == 120.0
    assert config.batch_size == 500
    assert config.metrics_port == 0
    assert config.metrics_address == "127.0.0.1"
    assert config.once is True
    assert (config.log_format, config.log_level) == ("json", "debug")


def test_flags_beat_the_environment():
    env = {
        "STALLEDPOLICY_QUEUE": "from-env",
        "STALLEDPOLICY_MAX_STALLED": "5",
        "STALLEDPOLICY_LANES": "a=3,b=0",
        "STALLEDPOLICY_INTERVAL": "1h",
        "STALLEDPOLICY_ONCE": "false",
        "STALLEDPOLICY_REDIS_URL": "redis://env-host:6379/0",
    }
    argv = ["--queue", "from-flag", "--max-stalled", "0", "--lane", "c=2", "--interval", "15s",
            "--once", "--redis-url", "redis://flag-host:6379/1"]
    config = load_config(flags_of(argv), env)
    assert config.queue == "from-flag"
    assert config.max_stalled == 0
    # Lanes given by flag replace the variable's list; they are not merged.
    assert config.lanes == {"c": 2}
    assert config.interval == 15.0
    assert config.once is True
    assert config.redis_url.get_secret_value() == "redis://flag-host:6379/1"


def test_redis_url_forms():
    for url in ["redis://h", "redis://h:6380", "redis://:pw@h:6380/15", "rediss://user:pw@h/0",
                "unix:///run/redis.sock?db=2"]:
        assert load_config({"queue": "q", "redis_url": url}, {}).redis_url.get_secret_value() == url


def test_a_setting_missing_from_the_flags_falls_back_to_its_variable():
    config = load_config(flags_of(["--queue", "orders"]), {"STALLEDPOLICY_BATCH_SIZE": "7"})
    assert (config.queue, config.batch_size) == ("orders", 7)


def test_an_empty_variable_counts_as_unset():
    config = load_config(flags_of(["--queue", "orders"]), {"STALLEDPOLICY_MAX_STALLED": "", "STALLEDPOLICY_LANES": " "})
    assert config.max_stalled == 1
    assert config.lanes == {}


def test_repeated_lane_flags():
    config = load_config(flags_of(["--queue", "q", "--lane", "imports=1", "--lane", "billing=0",
                                   "--lane", "tenant-7=12"]), {})
    assert config.lanes == {"imports": 1, "billing": 0, "tenant-7": 12}


@pytest.mark.parametrize("text, expected", [
    ("a=3,b=0", {"a": 3, "b": 0}),
    (" a = 3 , b=0 ,", {"a": 3, "b": 0}),
    ("only=1", {"only": 1}),
])
def test_lanes_variable_syntax(text, expected):
    assert load_config({"queue": "q"}, {"STALLEDPOLICY_LANES": text}).lanes == expected


def test_once_variable_words():
    for word, expected in [("1", True), ("yes", True), ("ON", True), ("0", False), ("no", False), ("off", False)]:
        assert load_config({"queue": "q"}, {"STALLEDPOLICY_ONCE": word}).once is expected


BAD_VALUES = [
    # (flags, env, flag named, env named, words of the fix)
    (["--max-stalled", "-1"], {}, "--max-stalled", "STALLEDPOLICY_MAX_STALLED", "must be >= 0"),
    (["--max-stalled", "two"], {}, "--max-stalled", "STALLEDPOLICY_MAX_STALLED", "whole number"),
    ([], {"STALLEDPOLICY_MAX_STALLED": "1.5"}, "--max-stalled", "STALLEDPOLICY_MAX_STALLED", "whole number"),
    (["--queue", "a:b"], {}, "--queue", "STALLEDPOLICY_QUEUE", "may not contain"),
    (["--queue", "a{b}"], {}, "--queue", "STALLEDPOLICY_QUEUE", "may not contain"),
    ([], {"STALLEDPOLICY_QUEUE": "x" * 200}, "--queue", "STALLEDPOLICY_QUEUE", "at most 128"),
    (["--interval", "0s"], {}, "--interval", "STALLEDPOLICY_INTERVAL", "between 1s and 1h"),
    (["--interval", "2h"], {}, "--interval", "STALLEDPOLICY_INTERVAL", "between 1s and 1h"),
    (["--interval", "soon"], {}, "--interval", "STALLEDPOLICY_INTERVAL", "30s"),
    (["--interval", "30"], {}, "--interval", "STALLEDPOLICY_INTERVAL", "duration"),
    (["--batch-size", "0"], {}, "--batch-size", "STALLEDPOLICY_BATCH_SIZE", "from 1 to 10000"),
    (["--batch-size", "10001"], {}, "--batch-size", "STALLEDPOLICY_BATCH_SIZE", "from 1 to 10000"),
    (["--batch-size", "lots"], {}, "--batch-size", "STALLEDPOLICY_BATCH_SIZE", "whole number"),
    (["--metrics-port", "70000"], {}, "--metrics-port", "STALLEDPOLICY_METRICS_PORT", "0 to disable"),
    (["--metrics-port", "-1"], {}, "--metrics-port", "STALLEDPOLICY_METRICS_PORT", "0 to disable"),
    (["--lane", "imports"], {}, "--lane", "STALLEDPOLICY_LANES", "NAME=BUDGET"),
    (["--lane", "imports=-1"], {}, "--lane", "STALLEDPOLICY_LANES", ">= 0"),
    (["--lane", "imports=x"], {}, "--lane", "STALLEDPOLICY_LANES", "whole-number budget"),
    (["--lane", "=1"], {}, "--lane", "STALLEDPOLICY_LANES", "empty name"),
    (["--lane", "a:b=1"], {}, "--lane", "STALLEDPOLICY_LANES", "may not contain"),
    (["--lane", "a\x07b=1"], {}, "--lane", "STALLEDPOLICY_LANES", "control characters"),
    (["--lane", "a\u00a0b=1"], {}, "--lane", "STALLEDPOLICY_LANES", "may not contain"),
    (["--lane", "a=1", "--lane", "a=2"], {}, "--lane", "STALLEDPOLICY_LANES", "given twice"),
    ([], {"STALLEDPOLICY_LANES": "a=1;b=2"}, "--lane", "STALLEDPOLICY_LANES", "NAME=BUDGET"),
    (["--redis-url", "http://h:6379/0"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "redis://"),
    (["--redis-url", "redis://h:99999/0"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "host[:port]"),
    (["--redis-url", "redis:///0"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "no host"),
    (["--redis-url", "redis://h:6379/zero"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "database number"),
    (["--redis-url", "redis://h:6379/1x"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "database number"),
    (["--redis-url", "redis://h:6379/0?db=x"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "query option db"),
    ([], {"STALLEDPOLICY_REDIS_URL": "redis://:p/w@h:6379/0"}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "%2F"),
    (["--redis-url", "unix://"], {}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "socket path"),
    ([], {"STALLEDPOLICY_REDIS_URL": "h:6379"}, "--redis-url", "STALLEDPOLICY_REDIS_URL", "redis://"),
    ([], {"STALLEDPOLICY_ONCE": "maybe"}, "--once", "STALLEDPOLICY_ONCE", "true or false"),
    ([], {"STALLEDPOLICY_LOG_FORMAT": "xml"}, "--log-format", "STALLEDPOLICY_LOG_FORMAT", "text or json"),
    ([], {"STALLEDPOLICY_LOG_LEVEL": "loud"}, "--log-level", "STALLEDPOLICY_LOG_LEVEL", "debug, info"),
    ([], {"STALLEDPOLICY_METRICS_ADDRESS": "a b"}, "--metrics-address", "STALLEDPOLICY_METRICS_ADDRESS",
     "address"),
]


@pytest.mark.parametrize("argv, env, flag, var, fix", BAD_VALUES)
def test_a_bad_value_is_refused_naming_flag_variable_and_fix(argv, env, flag, var, fix):
    if "--queue" not in argv and "STALLEDPOLICY_QUEUE" not in env:
        argv = [*argv, "--queue", "orders"]
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(argv), env)
    [problem] = caught.value.problems
    assert problem.startswith(f"{flag} ({var}): ")
    assert fix in problem


@pytest.mark.parametrize("argv, env, flag, var, fix", BAD_VALUES)
def test_the_cli_exits_2_with_the_message(argv, env, flag, var, fix, capsys):
    if "--queue" not in argv and "STALLEDPOLICY_QUEUE" not in env:
        argv = [*argv, "--queue", "orders"]
    assert cli.run(parse(argv), environ=env) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: {flag} ({var}): " in err
    assert fix in err


def test_the_message_shows_the_bad_value():
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(["--queue", "q", "--max-stalled", "-1"]), {})
    assert caught.value.problems == [
        "--max-stalled (STALLEDPOLICY_MAX_STALLED): must be >= 0 "
        "(0 = never dead-letter, 1 = no recovery, 2 = one recovery, ...), got -1"
    ]


def test_a_missing_queue_says_how_to_set_it():
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of([]), {})
    assert caught.value.problems == ["--queue (STALLEDPOLICY_QUEUE): is required; set --queue or STALLEDPOLICY_QUEUE"]


def test_every_bad_setting_is_reported_at_once():
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(["--max-stalled", "-1", "--batch-size", "0"]), {"STALLEDPOLICY_INTERVAL": "0s"})
    named = sorted(p.split(" ", 1)[0] for p in caught.value.problems)
    assert named == ["--batch-size", "--interval", "--max-stalled", "--queue"]


def test_argparse_refuses_an_unknown_log_format_with_exit_2():
    with pytest.raises(SystemExit) as caught:
        parse(["--log-format", "xml"])
    assert caught.value.code == 2


def test_the_password_never_appears_in_messages_repr_or_description(capsys):
    secret = "hunter2-very-secret"
    url = f"redis://:{secret}@redis.example:6379/0"
    config = load_config({"queue": "q", "redis_url": url}, {})
    assert secret not in repr(config)
    assert secret not in str(config.model_dump())
    assert secret not in str(config.describe())
    assert config.describe()["redis"] == "redis://:***@redis.example:6379/0"
    # A bad URL with a password: the error does not show the URL at all.
    bad = f"http://:{secret}@redis.example:6379/0"
    assert cli.run(parse(["--queue", "q"]), environ={"STALLEDPOLICY_REDIS_URL": bad}) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert secret not in err
    assert "redis.example" not in err and "http://" not in err


def test_config_is_immutable_and_rejects_unknown_fields():
    config = SweeperConfig(queue="q")
    with pytest.raises(ValidationError):
        config.queue = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        SweeperConfig(queue="q", surprise=1)  # type: ignore[call-arg]


BAD_URLS_WITH_A_PASSWORD = [
    "redis://:s3cr/et?x#y@cache7.example:6379/0x",
    "redis://:s3cr/et@cache7.example:6379/0",
    "redis://user:s3cr?et@cache7.example:6379/0",
    "redis://:s3cr#et@cache7.example:6379/0",
    "redis://:s3cret@cache7.example:6379/0x",
    "redis://:s3cret@cache7.example:99999/0",
    "redis://:s3cret@[::1/0",
    "redis://:s3cr\u2100et@cache7.example/0",
    "http://:s3cret@cache7.example:6379/0",
    "redis://cache7.example:6379/0?password=s3cret&db=x",
    "redis://cache7.example:6379/0?password=s3cr#et",
]


@pytest.mark.parametrize("url", BAD_URLS_WITH_A_PASSWORD)
@pytest.mark.parametrize("source", ["flag", "env"])
def test_a_bad_url_is_refused_without_any_part_of_it(url, source, capsys):
    flags, env = (["--redis-url", url], {}) if source == "flag" else ([], {"STALLEDPOLICY_REDIS_URL": url})
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of([*flags, "--queue", "q"]), env)
    [problem] = caught.value.problems
    assert problem.startswith("--redis-url (STALLEDPOLICY_REDIS_URL): ")
    assert cli.run(parse([*flags, "--queue", "q"]), environ=env) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    for text in (problem, err):
        for fragment in ("s3cr", "et@", "cache7", "x#y", "0x", "99999", "::1", "got "):
            assert fragment not in text, (fragment, text)


@pytest.mark.parametrize("blank", ["", " ", "\n", " \t\r\n"])
def test_a_set_but_blank_redis_url_is_refused_not_taken_for_the_default(blank, capsys):
    """A Secret key holding nothing (or a newline) reaches the sweeper as a blank
    STALLEDPOLICY_REDIS_URL: it used to count as unset, and the sweeper swept
    redis://127.0.0.1:6379/0 without a word. Refused (exit 2), naming the setting
    and the fix; the other settings keep 'empty is unset'."""
    env = {"STALLEDPOLICY_REDIS_URL": blank, "STALLEDPOLICY_MAX_STALLED": ""}
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(["--queue", "q"]), env)
    [problem] = caught.value.problems
    # the variable is the blank one: named alone
    assert problem.startswith("STALLEDPOLICY_REDIS_URL: is set but empty (or only whitespace); ")
    assert "redis://[:password@]host[:port][/db]" in problem and "spec.redis.secretRef" in problem
    assert cli.run(parse(["--queue", "q"]), environ=env) == cli.EXIT_USAGE
    assert "error: STALLEDPOLICY_REDIS_URL: is set but empty" in capsys.readouterr().err
    # the flag given blank is refused the same way (it never falls back to the variable)
    with pytest.raises(ConfigError) as caught:
        load_config(flags_of(["--queue", "q", "--redis-url", blank]), {"STALLEDPOLICY_REDIS_URL": "redis://h/0"})
    # the flag is the blank one (the variable is set and valid): only the flag is named
    assert caught.value.problems[0].startswith("--redis-url: is set but empty")
    # unset: still the documented default
    assert load_config(flags_of(["--queue", "q"]), {}).redis_url.get_secret_value() == "redis://127.0.0.1:6379/0"
