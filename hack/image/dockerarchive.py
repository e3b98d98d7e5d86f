"""A docker-archive (the format of `docker save`) of one single-layer image,
written with tarfile from a root filesystem directory, and read back.

    manifest.json         [{"Config": "<id>.json", "RepoTags": [...], "Layers": ["<diff>/layer.tar"]}]
    <id>.json             the image config; <id> is its sha256
    <diff>/layer.tar      the root filesystem, uncompressed; <diff> is its sha256 (the diff_id)
    repositories          {"<repository>": {"<tag>": "<diff>"}} (legacy, for old loaders)

`docker load`, `kind load image-archive` and `ctr images import` read it.
Deterministic for the same tree: entries sorted, numeric owners only, no user
or group names from the host, fixed times for the archive's own files.
Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

# Directories kept empty in the layer: the container runtime mounts them.
EMPTY_DIRS = ("dev", "proc", "sys")
CHUNK = 1 << 20


class ArchiveError(ValueError):
    """The archive is not a valid docker-archive of one image."""


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through."""

    def __init__(self, target):
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self):
        return True

    def write(self, data):
        self.sha256.update(data)
        self.size += len(data)
        self.target.write(data)
        return len(data)


def _entries(root: Path, rel: str = ""):
    """(path, arcname) of everything under root, depth first, sorted by name;
    the contents of EMPTY_DIRS left out."""
    with os.scandir(root / rel if rel else root) as it:
        names = sorted(entry.name for entry in it)
    for name in names:
        arcname = f"{rel}/{name}" if rel else name
        path = root / arcname
        yield path, arcname
        if path.is_dir() and not path.is_symlink() and arcname not in EMPTY_DIRS:
            yield from _entries(root, arcname)


def pack_layer(root: Path, out: Path) -> tuple[str, int]:
    """Write root's tree as an uncompressed layer tar to out. Returns
    ("sha256:<hex>", size): the layer's diff_id and its byte count."""
    root = Path(root)
    with open(out, "wb") as raw:
        writer = _HashingWriter(raw)
        stream = io.BufferedWriter(writer, CHUNK)
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path, arcname in _entries(root):
                info = tar.gettarinfo(str(path), arcname)
                if info is None:  # a socket: nothing to keep
                    continue
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as data:
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
        stream.flush()
    return f"sha256:{writer.sha256.hexdigest()}", writer.size


def image_config(*, diff_id: str, config: dict, created: str, architecture: str,
                 created_by: str, labels: dict[str, str] | None = None) -> dict:
    cfg = dict(config)
    if labels:
        cfg["Labels"] = dict(sorted(labels.items()))
    return {
        "architecture": architecture,
        "os": "linux",
        "created": created,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": created_by}],
    }


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(out: Path, *, layer: Path, diff_id: str, config: dict, repo_tags: list[str],
                  mtime: int = 0) -> str:
    """Write the docker-archive to out (through out.partial, renamed at the end).
    Returns the image ID: "sha256:" + the config's digest."""
    config_bytes = _canonical(config)
    config_hex = hashlib.sha256(config_bytes).hexdigest()
    diff_hex = diff_id.removeprefix("sha256:")
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": list(repo_tags),
                 "Layers": [f"{diff_hex}/layer.tar"]}]
    repositories: dict[str, dict[str, str]] = {}
    for ref in repo_tags:
        repository, _, tag = ref.rpartition(":")
        repositories.setdefault(repository, {})[tag] = diff_hex
    partial = Path(f"{out}.partial")
    try:
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(diff_hex)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = mtime
            tar.addfile(info)
            _add_bytes(tar, f"{diff_hex}/VERSION", b"1.0", mtime)
            info = tarfile.TarInfo(f"{diff_hex}/layer.tar")
            info.size = layer.stat().st_size
            info.mtime = mtime
            info.mode = 0o644
            with open(layer, "rb") as data:
                tar.addfile(info, data)
            _add_bytes(tar, f"{config_hex}.json", config_bytes, mtime)
            _add_bytes(tar, "manifest.json", json.dumps(manifest).encode(), mtime)
            _add_bytes(tar, "repositories", json.dumps(repositories).encode(), mtime)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return f"sha256:{config_hex}"


@dataclass
class Archive:
    repo_tags: list[str]
    config: dict
    image_id: str
    layers: list[str]  # member names, in order
    diff_ids: list[str]


def _sha256_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    digest = hashlib.sha256()
    data = tar.extractfile(member)
    if data is None:
        raise ArchiveError(f"{member.name} is not a file")
    while chunk := data.read(CHUNK):
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def read_archive(path: Path) -> Archive:
    """Read and check a docker-archive: one manifest entry, the config named
    by its digest, every layer's sha256 equal to its diff_id. Raises
    ArchiveError otherwise."""
    with tarfile.open(path, "r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        for name in members:
            if name.startswith("/") or ".." in name.split("/"):
                raise ArchiveError(f"unsafe member name {name!r}")
        if "manifest.json" not in members:
            raise ArchiveError("no manifest.json")
        manifest = json.load(tar.extractfile(members["manifest.json"]))
        if not isinstance(manifest, list) or len(manifest) != 1:
            raise ArchiveError("manifest.json must list exactly one image")
        entry = manifest[0]
        config_name = entry.get("Config")
        if config_name not in members:
            raise ArchiveError(f"the config {config_name!r} is missing")
        config_bytes = tar.extractfile(members[config_name]).read()
        config_hex = hashlib.sha256(config_bytes).hexdigest()
        if config_name != f"{config_hex}.json":
            raise ArchiveError(f"the config's name {config_name} is not its sha256 {config_hex}")
        config = json.loads(config_bytes)
        diff_ids = config.get("rootfs", {}).get("diff_ids", [])
        layers = entry.get("Layers") or []
        if config.get("rootfs", {}).get("type") != "layers" or len(diff_ids) != len(layers) or not layers:
            raise ArchiveError(f"{len(layers)} layers in the manifest, {len(diff_ids)} diff_ids in the config")
        for layer, diff_id in zip(layers, diff_ids):
            if layer not in members:
                raise ArchiveError(f"the layer {layer} is missing")
            actual = _sha256_member(tar, members[layer])
            if actual != diff_id:
                raise ArchiveError(f"the layer {layer} has sha256 {actual}, the config says {diff_id}")
        for key in ("architecture", "os", "config"):
            if key not in config:
                raise ArchiveError(f"the config has no {key}")
        return Archive(entry.get("RepoTags") or [], config, f"sha256:{config_hex}", layers, diff_ids)


def layer_members(path: Path, layer: str) -> list[tarfile.TarInfo]:
    """The members of one layer of the archive, as tarfile reads them."""
    with tarfile.open(path, "r:") as tar:
        data = tar.extractfile(layer)
        with tarfile.open(fileobj=data, mode="r|") as inner:
            return list(inner)


def read_layer_file(path: Path, layer: str, name: str) -> bytes | None:
    """One regular file of a layer, or None when the layer has no such file."""
    with tarfile.open(path, "r:") as tar:
        data = tar.extractfile(layer)
        with tarfile.open(fileobj=data, mode="r|") as inner:
            for member in inner:
                if member.name == name and member.isreg():
                    return inner.extractfile(member).read()
    return None


def mode_string(member: tarfile.TarInfo) -> str:
    return stat.filemode(member.mode | {tarfile.DIRTYPE: stat.S_IFDIR, tarfile.SYMTYPE: stat.S_IFLNK}.get(
        member.type, stat.S_IFREG))
