"""The wheel, from which the image is built (Dockerfile, make image), carries
what runs in production and nothing of the development environment: no
stalledpolicy.devenv (the EchoMQ model, the local control plane, the demo)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    # the files the Dockerfile's build stage copies, without the caches an
    # editable install leaves in the work tree (an old egg-info lists devenv)
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "operator", src / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = out.glob("stalledpolicy_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_has_no_development_environment(wheel_names):
    assert [n for n in wheel_names if "devenv" in n] == []


def test_the_wheel_has_what_runs_in_production(wheel_names):
    for module in ("cli.py", "sweeper/loop.py", "controller/main.py", "engine/sweep.py", "keyspace.py",
                   "scripts/sweep.lua", "scripts/lib/holds.lua"):
        assert f"stalledpolicy/{module}" in wheel_names, module
    scripts = REPO / "operator" / "stalledpolicy" / "scripts"
    lua_in_tree = sorted(str(p.relative_to(REPO / "operator")) for p in scripts.rglob("*.lua"))
    assert sorted(n for n in wheel_names if n.endswith(".lua")) == lua_in_tree
