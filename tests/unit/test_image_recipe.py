"""`make image` and `docker build` build the same image: hack/image reads its
recipe from the Dockerfile (imagerecipe.py), and these tests check what can
be checked without building: the Dockerfile's facts against the chart and the
package, the parser against what it must refuse, and the docker-archive
packing (dockerarchive.py) and the layer checks (verify.py) on a tiny fake
root filesystem. tests/image/test_make_image.py builds the real one."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "image"))

import build  # noqa: E402
import dockerarchive  # noqa: E402
import imagerecipe  # noqa: E402
import verify  # noqa: E402

from stalledpolicy.policy.models import DEFAULT_METRICS_PORT  # noqa: E402

CHART = REPO / "charts" / "stalledpolicy-operator"
# Debian's python3 of each suite the Dockerfile might name
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}


@pytest.fixture(scope="module")
def recipe() -> imagerecipe.Recipe:
    return imagerecipe.load()


def test_the_image_runs_as_65532_the_one_command_for_operator_and_sweeper(recipe):
    assert recipe.user == "65532:65532"
    assert recipe.entrypoint == ("stalledpolicy",)
    assert recipe.cmd == ("operator", "--all-namespaces")
    assert recipe.workdir == "/"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["stalledpolicy"] == "stalledpolicy.cli:main"


def test_the_user_line_and_the_passwd_entry_agree(recipe):
    uid, gid = recipe.user.split(":")
    run = " ".join(recipe.run)
    assert f"groupadd --gid {gid} " in run
    assert f"useradd --uid {uid} --gid {gid} " in run


def test_env_is_python_unbuffered_without_bytecode_and_the_venv_first_on_path(recipe):
    env = recipe.env_dict
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].split(":")[0] == f"{recipe.venv}/bin"
    # the rest is the debian base image's PATH, which the RUN lines of make image use too
    assert ":".join(env["PATH"].split(":")[1:]) == build.RUN_PATH


def test_exposed_ports_are_the_charts_and_the_sweepers(recipe):
    operator = yaml.safe_load((CHART / "values.yaml").read_text())["operator"]
    assert set(recipe.exposed_ports) == {f"{operator['livenessPort']}/tcp", f"{operator['metricsPort']}/tcp",
                                         f"{DEFAULT_METRICS_PORT}/tcp"}


def test_python_is_debians_of_the_suite_and_the_package_accepts_it(recipe):
    text = (REPO / "Dockerfile").read_text()
    bases = [s.base for s in imagerecipe.stages(text)]
    assert bases == [f"debian:{recipe.suite}-slim"] * 2, "both stages on the same Debian (one python3)"
    minor = DEBIAN_PYTHON[recipe.suite]
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires.startswith(">=") and tuple(map(int, minor.split("."))) >= tuple(
        map(int, requires[2:].split(".")))
    assert {"python3", "python3-venv", "ca-certificates"} <= set(recipe.packages)
    assert recipe.venv == "/opt/venv"


def test_make_image_installs_the_dockerfiles_packages_and_runs_its_lines(recipe):
    spec = build.base_spec(recipe, "amd64")
    assert spec["packages"] == sorted(recipe.packages)
    assert spec["suite"] == recipe.suite
    assert any("pip wheel" in line and recipe.wheels_dir in line for line in recipe.build_run)
    assert any(f"pip install --no-cache-dir --no-index {recipe.wheels_dir}/*.whl" in line for line in recipe.run)
    assert any(f"rm -rf {recipe.wheels_dir}" in line for line in recipe.run)
    sources = {s for sources, _ in recipe.build_sources for s in sources}
    assert sources == {"pyproject.toml", "README.md", "operator"}


def test_config_is_the_dockerfiles(recipe):
    config = recipe.docker_config()
    assert config == {
        "User": "65532:65532",
        "Env": ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"],
        "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}, "9090/tcp": {}},
        "WorkingDir": "/",
        "Entrypoint": ["stalledpolicy"],
        "Cmd": ["operator", "--all-namespaces"],
    }


def test_image_reference_is_the_charts_default():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    assert imagerecipe.chart_image() == (values["image"]["repository"], tag)
    assert imagerecipe.image_reference() == f"{values['image']['repository']}:{chart['appVersion']}"
    assert imagerecipe.project_version() == chart["appVersion"]


FINAL = """FROM debian:bookworm-slim AS build
RUN apt-get update && apt-get install -y python3
WORKDIR /src
COPY pyproject.toml ./
RUN pip wheel --wheel-dir /wheels .
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y python3
COPY --from=build /wheels /wheels
RUN python3 -m venv /opt/venv
USER 1:1
ENV A=1 \\
    # a comment inside a continued line
    B="two words"
EXPOSE 1 2/udp
WORKDIR /
ENTRYPOINT ["x"]
CMD ["y"]
"""


def test_parser_reads_continuations_comments_quotes_and_ports():
    r = imagerecipe.parse(FINAL)
    assert r.env == (("A", "1"), ("B", "two words"))
    assert r.exposed_ports == ("1/tcp", "2/udp")
    assert r.packages == ("python3",)
    assert r.build_workdir == "/src"


@pytest.mark.parametrize("change, message", [
    (("WORKDIR /\n", "WORKDIR /\nHEALTHCHECK CMD true\n"), "HEALTHCHECK"),
    (("WORKDIR /\n", "WORKDIR /\nADD x /x\n"), "ADD"),
    (('ENTRYPOINT ["x"]', "ENTRYPOINT x"), "exec form"),
    (("ENV A=1", "ENV A=$HOME"), "variable"),
    (("FROM debian:bookworm-slim\n", "FROM python:3.11-slim\n"), "debian"),
    (("COPY --from=build /wheels /wheels", "COPY --from=build /wheels /w"), "COPY"),
    (("USER 1:1\n", ""), "USER"),
    (("install -y python3\nCOPY", "install -y python3 gcc\nCOPY"), None),
])
def test_parser_refuses_what_the_builder_does_not_do(change, message):
    text = FINAL.replace(*change)
    assert text != FINAL
    if message is None:  # more packages in the final stage: fine
        imagerecipe.parse(text)
        return
    with pytest.raises(imagerecipe.RecipeError, match=message):
        imagerecipe.parse(text)


def test_build_stage_packages_must_be_in_the_base():
    text = FINAL.replace("install -y python3\nWORKDIR", "install -y python3 gcc\nWORKDIR")
    with pytest.raises(imagerecipe.RecipeError, match="gcc"):
        imagerecipe.parse(text)


# ------------------------------------------------------------- packing

def fake_rootfs(root: Path, *, bundle_extra: bytes = b"") -> Path:
    """A tiny tree shaped like the image: enough for verify.scan_layer."""
    cert = b"-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n"
    files = {
        "etc/passwd": (b"root:x:0:0:root:/root:/bin/bash\n"
                       b"stalledpolicy:x:65532:65532::/home/stalledpolicy:/usr/sbin/nologin\n"),
        "etc/group": b"root:x:0:\nstalledpolicy:x:65532:\n",
        "usr/share/ca-certificates/mozilla/A.crt": cert,
        "etc/ssl/certs/ca-certificates.crt": cert + bundle_extra,
        "usr/bin/python3.11": b"\x7fELF",
        "opt/venv/pyvenv.cfg": b"home = /usr/bin\n",
        "opt/venv/bin/pip": b"#!/opt/venv/bin/python\n",
        "opt/venv/bin/stalledpolicy": b"#!/opt/venv/bin/python\nimport sys\n",
        "dev/null-stand-in": b"the runtime mounts /dev: its contents stay out",
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for name in ("usr/bin/python3.11", "opt/venv/bin/stalledpolicy", "opt/venv/bin/pip"):
        (root / name).chmod(0o755)
    (root / "usr/bin/python3").symlink_to("python3.11")
    (root / "opt/venv/bin/python").symlink_to("/usr/bin/python3")
    os.link(root / "usr/bin/python3.11", root / "usr/bin/python3.11-hardlink")
    for name in ("proc", "sys", "tmp"):
        (root / name).mkdir()
    (root / "tmp").chmod(0o1777)
    return root


def pack(tmp_path: Path, root: Path, name: str = "image.tar", created: str = "2026-01-01T00:00:00Z"):
    layer = tmp_path / f"{name}.layer"
    diff_id, size = dockerarchive.pack_layer(root, layer)
    config = dockerarchive.image_config(diff_id=diff_id, config=imagerecipe.load().docker_config(),
                                        created=created, architecture="amd64", created_by="test")
    out = tmp_path / name
    image_id = dockerarchive.write_archive(out, layer=layer, diff_id=diff_id, config=config,
                                           repo_tags=[imagerecipe.image_reference()], mtime=1)
    return out, layer, diff_id, size, image_id


def test_docker_archive_structure_and_digests(tmp_path):
    root = fake_rootfs(tmp_path / "root")
    out, layer, diff_id, size, image_id = pack(tmp_path, root)
    assert diff_id == "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
    assert size == layer.stat().st_size
    with tarfile.open(out) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
        config_bytes = tar.extractfile(manifest[0]["Config"]).read()
        repositories = json.load(tar.extractfile("repositories"))
    hex_id = diff_id.removeprefix("sha256:")
    assert manifest == [{"Config": f"{image_id.removeprefix('sha256:')}.json",
                         "RepoTags": [imagerecipe.image_reference()], "Layers": [f"{hex_id}/layer.tar"]}]
    assert hashlib.sha256(config_bytes).hexdigest() == image_id.removeprefix("sha256:")
    assert set(names) == {hex_id, f"{hex_id}/VERSION", f"{hex_id}/layer.tar", manifest[0]["Config"],
                          "manifest.json", "repositories"}
    repository, tag = imagerecipe.chart_image()
    assert repositories == {repository: {tag: hex_id}}
    config = json.loads(config_bytes)
    assert config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]}
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    archive = dockerarchive.read_archive(out)
    assert archive.diff_ids == [diff_id] and archive.image_id == image_id
    assert verify.check_config(archive, imagerecipe.load(), imagerecipe.image_reference()) == []


def test_layer_is_sorted_numeric_and_keeps_links_but_not_dev(tmp_path):
    root = fake_rootfs(tmp_path / "root")
    _, layer, *_ = pack(tmp_path, root)
    with tarfile.open(layer) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert "dev" in names and "dev/null-stand-in" not in names
    assert all(m.uname == "" and m.gname == "" for m in members)
    by_name = {m.name: m for m in members}
    assert by_name["usr/bin/python3"].issym() and by_name["usr/bin/python3"].linkname == "python3.11"
    links = [m for m in members if m.islnk()]
    assert len(links) == 1 and links[0].linkname in {"usr/bin/python3.11", "usr/bin/python3.11-hardlink"}
    assert by_name["opt/venv/bin/stalledpolicy"].mode & 0o777 == 0o755
    assert by_name["tmp"].mode & 0o7777 == 0o1777
    # depth first, each directory's entries sorted: a parent before its children
    for i, name in enumerate(names):
        if "/" in name:
            assert name.rsplit("/", 1)[0] in names[:i]
        siblings = [n for n in names
                    if n.rsplit("/", 1)[0] == name.rsplit("/", 1)[0] and n.count("/") == name.count("/")]
        assert siblings == sorted(siblings)


def test_packing_is_deterministic(tmp_path):
    root = fake_rootfs(tmp_path / "root")
    first = pack(tmp_path, root, "a.tar")
    second = pack(tmp_path, root, "b.tar")
    assert first[0].read_bytes() == second[0].read_bytes()
    assert first[2] == second[2] and first[4] == second[4]


def test_a_changed_layer_is_refused(tmp_path):
    root = fake_rootfs(tmp_path / "root")
    out, layer, diff_id, *_ = pack(tmp_path, root)
    data = bytearray(out.read_bytes())
    # flip a byte inside the layer's contents (the fake python binary's "ELF")
    at = data.find(b"\x7fELF")
    data[at + 1] ^= 0xFF
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(dockerarchive.ArchiveError, match="sha256"):
        dockerarchive.read_archive(bad)


def _scan(tmp_path: Path, root: Path) -> list[str]:
    out, *_ = pack(tmp_path, root)
    archive = dockerarchive.read_archive(out)
    problems, _ = verify.scan_layer(out, archive.layers[0], imagerecipe.load())
    if os.geteuid() != 0:  # the fake tree is owned by whoever runs the test
        problems = [p for p in problems if "owned by uid" not in p and "has gid" not in p]
    return problems


def test_layer_checks_pass_on_a_sane_tree(tmp_path):
    assert _scan(tmp_path, fake_rootfs(tmp_path / "root")) == []


def test_layer_checks_find_build_leftovers_foreign_certificates_and_compilers(tmp_path):
    root = fake_rootfs(tmp_path / "root",
                       bundle_extra=b"-----BEGIN CERTIFICATE-----\nWFla\n-----END CERTIFICATE-----\n")
    (root / "wheels").mkdir()
    (root / "usr/bin/gcc-12").write_bytes(b"")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "opt/venv/bin/stalledpolicy").unlink()
    (root / "etc/world").write_bytes(b"")
    (root / "etc/world").chmod(0o666)
    problems = " | ".join(_scan(tmp_path, root))
    for expected in ("left from the build: /wheels", "not Debian's", "compiler or build tool: usr/bin/gcc-12",
                     "no user 65532", "entrypoint stalledpolicy is on none", "etc/world is world-writable"):
        assert expected in problems


def test_chroot_runs_in_namespaces_of_its_own_without_network():
    argv = build.chroot_argv(Path("/r"), ["true"])
    assert argv[:1] == ["unshare"] and {"--mount", "--pid", "--net", "--fork", "--kill-child"} <= set(argv)
    assert "--mount-proc=/r/proc" in argv
    assert "--net" not in build.chroot_argv(Path("/r"), ["true"], network=True)


def test_remove_tree_refuses_a_tree_with_a_mount_inside(tmp_path, monkeypatch):
    target = tmp_path / "rootfs"
    (target / "proc").mkdir(parents=True)
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/self/mountinfo":
            return io.StringIO(f"36 35 0:5 / {target}/proc rw - proc proc rw\n")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    with pytest.raises(build.BuildError, match="mounted inside"):
        build.remove_tree(target)
    assert target.exists()
