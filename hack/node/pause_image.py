#!/usr/bin/env python3
"""The pod sandbox ("pause") image of the real node, with no registry: pause.c
compiled static with the host's gcc, packed as a docker-archive of one file
(/pause, run as 65535 as upstream's is) by hack/image/dockerarchive.py.

Usage: pause_image.py [OUT]   (default build/node/pause.tar); prints the path.
The image's tag is TAG below: containerd's CRI sandbox_image must name it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "hack" / "image"))

import dockerarchive  # noqa: E402

TAG = "localhost/stalledpolicy/pause:1"


def build(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pause-image-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        subprocess.run(["gcc", "-Os", "-static", "-Wall", "-Werror", "-o", str(root / "pause"), str(HERE / "pause.c")],
                       check=True)
        subprocess.run(["strip", str(root / "pause")], check=True)
        (root / "pause").chmod(0o755)
        layer = Path(tmp) / "layer.tar"
        diff_id, _ = dockerarchive.pack_layer(root, layer)
        config = dockerarchive.image_config(
            diff_id=diff_id, architecture="amd64", created="1970-01-01T00:00:00Z",
            created_by="hack/node/pause_image.py",
            config={"User": "65535:65535", "Entrypoint": ["/pause"], "Env": [], "WorkingDir": "/"})
        dockerarchive.write_archive(out, layer=layer, diff_id=diff_id, config=config, repo_tags=[TAG])
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "build" / "node" / "pause.tar"))
