#!/usr/bin/env python3
"""Checks of an image tarball that `make image` wrote (build.py runs them).

1. The archive: one image, the config named by its digest, each layer's
   sha256 equal to its diff_id (dockerarchive.read_archive); tagged as the
   chart's default image.
2. The config: User, Env, ExposedPorts, WorkingDir, Entrypoint and Cmd as the
   Dockerfile says; linux.
3. The layer's files: Python and the venv are there, the entrypoint is on the
   image's PATH, everything is owned by root (system groups only), nothing is
   world-writable but sticky directories, no compiler, the image's user in
   /etc/passwd, nothing left from the build (the wheels, pip's cache,
   mmdebstrap's apt settings, the host's resolv.conf) and no CA certificate
   that Debian's ca-certificates did not bring (the host's own, which the
   build's pip used, above all).
4. The image runs: the layer is unpacked and its entrypoint is run in a chroot
   as the image's user, in new mount, PID and network namespaces:
   `stalledpolicy --help`, `--version`, `sweep --help`, `operator --help`,
   `morgue --help`, the imports of the operator's and the sweeper's modules,
   the uid, and a write to / refused.

5. With --containerd: a throwaway containerd (Debian's, its own root, state
   and socket in a temporary directory; stopped with SIGTERM after) imports
   the tarball as `ctr -n k8s.io images import` does for a node, and runs the
   image with runc: `stalledpolicy --version`, and the uid, gid and effective
   capabilities of its process (65532, 65532, none).

Usage: verify.py [TARBALL]   (default: build/image/stalledpolicy-operator-<version>.tar)
       verify.py --no-run    (1 to 3 only: needs no root)
       verify.py --containerd
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dockerarchive  # noqa: E402
import imagerecipe  # noqa: E402

COMPILER = re.compile(r"usr/(local/)?bin/([a-z0-9_]+-linux-gnu-)?(gcc|g\+\+|cc|c\+\+|cpp|clang|ld|as|make)(-[0-9.]+)?")
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
BUILD_LEFTOVERS = ("root/.cache", "etc/pip.conf", "etc/apt/apt.conf.d/99mmdebstrap", "etc/resolv.conf",
                   "etc/ssl/build-host-ca.crt")
# The CLI modules and what they import when they run.
IMPORTS = ("stalledpolicy.cli, stalledpolicy.controller.cli, stalledpolicy.sweeper.cli, "
           "stalledpolicy.morgue.cli, kopf, kubernetes, redis, pydantic, prometheus_client, yaml")


class VerifyError(AssertionError):
    pass


def _stderr(message: str) -> None:
    print(f"image verify: {message}", file=sys.stderr, flush=True)


def _certs(data: bytes) -> set[bytes]:
    return {b"".join(block.split()) for block in PEM.findall(data)}


def check_config(archive: dockerarchive.Archive, recipe: imagerecipe.Recipe, reference: str) -> list[str]:
    problems = []
    if archive.repo_tags != [reference]:
        problems.append(f"tagged {archive.repo_tags}, the chart runs {reference}")
    config = archive.config
    if config.get("os") != "linux":
        problems.append(f"os {config.get('os')!r}")
    want = recipe.docker_config()
    for key, value in want.items():
        if config["config"].get(key) != value:
            problems.append(f"config {key} is {config['config'].get(key)!r}, the Dockerfile says {value!r}")
    return problems


def scan_layer(path: Path, layer: str, recipe: imagerecipe.Recipe) -> tuple[list[str], dict]:
    """Problems with the layer's files, and facts found on the way."""
    problems: list[str] = []
    members: dict[str, tarfile.TarInfo] = {}
    wanted_exact = {"etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"}
    contents: dict[str, bytes] = {}
    debian_certs: set[bytes] = set()
    setuid: list[str] = []
    path_dirs = [d.strip("/") for d in recipe.env_dict.get("PATH", "").split(":") if d]
    entry_candidates = {f"{d}/{recipe.entrypoint[0]}" for d in path_dirs}
    with tarfile.open(path, "r:") as outer:
        with tarfile.open(fileobj=outer.extractfile(layer), mode="r|") as tar:
            for m in tar:
                name = m.name
                if name.startswith("/") or ".." in name.split("/"):
                    problems.append(f"unsafe name {name!r}")
                if name in members:
                    problems.append(f"{name} is in the layer twice")
                members[name] = m
                if m.uid != 0:
                    problems.append(f"{name} is owned by uid {m.uid}")
                if m.gid >= 1000:
                    problems.append(f"{name} has gid {m.gid}")
                if m.isreg() and m.mode & 0o002:
                    problems.append(f"{name} is world-writable")
                if m.isdir() and m.mode & 0o002 and not m.mode & 0o1000:
                    problems.append(f"{name}/ is world-writable without the sticky bit")
                if m.isreg() and m.mode & 0o6000:
                    setuid.append(name)
                if m.ischr() or m.isblk():
                    problems.append(f"{name} is a device node")
                if COMPILER.fullmatch(name):
                    problems.append(f"a compiler or build tool: {name}")
                if m.isreg() and (name in wanted_exact or name in entry_candidates):
                    contents[name] = tar.extractfile(m).read()
                elif m.isreg() and name.startswith("usr/share/ca-certificates/") and name.endswith(".crt"):
                    debian_certs |= _certs(tar.extractfile(m).read())
    facts: dict = {"files": len(members), "setuid": setuid}

    def need(name: str, what: str) -> tarfile.TarInfo | None:
        if name not in members:
            problems.append(f"no {what} ({name})")
            return None
        return members[name]

    python = need("usr/bin/python3", "Debian's python3")
    if python is not None and python.issym():
        facts["python3"] = python.linkname
    venv = recipe.venv.strip("/")
    need(f"{venv}/bin/python", "venv python")
    need(f"{venv}/pyvenv.cfg", "venv")
    entry = next((f"{d}/{recipe.entrypoint[0]}" for d in path_dirs if f"{d}/{recipe.entrypoint[0]}" in members), None)
    if entry is None:
        problems.append(f"the entrypoint {recipe.entrypoint[0]} is on none of PATH's directories {path_dirs}")
    else:
        facts["entrypoint"] = "/" + entry
        m = members[entry]
        if not m.isreg() or not m.mode & 0o001:
            problems.append(f"/{entry} is not a file that anyone may run")
        else:
            shebang = contents[entry].split(b"\n", 1)[0].decode()
            interpreter = shebang[2:].split()[0] if shebang.startswith("#!") else ""
            if interpreter.strip("/") not in members:
                problems.append(f"/{entry} runs {interpreter!r}, which is not in the image")
    for d in dockerarchive.EMPTY_DIRS:
        if d not in members or not members[d].isdir():
            problems.append(f"no /{d} directory")
        elif any(n.startswith(d + "/") for n in members):
            problems.append(f"/{d} is not empty")
    wheels = recipe.wheels_dir.strip("/")
    for leftover in (wheels, *BUILD_LEFTOVERS):
        if leftover in members:
            problems.append(f"left from the build: /{leftover}")
    local_certs = [n for n in members if n.startswith("usr/local/share/ca-certificates/")]
    if local_certs:
        problems.append(f"local CA certificates in the image: {local_certs}")
    if f"{venv}/bin/pip" not in members:
        problems.append(f"no pip in {recipe.venv} (the Dockerfile's image has one)")

    uid, _, gid = recipe.user.partition(":")
    passwd = contents.get("etc/passwd", b"").decode()
    users = [line.split(":") for line in passwd.splitlines() if line.count(":") == 6]
    user = next((u for u in users if u[2] == uid), None)
    if user is None:
        problems.append(f"no user {uid} in /etc/passwd")
    else:
        facts["user"] = f"{user[0]} {user[2]}:{user[3]} {user[6]}"
        if gid and user[3] != gid:
            problems.append(f"user {uid}'s group is {user[3]}, USER says {gid}")

    bundle = contents.get("etc/ssl/certs/ca-certificates.crt")
    if bundle is None:
        problems.append("no CA bundle /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates)")
    else:
        certs = _certs(bundle)
        foreign = certs - debian_certs
        facts["ca_certificates"] = len(certs)
        if foreign:
            problems.append(f"the CA bundle has {len(foreign)} certificate(s) that are not Debian's")
        host_local = set()
        for crt in Path("/usr/local/share/ca-certificates").rglob("*.crt"):
            try:
                host_local |= _certs(crt.read_bytes())
            except OSError:
                pass
        if host_local & certs:
            problems.append("the CA bundle has the build host's own CA certificate(s)")
    return problems, facts


def _remove(path: Path) -> None:
    with open("/proc/self/mountinfo") as info:
        busy = [line.split()[4] for line in info if line.split()[4].startswith(str(path))]
    if busy:
        raise VerifyError(f"not removing {path}: mounted inside it: {busy}")
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=True)


def run_checks(path: Path, archive: dockerarchive.Archive, recipe: imagerecipe.Recipe, version: str,
               log) -> list[str]:
    """Unpack the layer and run the image's entrypoint in it as its user."""
    problems = []
    env = dict(item.split("=", 1) for item in archive.config["config"]["Env"])
    entrypoint = archive.config["config"]["Entrypoint"]
    userspec = archive.config["config"]["User"]
    workdir = Path(tempfile.mkdtemp(prefix="stalledpolicy-image-verify-"))
    try:
        root = workdir / "root"
        root.mkdir()
        t = time.monotonic()
        with tarfile.open(path, "r:") as outer:
            with tarfile.open(fileobj=outer.extractfile(archive.layers[0]), mode="r|") as tar:
                tar.extractall(root, numeric_owner=True, filter="fully_trusted")
        log(f"unpacked the layer in {time.monotonic() - t:.1f}s")

        def image_run(args: list[str], expect_ok: bool = True) -> str:
            argv = ["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child",
                    f"--mount-proc={root / 'proc'}", "chroot", f"--userspec={userspec}", str(root), *args]
            try:
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=root)
            except subprocess.TimeoutExpired:
                problems.append(f"{' '.join(args)}: no answer in 120 s")
                return ""
            if (done.returncode == 0) != expect_ok:
                problems.append(f"{' '.join(args)} exited {done.returncode}: {(done.stderr or done.stdout)[-400:]}")
            return done.stdout

        out = image_run([*entrypoint, "--help"])
        for command in ("sweep", "operator", "morgue"):
            if command not in out:
                problems.append(f"stalledpolicy --help does not list {command}")
            image_run([*entrypoint, command, "--help"])
        out = image_run([*entrypoint, "--version"])
        if version not in out:
            problems.append(f"stalledpolicy --version says {out.strip()!r}, not {version}")
        out = image_run(["python3", "-c", f"import os, sys, {IMPORTS}; print(os.getuid(), os.getgid(), sys.prefix)"])
        uid, _, gid = userspec.partition(":")
        if out.split()[:2] != [uid, gid or uid]:
            problems.append(f"ran as {out.split()[:2]}, not {userspec}")
        if out.split()[2:3] != [recipe.venv]:
            problems.append(f"python3 on PATH is {out.split()[2:3]}, not the venv's {recipe.venv}")
        image_run(["/bin/sh", "-c", f"touch /x || touch {recipe.venv}/x"], expect_ok=False)
        log(f"ran stalledpolicy --help/--version, sweep/operator/morgue --help and the imports as {userspec}")
    finally:
        _remove(workdir)
    return problems


def containerd_check(path: Path, reference: str, userspec: str, version: str, log) -> list[str]:
    """Import the tarball into a throwaway containerd and run it with runc."""
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return [f"--containerd: {tool} is not installed (apt-get install containerd)"]
    problems: list[str] = []
    home = Path(tempfile.mkdtemp(prefix="stalledpolicy-containerd-"))
    sock = home / "containerd.sock"
    (home / "config.toml").write_text(
        f'version = 2\nroot = "{home}/root"\nstate = "{home}/state"\n'
        f'[grpc]\n  address = "{sock}"\n'
        '[plugins."io.containerd.grpc.v1.cri"]\n  disable_tcp_service = true\n')
    with open(home / "containerd.log", "w") as out:
        daemon = subprocess.Popen(["containerd", "--config", str(home / "config.toml")], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                return [f"containerd did not start: {(home / 'containerd.log').read_text()[-400:]}"]
            time.sleep(0.2)
        t = time.monotonic()
        done = subprocess.run([*ctr, "images", "import", "--snapshotter", "native", str(path)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return [f"ctr images import exited {done.returncode}: {done.stderr[-400:]}"]
        listed = subprocess.run([*ctr, "images", "ls", "--quiet"], capture_output=True, text=True).stdout.split()
        if reference not in listed:
            problems.append(f"ctr images ls has no {reference}: {listed}")
        log(f"ctr images import: {time.monotonic() - t:.1f}s")
        probe = ("import os; s = open('/proc/self/status').read(); "
                 "print(os.getuid(), os.getgid(), s.split('CapEff:')[1].split()[0])")
        for name, args, want in (("version", ["stalledpolicy", "--version"], f"stalledpolicy {version}"),
                                 ("ids", ["python3", "-c", probe], f"{userspec.replace(':', ' ')} 0000000000000000")):
            done = subprocess.run([*ctr, "run", "--rm", "--snapshotter", "native", reference,
                                   f"verify-{os.getpid()}-{name}", *args],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0 or done.stdout.strip() != want:
                problems.append(f"ctr run {' '.join(args)}: exit {done.returncode}, "
                                f"{done.stdout.strip()!r} (wanted {want!r}) {done.stderr[-300:]}")
        log(f"ctr run (runc): stalledpolicy --version, and uid/gid/CapEff {userspec} 0")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        _remove(home)
    return problems


def verify(path: Path, *, log=_stderr, run: bool = True, containerd: bool = False,
           repo: Path = imagerecipe.REPO) -> dict:
    t = time.monotonic()
    recipe = imagerecipe.load(repo)
    reference = imagerecipe.image_reference(repo)
    version = imagerecipe.project_version(repo)
    archive = dockerarchive.read_archive(path)
    problems = check_config(archive, recipe, reference)
    if len(archive.layers) != 1:
        problems.append(f"{len(archive.layers)} layers, make image writes one")
    layer_problems, facts = scan_layer(path, archive.layers[0], recipe)
    problems += layer_problems
    log(f"archive, config and {facts['files']} files checked in {time.monotonic() - t:.1f}s: "
        f"{reference} {archive.image_id[:19]}, user {facts.get('user')}, entrypoint {facts.get('entrypoint')}, "
        f"{facts.get('ca_certificates')} Debian CA certificates, {len(facts['setuid'])} setuid/setgid files")
    if run and not problems:
        problems += run_checks(path, archive, recipe, version, log)
    if containerd and not problems:
        problems += containerd_check(path, reference, recipe.user, version, log)
    if problems:
        raise VerifyError("; ".join(problems))
    log(f"all checks passed in {time.monotonic() - t:.1f}s")
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check an image tarball written by make image.")
    parser.add_argument("tarball", nargs="?")
    parser.add_argument("--no-run", action="store_true", help="do not unpack and run the image (no root needed)")
    parser.add_argument("--containerd", action="store_true",
                        help="also import it into a throwaway containerd and run it with runc")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    path = Path(args.tarball) if args.tarball else (
        imagerecipe.REPO / "build" / "image" / f"stalledpolicy-operator-{imagerecipe.project_version()}.tar")
    try:
        verify(path, run=not args.no_run, containerd=args.containerd)
    except (VerifyError, dockerarchive.ArchiveError) as exc:
        _stderr(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
