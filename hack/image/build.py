#!/usr/bin/env python3
"""`make image`: the product's image without a container engine or a registry.

The Dockerfile's final stage is the recipe (imagerecipe.py):

1. a Debian root filesystem of the stage's suite with the packages of its
   apt-get line, from mmdebstrap (minbase, with debian:*-slim's path
   excludes), cached under ${STALLEDPOLICY_CACHE:-~/.cache/stalledpolicy}/image/;
2. the build stage, done as the Dockerfile does it: its COPY lines (from the
   work tree, without caches), then its RUN line (a venv, pip wheel) in a
   chroot of a second copy of that root filesystem, with the host's network,
   resolver and CA bundle (pip reaches PyPI through a proxy that only the
   host's bundle trusts). That copy is thrown away: the final root filesystem
   gets the wheels only, and never sees the host's CA bundle;
3. the stage's other RUN lines, run as they are with /bin/sh in a chroot of a
   copy of that root filesystem, in new mount, PID and network namespaces
   (no network: pip installs from the wheels only);
4. one layer, packed with tarfile, and a docker-archive with the config that
   USER, ENV, EXPOSE, WORKDIR, ENTRYPOINT and CMD give, tagged as the chart's
   default image (values.yaml image.repository, Chart.yaml appVersion);
5. verify.py's checks, unless --no-verify.

Writes build/image/stalledpolicy-operator-<version>.tar (and a .json beside
it saying what is in it) and prints its path on stdout, last. When nothing it
is built from changed (the Dockerfile, pyproject.toml, README.md, operator/,
the chart's image settings, hack/image/, the cached root filesystem), it
builds nothing; --force builds anyway (say, for newer dependency releases).

Needs root (mmdebstrap's root mode, chroot), mmdebstrap, and the Debian
mirror and PyPI as the machine's apt and pip reach them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dockerarchive  # noqa: E402
import imagerecipe  # noqa: E402
import verify  # noqa: E402

REPO = imagerecipe.REPO
# Bump when what the base or the build does changes, so that caches and images
# built the old way are rebuilt.
BASE_RECIPE = 1
BUILD_RECIPE = 1
# The path excludes of Debian's official *-slim images (debuerreotype's slimify):
# no manuals, documentation (but the copyright files), info pages or translations.
SLIM_DPKG_OPTS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
)
# PATH of a RUN line in the Dockerfile's debian base (the base image's ENV)
RUN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ARCHITECTURES = ("amd64", "arm64")

_t0 = time.monotonic()


def log(message: str) -> None:
    print(f"image build [{time.monotonic() - _t0:5.1f}s]: {message}", file=sys.stderr, flush=True)


class BuildError(RuntimeError):
    pass


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)


def run(argv: list[str], *, env: dict[str, str] | None = None, capture: bool = False,
        cwd: Path | None = None) -> str:
    """Run a command in its own session; if we are stopped (SIGTERM, ^C), end
    its whole process group (ours: we started it) and wait for it."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                            stdout=subprocess.PIPE if capture else sys.stderr, text=True)
    try:
        out, _ = proc.communicate()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        raise
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''} exited {proc.returncode}")
    return out or ""


def mounts_under(path: Path) -> list[str]:
    """Mount points of this mount namespace at or below path."""
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def remove_tree(path: Path) -> None:
    """rm -rf that refuses to touch a tree with something mounted in it."""
    if not path.exists() and not path.is_symlink():
        return
    busy = mounts_under(path)
    if busy:
        raise BuildError(f"not removing {path}: mounted inside it: {', '.join(busy)}")
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=True)


@contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {path}: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def host_architecture() -> str:
    return run(["dpkg", "--print-architecture"], capture=True).strip()


def mirrors(suite: str) -> list[str]:
    debian = os.environ.get("STALLEDPOLICY_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    security = os.environ.get("STALLEDPOLICY_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
    return [f"deb {debian} {suite} main", f"deb {debian} {suite}-updates main",
            f"deb {security} {suite}-security main"]


# ---------------------------------------------------------------- the base

def base_spec(recipe: imagerecipe.Recipe, arch: str) -> dict:
    return {"recipe": BASE_RECIPE, "suite": recipe.suite, "packages": sorted(recipe.packages),
            "architecture": arch, "mirrors": mirrors(recipe.suite), "dpkgopts": list(SLIM_DPKG_OPTS)}


def ensure_base(cache: Path, recipe: imagerecipe.Recipe, arch: str, refresh: bool) -> tuple[Path, str]:
    """The cached root filesystem, built when missing. Returns (rootfs, marker text)."""
    spec = base_spec(recipe, arch)
    key = sha256_json(spec)[:16]
    bases = cache / "image" / "base"
    home = bases / key
    rootfs, marker = home / "rootfs", home / "complete"
    with locked(bases / ".lock"):
        if refresh:
            marker.unlink(missing_ok=True)
        if marker.is_file() and rootfs.is_dir():
            log(f"base root filesystem: cached in {rootfs}")
            return rootfs, marker.read_text()
        for old in bases.iterdir():  # bases of other recipes: rebuilt if ever wanted again
            if old.is_dir() and old.name != key:
                log(f"removing an old base {old}")
                remove_tree(old)
        remove_tree(home)
        partial = home / "rootfs.partial"
        partial.parent.mkdir(parents=True)
        started = time.monotonic()
        log(f"base root filesystem: mmdebstrap {recipe.suite} minbase + {', '.join(recipe.packages)}")
        # In a mount namespace of its own: whatever mmdebstrap mounts in the
        # chroot (proc, sys, dev) goes away with it, even if it is killed.
        argv = ["unshare", "--mount", "--propagation", "private", "mmdebstrap", "--mode=root",
                "--variant=minbase", f"--architectures={arch}", "--quiet",
                f"--include={','.join(recipe.packages)}",
                # the mirror may be a dated snapshot whose Release files are past Valid-Until
                "--aptopt=Acquire::Check-Valid-Until \"false\""]
        argv += [f"--dpkgopt={opt}" for opt in SLIM_DPKG_OPTS]
        argv += [recipe.suite, str(partial), *mirrors(recipe.suite)]
        run(argv)
        # what mmdebstrap brought from the host or kept for its own run
        for name in ("etc/apt/apt.conf.d/99mmdebstrap", "etc/resolv.conf", "etc/hostname"):
            (partial / name).unlink(missing_ok=True)
        for rel in ("tmp", "var/tmp", "var/cache/apt/archives/partial", "var/lib/apt/lists/partial"):
            d = partial / rel
            if d.is_dir():
                for child in d.iterdir():
                    remove_tree(child)
        partial.rename(rootfs)
        text = (f"{sha256_json(spec)}\n{json.dumps(spec)}\n"
                f"built={dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ} "
                f"seconds={time.monotonic() - started:.0f}\n")
        marker.write_text(text)
        log(f"base root filesystem: built in {time.monotonic() - started:.0f}s")
        return rootfs, text


# ---------------------------------------------------------------- the build stage

def _ignore(_dir, names):
    return {n for n in names if n in {"__pycache__", "build", "dist"} or n.endswith((".egg-info", ".pyc"))}


def host_ca_bundle() -> Path:
    """The CA bundle the host's pip trusts (the registries are reached through
    a proxy that the host trusts; Debian's bundle alone fails there)."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      ssl.get_default_verify_paths().cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise BuildError("no CA bundle on the host for pip (set PIP_CERT)")


def network_env() -> dict[str, str]:
    """How the host's pip reaches its index, for pip in the build chroot:
    proxies and index settings from the environment and pip's config (not its
    find-links, which are paths on the host)."""
    env = {key: value for key, value in os.environ.items()
           if key.lower() in {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
           or key in {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT"}}
    try:
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in {"index-url", "extra-index-url", "trusted-host"}:
            env.setdefault("PIP_" + name.upper().replace("-", "_"), value.strip().strip("'\""))
    return env


def build_stage(recipe: imagerecipe.Recipe, base: Path, work: Path, rootfs: Path) -> list[str]:
    """The Dockerfile's build stage in a chroot of a second copy of the base:
    its COPY lines from the repository (no caches or build leftovers), its RUN
    lines as they are, with the host's network, resolver and CA bundle. That
    copy is thrown away; the final root filesystem gets only the wheels
    (COPY --from=build). Returns the wheels' names."""
    build_root = work / "build-root"
    run(["cp", "-a", "--", str(base), str(build_root)])
    workdir = build_root / recipe.build_workdir.lstrip("/")
    workdir.mkdir(parents=True, exist_ok=True)
    for sources, dest in recipe.build_sources:  # Docker's COPY: a directory's contents go to dest
        target = workdir / dest
        for source in sources:
            origin = REPO / source
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=_ignore, dirs_exist_ok=True)
            elif dest.endswith("/") or len(sources) > 1:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target / origin.name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
    ca = "/etc/ssl/build-host-ca.crt"
    shutil.copyfile(host_ca_bundle(), build_root / ca.lstrip("/"))
    shutil.copyfile("/etc/resolv.conf", build_root / "etc/resolv.conf")
    env = run_env({"PIP_CERT": ca, "SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, **network_env()})
    for command in recipe.build_run:
        log(f"build stage: RUN {command}")
        run(chroot_argv(build_root, ["/bin/sh", "-c", f"cd {shlex.quote(recipe.build_workdir)} && {command}"],
                        network=True), env=env)
    built = build_root / recipe.wheels_dir.lstrip("/")
    names = sorted(p.name for p in built.glob("*.whl"))
    if not names:
        raise BuildError(f"the build stage left no wheels in {recipe.wheels_dir}")
    sdist_built = [n for n in names if not re.search(r"-(py3|py2\.py3|cp3\d+)-(none|abi3|cp3\d+)-", n)]
    if sdist_built:
        log(f"note: wheels of unusual tags {sdist_built}")
    shutil.copytree(built, rootfs / recipe.wheels_dir.lstrip("/"))
    remove_tree(build_root)
    log(f"build stage: {len(names)} wheels ({', '.join(n.split('-')[0] for n in names[:6])}, ...)")
    return names


# ---------------------------------------------------------------- the chroot

def chroot_argv(rootfs: Path, argv: list[str], *, userspec: str | None = None,
                network: bool = False) -> list[str]:
    """argv run in a chroot of rootfs, in new mount and PID namespaces (a proc
    of its own, gone when it ends) and, unless network, a new network
    namespace (no network at all)."""
    chroot = ["chroot"] + ([f"--userspec={userspec}"] if userspec else []) + [str(rootfs)]
    return ["unshare", "--mount", "--pid", *([] if network else ["--net"]), "--fork", "--kill-child",
            f"--mount-proc={rootfs / 'proc'}", *chroot, *argv]


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # what pip prints, less: no progress bars, no notice of a newer pip
    env = {"PATH": RUN_PATH, "HOME": "/root", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off",
           "PIP_QUIET": "1"}
    env.update(extra or {})
    return env


def tidy(rootfs: Path, recipe: imagerecipe.Recipe) -> None:
    remove_tree(rootfs / recipe.wheels_dir.lstrip("/"))
    remove_tree(rootfs / "root/.cache")
    for rel in ("tmp", "var/tmp"):
        for child in (rootfs / rel).iterdir():
            remove_tree(child)


# ---------------------------------------------------------------- inputs

def input_files() -> list[Path]:
    files = [REPO / "Dockerfile", REPO / "pyproject.toml", REPO / "README.md",
             imagerecipe.CHART / "Chart.yaml", imagerecipe.CHART / "values.yaml"]
    files += sorted(p for p in (REPO / "hack" / "image").glob("*.py"))
    for top in ("operator",):
        for path in sorted((REPO / top).rglob("*")):
            rel = path.relative_to(REPO).parts
            if path.is_file() and not any(part == "__pycache__" or part.endswith(".egg-info") for part in rel):
                files.append(path)
    return files


def inputs_fingerprint(base_marker: str) -> str:
    digest = hashlib.sha256(f"recipe={BUILD_RECIPE}\n{base_marker}".encode())
    for path in input_files():
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def created_time() -> tuple[str, int]:
    """The image's creation time: SOURCE_DATE_EPOCH, else HEAD's commit time."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        try:
            epoch = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            epoch = str(int(time.time()))
    seconds = int(epoch)
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), seconds


# ---------------------------------------------------------------- main

def build(args) -> Path:
    if os.geteuid() != 0:
        raise BuildError("needs root: mmdebstrap's root mode and chroot (run make image as root)")
    for tool in ("mmdebstrap", "unshare", "chroot"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed (bash hack/install-system-packages.sh installs mmdebstrap)")
    recipe = imagerecipe.load()
    version = imagerecipe.project_version()
    reference = imagerecipe.image_reference()
    arch = host_architecture()
    if arch not in ARCHITECTURES:
        raise BuildError(f"architecture {arch} is not supported")
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"stalledpolicy-operator-{version}.tar"
    info_path = Path(f"{out}.json")
    cache = Path(args.cache)
    seconds: dict[str, float] = {}

    t = time.monotonic()
    base, base_marker = ensure_base(cache, recipe, arch, args.refresh_base)
    seconds["base"] = time.monotonic() - t
    fingerprint = inputs_fingerprint(base_marker)
    if not args.force and out.is_file() and info_path.is_file():
        try:
            if json.loads(info_path.read_text()).get("inputs") == fingerprint:
                log(f"up to date: {out} ({reference}); --force rebuilds")
                return out
        except json.JSONDecodeError:
            pass

    with locked(out_dir / ".build.lock"):
        work = Path(tempfile.mkdtemp(prefix="work-", dir=cache / "image"))
        try:
            rootfs = work / "rootfs"
            t = time.monotonic()
            run(["cp", "-a", "--", str(base), str(rootfs)])
            seconds["copy_base"] = time.monotonic() - t

            t = time.monotonic()
            wheels = build_stage(recipe, base, work, rootfs)
            seconds["wheels"] = time.monotonic() - t

            t = time.monotonic()
            for command in recipe.run:
                log(f"RUN {command}")
                run(chroot_argv(rootfs, ["/bin/sh", "-c", command]), env=run_env())
            venv_python = f"{recipe.venv}/bin/python"
            python_version = run(chroot_argv(rootfs, [venv_python, "-c",
                                                      "import platform; print(platform.python_version())"]),
                                 env=run_env(), capture=True).strip()
            freeze = run(chroot_argv(rootfs, [venv_python, "-m", "pip", "list", "--format=freeze"]),
                         env={k: v for k, v in run_env().items() if k != "PIP_QUIET"}, capture=True).splitlines()
            tidy(rootfs, recipe)
            seconds["install"] = time.monotonic() - t

            t = time.monotonic()
            layer = work / "layer.tar"
            diff_id, layer_bytes = dockerarchive.pack_layer(rootfs, layer)
            created, epoch = created_time()
            repository, tag = imagerecipe.chart_image()
            config = dockerarchive.image_config(
                diff_id=diff_id, config=recipe.docker_config(), created=created, architecture=arch,
                created_by=f"hack/image/build.py (Debian {recipe.suite} by mmdebstrap, the Dockerfile's final stage)",
                labels={"org.opencontainers.image.title": "stalledpolicy-operator",
                        "org.opencontainers.image.version": version,
                        "org.opencontainers.image.source": "https://github.com/stalledpolicy/stalledpolicy-operator"})
            image_id = dockerarchive.write_archive(out, layer=layer, diff_id=diff_id, config=config,
                                                   repo_tags=[reference], mtime=epoch)
            seconds["pack"] = time.monotonic() - t
        finally:
            remove_tree(work)

    info = {"image": reference, "archive": out.name, "image_id": image_id, "diff_id": diff_id,
            "layer_bytes": layer_bytes, "archive_bytes": out.stat().st_size, "python": python_version,
            "debian": recipe.suite, "debian_packages": list(recipe.packages), "wheels": wheels,
            "pip_freeze": freeze, "inputs": fingerprint,
            "seconds": {k: round(v, 1) for k, v in seconds.items()}}
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    log(f"wrote {out}: {reference}, {image_id[:19]}, layer {layer_bytes / 1e6:.0f} MB, Python {python_version}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(REPO / "build" / "image"), help="directory of the tarball")
    parser.add_argument("--cache",
                        default=os.environ.get("STALLEDPOLICY_CACHE", str(Path.home() / ".cache" / "stalledpolicy")))
    parser.add_argument("--force", action="store_true", help="build even when nothing changed")
    parser.add_argument("--refresh-base", action="store_true", help="rebuild the cached Debian root filesystem too")
    parser.add_argument("--no-verify", action="store_true", help="skip verify.py's checks")
    parser.add_argument("--containerd", action="store_true",
                        help="verify.py --containerd: import into a throwaway containerd and run with runc too")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        out = build(args)
        if not args.no_verify:
            verify.verify(out, log=log, containerd=args.containerd)
    except (BuildError, imagerecipe.RecipeError, dockerarchive.ArchiveError) as exc:
        log(f"error: {exc}")
        return 1
    except Exception as exc:  # verify's failures among them
        if type(exc).__name__ != "VerifyError":
            raise
        log(f"error: the image failed its checks: {exc}")
        return 1
    log("done")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
