"""``stalledpolicy``: one console script, three commands.

``sweep`` runs the sweeper, ``morgue`` is the on-call tool for dead letters,
``operator`` runs the kopf operator. Each command lives in its own module and
is imported only when used, so ``stalledpolicy morgue`` does not load kopf.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> module exposing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "sweep": ("stalledpolicy.sweeper.cli", "sweep stalled jobs of one queue on an interval"),
    "morgue": ("stalledpolicy.morgue.cli", "inspect, replay and purge dead-lettered jobs"),
    "operator": ("stalledpolicy.controller.cli", "run the Kubernetes operator"),
}

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse quotes what it could not place (a mistyped --redisurl=redis://:pw@h,
    a URL given without its flag): any URL in its message is redacted first.
    Subcommand parsers are of the same class, so theirs are too."""

    def error(self, message: str):  # type: ignore[override]
        from stalledpolicy.redis_url import redact_urls

        super().error(redact_urls(message))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stalledpolicy",
        description="Bounded stalled-job recovery for EchoMQ queues on Redis/Valkey.",
        epilog="Run 'stalledpolicy COMMAND --help' for a command's settings.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return importlib.import_module(args._module).run(args)
