"""``stalledpolicy``: one console script, three commands.

``sweep`` runs the sweeper, ``morgue`` is the on-call tool for dead letters,
``operator`` runs the kopf operator. Each command lives in its own module and
is imported only when used, so ``stalledpolicy morgue`` does not load kopf.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import cast

from stalledpolicy.redis_url.redaction import redact_urls

# command -> module exposing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "sweep": ("stalledpolicy.sweeper.cli", "sweep stalled jobs of one queue on an interval"),
    "morgue": ("stalledpolicy.morgue.cli", "inspect, replay and purge dead-lettered jobs"),
    "operator": ("stalledpolicy.controller.cli", "run the Kubernetes operator"),
}

EXIT_USAGE = 2


# a value that argparse would take for an option: a negative number or duration (-5s, -1)
_NEGATIVE = re.compile(r"-[0-9.]")
DISTRIBUTION = "stalledpolicy-operator"


class _Parser(argparse.ArgumentParser):
    """argparse quotes what it could not place (a mistyped --redisurl=redis://:pw@h,
    a URL given without its flag): any URL in its message is redacted first.
    Subcommand parsers are of the same class, so theirs are too.

    A negative value after an option that takes one (``--older-than -5s``)
    reaches the option's own check, which says what is wrong with it, instead
    of argparse's "expected one argument" (it reads ``-5s`` as an option)."""

    def error(self, message: str):
        super().error(redact_urls(message))

    def parse_known_args(self, args=None, namespace=None):
        if args is not None:
            args = self._negative_values_joined(list(args))
        return super().parse_known_args(args, namespace)

    def _negative_values_joined(self, args: list[str]) -> list[str]:
        joined: list[str] = []
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                return joined + args[i:]
            action = self._option_string_actions.get(token)
            if (action is not None and action.nargs is None and isinstance(
                    action, (argparse._StoreAction, argparse._AppendAction))  # noqa: SLF001
                    and i + 1 < len(args) and _NEGATIVE.match(args[i + 1])):
                joined.append(f"{token}={args[i + 1]}")
                i += 2
                continue
            joined.append(token)
            i += 1
        return joined


def distribution_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stalledpolicy",
        description="Bounded stalled-job recovery for EchoMQ queues on Redis/Valkey.",
        epilog="Run 'stalledpolicy COMMAND --help' for a command's settings.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {distribution_version()}",
                        help="print the version of stalledpolicy-operator and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(command)
        command.set_defaults(_module=module, _command_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extras:
        # named by the parser of the (sub)command they were given to: its usage, not the top level's
        deepest = cast(argparse.ArgumentParser,
                       getattr(args, "_morgue_parser", None) or getattr(args, "_command_parser", parser))
        deepest.error(f"unrecognized arguments: {' '.join(extras)}")
    return importlib.import_module(args._module).run(args)
