"""`make image` end to end: the Debian root filesystem (cached under
~/.cache/stalledpolicy/image after the first run), the Dockerfile's build
stage and final stage in chroots, the docker-archive, and verify.py's checks,
which unpack it and run `stalledpolicy --help`, `sweep --help`, `operator
--help` and the imports in it as uid 65532. About 25 s for the root
filesystem the first time, 40 to 70 s for the rest; nothing when nothing it
is built from changed (then only the checks run again).

Needs root (mmdebstrap's root mode, chroot, unshare), mmdebstrap (`make
test` installs it: hack/install-system-packages.sh), Debian's mirror and PyPI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "image"))

import dockerarchive  # noqa: E402
import imagerecipe  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_make_image_builds_the_charts_image_and_it_runs_as_65532():
    if os.geteuid() != 0:
        pytest.skip("make image needs root (mmdebstrap's root mode, chroot)")
    if shutil.which("mmdebstrap") is None:
        pytest.fail("mmdebstrap is not installed (make test installs it: hack/install-system-packages.sh)")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "hack" / "image" / "build.py")],
                          capture_output=True, text=True, timeout=1700)
    print(done.stderr[-3000:], file=sys.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "all checks passed" in done.stderr
    out = Path(done.stdout.strip().splitlines()[-1])
    version = imagerecipe.project_version()
    assert out == REPO / "build" / "image" / f"stalledpolicy-operator-{version}.tar"
    archive = dockerarchive.read_archive(out)
    assert archive.repo_tags == [imagerecipe.image_reference()]
    assert archive.config["config"]["User"] == "65532:65532"
    info = json.loads(Path(f"{out}.json").read_text())
    assert info["image_id"] == archive.image_id
    assert info["python"].startswith("3.11.")
    assert any(line.startswith("stalledpolicy-operator==") for line in info["pip_freeze"])
    print(f"make image: {time.monotonic() - started:.0f} s, steps {info['seconds']}", file=sys.stderr)

    # built from the same inputs: nothing is built again
    again = subprocess.run([sys.executable, str(REPO / "hack" / "image" / "build.py"), "--no-verify"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "up to date" in again.stderr, again.stderr
