"""The code checks CI enforces (issue 23): ruff, mypy and the import layers
(.importlinter), each run as `make lint` runs it, on this checkout. The tools
come with the test extra (pyproject.toml): a missing one fails, never skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    """The tool installed beside this interpreter (the venv's), else on the PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it is in the test extra (pip install -e '.[test]')", pytrace=False)
    return found


@pytest.mark.parametrize("command", [
    ["ruff", "check", "."],
    ["mypy"],  # the packages and flags: [tool.mypy] in pyproject.toml
    ["lint-imports"],  # the contracts: .importlinter
], ids=lambda command: command[0])
def test_the_code_checks_pass(command):
    # the package of this checkout, not another one installed in the environment
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([_tool(command[0]), *command[1:]], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
