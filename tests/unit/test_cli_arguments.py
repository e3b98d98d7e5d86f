"""The console script's argument handling: negative durations, the
subcommand's usage for unknown options, --version, the operator's
--namespace and its two ports."""

from __future__ import annotations

import pytest

from stalledpolicy import cli
from stalledpolicy.controller import cli as operator_cli


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    return ended.value.code, out, err


@pytest.mark.parametrize("argv", [["--older-than", "-5s"], ["--older-than=-5s"], ["--older-than", "-0.5h"]])
def test_a_negative_age_is_told_to_be_positive(capsys, argv):
    """It said 'expected one argument' (argparse reads -5s as an option)."""
    code, _, err = run_cli(capsys, "morgue", "purge", *argv, "--all")
    assert code == 2
    assert "the duration must be positive" in err and "expected one argument" not in err
    assert err.startswith("usage: stalledpolicy morgue purge")


def test_a_negative_sweep_interval_reaches_the_settings_check(capsys, monkeypatch):
    monkeypatch.delenv("STALLEDPOLICY_QUEUE", raising=False)
    assert cli.main(["sweep", "--queue", "q", "--interval", "-5s"]) == 2
    err = capsys.readouterr().err
    assert "--interval" in err and "expected one argument" not in err


@pytest.mark.parametrize(("argv", "usage"), [
    (["morgue", "replay", "--older-than", "1s"], "usage: stalledpolicy morgue replay"),
    (["sweep", "--bogus"], "usage: stalledpolicy sweep"),
    (["operator", "--bogus"], "usage: stalledpolicy operator"),
    (["morgue", "stats", "--bogus", "redis://:pw@h"], "usage: stalledpolicy morgue stats"),
])
def test_an_unknown_option_shows_the_usage_of_its_subcommand(capsys, argv, usage):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith(usage), err
    assert "unrecognized arguments: " + argv[2 if argv[0] == "morgue" else 1] in err
    assert "pw" not in err


def test_version_prints_the_distribution_version(capsys):
    from importlib.metadata import version

    code, out, _ = run_cli(capsys, "--version")
    assert code == 0
    assert out == f"stalledpolicy {version('stalledpolicy-operator')}\n"


@pytest.mark.parametrize("name", ["Bad_NS", "team.a", "team-", "a" * 64, "team-*,Bad"])
def test_a_namespace_that_is_no_dns_label_is_refused_naming_the_flag(capsys, name):
    code, _, err = run_cli(capsys, "operator", "--namespace", name)
    assert code == 2
    assert "--namespace" in err and "DNS-1123 label" in err


@pytest.mark.parametrize("name", ["team-a", "a" * 63, "team-*", "!team-x", "team-*,!team-pr-*", "t?am"])
def test_namespace_names_and_kopf_globs_are_accepted(name):
    args = cli.build_parser().parse_args(["operator", "--namespace", name])
    assert args.namespace == [name]


def test_the_metrics_and_liveness_ports_must_differ(capsys, monkeypatch):
    monkeypatch.delenv("STALLEDPOLICY_OPERATOR_METRICS_PORT", raising=False)
    monkeypatch.delenv("STALLEDPOLICY_OPERATOR_LIVENESS", raising=False)
    monkeypatch.setattr(operator_cli, "credentials_problem", lambda: pytest.fail("must stop before"))
    args = cli.build_parser().parse_args(
        ["operator", "-A", "--metrics-port", "18080", "--liveness", "http://[::]:18080/healthz"])
    assert operator_cli.run(args) == 2
    err = capsys.readouterr().err
    assert "--metrics-port 18080" in err and "--liveness" in err and "different ports" in err


def test_the_metrics_port_from_the_environment_is_checked_too(capsys, monkeypatch):
    monkeypatch.setenv("STALLEDPOLICY_OPERATOR_METRICS_PORT", "18081")
    monkeypatch.setattr(operator_cli, "credentials_problem", lambda: pytest.fail("must stop before"))
    args = cli.build_parser().parse_args(["operator", "-A", "--liveness", "http://127.0.0.1:18081/healthz"])
    assert operator_cli.run(args) == 2
    assert "different ports" in capsys.readouterr().err
