"""``python -m stalledpolicy.sweeper ...``: the same as ``stalledpolicy sweep ...``."""

import argparse

from stalledpolicy.sweeper.cli import add_arguments, run

parser = argparse.ArgumentParser(prog="stalledpolicy sweep")
add_arguments(parser)
raise SystemExit(run(parser.parse_args()))
