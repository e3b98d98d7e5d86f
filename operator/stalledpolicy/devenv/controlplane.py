"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and
kube-controller-manager, built from Go modules by ``hack/control-plane/build.sh``.

One implementation for the tests (``tests/kube_fixtures.py``), the demo and people
(``hack/control-plane/up.sh`` -> ``python -m stalledpolicy.devenv.controlplane up``)::

    plane = ControlPlane()          # a fresh temporary state directory
    plane.start()                   # returns once /readyz answers ok
    client = plane.api_client()     # kubernetes.client.ApiClient, admin (system:masters)
    plane.stop()                    # no process left, state directory removed

There is no kubelet and no scheduler: objects are stored, validated, admitted,
authorised and garbage-collected, Deployments get ReplicaSets and Pods, but no
container ever runs.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import datetime
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from stalledpolicy.devenv.ports import free_port

BIN_DIR_ENV = "STALLEDPOLICY_K8S_BIN"
"""Use the binaries in this directory instead of building into the cache."""

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")
HACK_DIR = Path(__file__).resolve().parents[3] / "hack" / "control-plane"
DEFAULT_STATE_DIR = Path.home() / ".cache" / "stalledpolicy" / "plane"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
CLUSTER_NAME = "stalledpolicy-local"
PORT_ATTEMPTS = 3
FRONT_PROXY_CLIENT = "front-proxy-client"

# Enough for the operator's world: ownership, namespaces, service accounts and
# their tokens, aggregated ClusterRoles (admin/edit/view), Deployments that get
# ReplicaSets and Pods. Everything node- or cloud-related is left out: no kubelet.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "deployment-controller",
    "replicaset-controller",
)


class ControlPlaneError(RuntimeError):
    pass


class _PortTaken(ControlPlaneError):
    pass


# --------------------------------------------------------------------------- binaries


def ensure_binaries(*, build: bool = True) -> Path:
    """The directory holding etcd, kube-apiserver, kube-controller-manager, kubectl
    and helm. Runs ``hack/control-plane/build.sh`` (which returns at once when its
    cache is complete, and builds otherwise: tens of minutes on 2 cores); with
    ``build=False`` it raises instead of building."""
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        bin_dir = Path(override)
        _check_binaries(bin_dir, f"{BIN_DIR_ENV}={override}")
        return bin_dir
    script = HACK_DIR / "build.sh"
    if not script.is_file():
        raise ControlPlaneError(
            f"{script} not found: run from a checkout of the repository or set {BIN_DIR_ENV} "
            "to a directory with the control-plane binaries"
        )
    args = ["bash", str(script)]
    if not build:
        args.append("--check")
    # stderr is inherited so that a cold build shows its progress.
    done = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    if done.returncode == 3 and not build:
        raise ControlPlaneError(f"the control-plane binaries are not built: run {script} (tens of minutes)")
    if done.returncode != 0:
        raise ControlPlaneError(f"{script} failed with exit code {done.returncode} (its output is above)")
    bin_dir = Path(done.stdout.strip().splitlines()[-1])
    _check_binaries(bin_dir, str(script))
    return bin_dir


def _check_binaries(bin_dir: Path, source: str) -> None:
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{', '.join(missing)} missing from {bin_dir} (from {source})")


# --------------------------------------------------------------------------- TLS material


@dataclass(frozen=True)
class Pki:
    dir: Path

    ca_cert = property(lambda self: self.dir / "ca.crt")
    ca_key = property(lambda self: self.dir / "ca.key")
    serving_cert = property(lambda self: self.dir / "apiserver.crt")
    serving_key = property(lambda self: self.dir / "apiserver.key")
    admin_cert = property(lambda self: self.dir / "admin.crt")
    admin_key = property(lambda self: self.dir / "admin.key")
    controller_manager_cert = property(lambda self: self.dir / "controller-manager.crt")
    controller_manager_key = property(lambda self: self.dir / "controller-manager.key")
    front_proxy_ca_cert = property(lambda self: self.dir / "front-proxy-ca.crt")
    front_proxy_ca_key = property(lambda self: self.dir / "front-proxy-ca.key")
    front_proxy_client_cert = property(lambda self: self.dir / "front-proxy-client.crt")
    front_proxy_client_key = property(lambda self: self.dir / "front-proxy-client.key")
    service_account_key = property(lambda self: self.dir / "sa.key")
    service_account_pub = property(lambda self: self.dir / "sa.pub")


def generate_pki(directory: Path) -> Pki:
    """A CA, the API server's serving certificate (127.0.0.1, localhost and the
    in-cluster names), client certificates for the admin (``system:masters``)
    and the controller manager, a front-proxy CA and client certificate, and the
    service-account signing key pair."""
    try:  # deferred, these four: cryptography is in the test extra only, its absence said as below
        from cryptography import x509  # deferred: see above
        from cryptography.hazmat.primitives import hashes, serialization  # deferred: see above
        from cryptography.hazmat.primitives.asymmetric import ec  # deferred: see above
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # deferred: see above
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ControlPlaneError(
            "the control plane needs the 'cryptography' package: pip install -e '.[test]'"
        ) from exc
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=365)

    def write_key(path: Path, key) -> None:
        path.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        path.chmod(0o600)

    def name(common_name: str, organization: str | None = None) -> x509.Name:
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        return x509.Name(attributes)

    def authority(cert_path: Path, key_path: Path, common_name: str):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return subject, key

    def leaf(issuer, cert_path: Path, key_path: Path, subject: x509.Name, usage, sans=None) -> None:
        issuer_name, issuer_key = issuer
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
            ), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        write_key(key_path, key)
        cert_path.write_bytes(builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    ca = authority(pki.ca_cert, pki.ca_key, "stalledpolicy-local-ca")
    # The aggregation layer's own CA: the API server proxies to extension API servers
    # as front-proxy-client, and delegating servers (the controller manager) read it.
    front_proxy_ca = authority(pki.front_proxy_ca_cert, pki.front_proxy_ca_key, "stalledpolicy-local-front-proxy-ca")
    leaf(front_proxy_ca, pki.front_proxy_client_cert, pki.front_proxy_client_key, name(FRONT_PROXY_CLIENT),
         ExtendedKeyUsageOID.CLIENT_AUTH)

    leaf(ca, pki.serving_cert, pki.serving_key, name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        # The "kubernetes" Service's cluster IP: the first address of the range.
        x509.IPAddress(next(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).hosts())),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ])
    leaf(ca, pki.admin_cert, pki.admin_key, name("stalledpolicy-admin", "system:masters"),
         ExtendedKeyUsageOID.CLIENT_AUTH)
    leaf(ca, pki.controller_manager_cert, pki.controller_manager_key, name("system:kube-controller-manager"),
         ExtendedKeyUsageOID.CLIENT_AUTH)

    # ES256 service-account tokens: as valid as RS256 to every client, and the key is
    # made in microseconds where an RSA key costs up to a second on a busy machine.
    sa_key = ec.generate_private_key(ec.SECP256R1())
    write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


# --------------------------------------------------------------------------- kubeconfigs


def _b64_file(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, user: dict, *, user_name: str,
                     namespace: str | None = None) -> Path:
    """A self-contained kubeconfig (everything embedded, so it can be copied)."""
    context: dict = {"cluster": CLUSTER_NAME, "user": user_name}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {
            "server": server, "certificate-authority-data": _b64_file(ca_cert)}}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": user_name, "context": context}],
        "current-context": user_name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------- processes


def crd_established(crd: dict) -> bool:
    """Whether a CRD (as ``kubectl get -o json`` prints it) is Established and its
    names accepted. A CRD just applied may have no status yet: not yet."""
    conditions = {c.get("type"): c.get("status") for c in (crd.get("status") or {}).get("conditions") or []}
    return conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"


def wait_crd_established(kubectl, name: str, timeout: float = 60.0) -> None:
    """Poll until the CRD ``name`` is Established; ``kubectl(*args, check=False)`` runs kubectl.

    Not ``kubectl wait --for=condition=Established``: on a CRD the API server has
    not yet given a status it fails at once (".status.conditions accessor error:
    <nil> is of the type <nil>") instead of waiting.
    """
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        done = kubectl("get", f"crd/{name}", "-o", "json", check=False)
        if done.returncode == 0 and crd_established(json.loads(done.stdout)):
            return
        last = done.stderr.strip() or "not Established yet"
        if time.monotonic() >= deadline:
            raise ControlPlaneError(f"CRD {name} not Established after {timeout:.0f}s ({last})")
        time.sleep(0.2)


def _die_with_parent() -> None:
    """Runs in the child before exec: kill it when the process that started it dies,
    so that a killed test run leaves no etcd or apiserver behind. SIGKILL, because
    all three get the signal at once and an apiserver whose etcd is gone never
    finishes a graceful shutdown; the state is throwaway anyway."""
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the fixture's teardown still stops them
        pass


@dataclass
class Component:
    name: str
    pid: int
    binary: str
    log: Path
    popen: subprocess.Popen | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        # Started by another process (`up`): check the pid still runs our binary.
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            return False
        return state != "Z" and cmdline == self.binary

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive():
            if self.popen is not None:
                self.popen.wait()
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            while self.alive():
                time.sleep(0.05)
        if self.popen is not None:
            self.popen.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on free loopback ports.

    ``state_dir`` holds the TLS material, etcd's data, the logs and the kubeconfig;
    by default a fresh temporary directory, removed by :meth:`stop`.
    ``detached`` starts the processes in their own session so they outlive this
    Python process (the ``up`` command); otherwise they die with it.
    """

    state_dir: Path | None = None
    bin_dir: Path | None = None
    detached: bool = False
    components: list[Component] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)

    # -- paths -----------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client certificate in ``system:masters``)."""
        return self._state / "kubeconfig"

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def logs_dir(self) -> Path:
        return self._state / "logs"

    @property
    def pki(self) -> Pki:
        return Pki(self._state / "pki")

    @property
    def _state(self) -> Path:
        if self.state_dir is None:
            raise ControlPlaneError("the control plane has not been started")
        return self.state_dir

    def binary(self, name: str) -> Path:
        if self.bin_dir is None:
            self.bin_dir = ensure_binaries()
        return self.bin_dir / name

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/the operator: KUBECONFIG, and the binaries on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.binary('kubectl').parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> ControlPlane:
        if self.components:
            raise ControlPlaneError("already started")
        if self.bin_dir is None:
            self.bin_dir = ensure_binaries()
        if self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="stalledpolicy-plane-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        pki = generate_pki(self._state / "pki")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_components(pki, deadline)
                break
            except _PortTaken:
                # Ports are picked free, then bound by another program: another
                # plane or server starting at the same moment took one. Try new ones.
                self._stop_components()
                if attempt == PORT_ATTEMPTS:
                    raise
                shutil.rmtree(self._state / "etcd", ignore_errors=True)
                for log in self.logs_dir.glob("*.log"):
                    if ".attempt" not in log.name:
                        log.rename(log.with_name(f"{log.stem}.attempt{attempt}.log"))
            except BaseException:
                self._stop_components()
                raise
        self._save_state()
        return self

    def _start_components(self, pki: Pki, deadline: float) -> None:
        self._start_etcd(deadline)
        self._start_apiserver(pki, deadline)
        write_kubeconfig(self.kubeconfig, self.server_url, pki.ca_cert, user_name="admin", user={
            "client-certificate-data": _b64_file(pki.admin_cert),
            "client-key-data": _b64_file(pki.admin_key),
        })
        self._start_controller_manager(pki, deadline)

    def stop(self, *, keep_logs_in: Path | None = None) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 15 s) and remove the state
        directory; with ``keep_logs_in`` the logs are copied there first."""
        self._stop_components()
        if self.state_dir is None:
            return
        if keep_logs_in is not None and self.logs_dir.is_dir():
            shutil.copytree(self.logs_dir, keep_logs_in, dirs_exist_ok=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def running(self) -> bool:
        return bool(self.components) and all(c.alive() for c in self.components)

    def _stop_components(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def _spawn(self, name: str, args: list[str]) -> Component:
        binary = str(self.binary(name))
        log = self.logs_dir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [binary, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self._state, start_new_session=True,
                preexec_fn=None if self.detached else _die_with_parent,
            )
        component = Component(name=name, pid=popen.pid, binary=binary, log=log, popen=popen)
        self.components.append(component)
        return component

    def _start_etcd(self, deadline: float) -> None:
        client, peer = free_port(), free_port()
        self.ports.update(etcd=client, etcd_peer=peer)
        etcd = self._spawn("etcd", [
            "--name=default",
            f"--data-dir={self._state / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # a throwaway test store: durability buys nothing here
            "--log-level=warn",
        ])
        self._wait(etcd, f"http://127.0.0.1:{client}/health", deadline, expect=b'"health":"true"')

    def _start_apiserver(self, pki: Pki, deadline: float) -> None:
        port = free_port()
        self.ports["apiserver"] = port
        apiserver = self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self._state / 'apiserver'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            # The "kubernetes" Service cannot point at a loopback address.
            "--endpoint-reconciler-type=none",
            # A node (hack/node/) is reached at its address, never by its name: a name
            # would be looked up with the host's resolver, outside the node's namespace.
            "--kubelet-preferred-address-types=InternalIP",
        ])
        self._wait(apiserver, f"{self.server_url}/readyz", deadline, expect=b"ok", tls=pki)

    def _start_controller_manager(self, pki: Pki, deadline: float) -> None:
        port = free_port()
        self.ports["controller_manager"] = port
        kubeconfig = write_kubeconfig(
            self._state / "controller-manager.kubeconfig", self.server_url, pki.ca_cert,
            user_name="system:kube-controller-manager", user={
                "client-certificate-data": _b64_file(pki.controller_manager_cert),
                "client-key-data": _b64_file(pki.controller_manager_key),
            })
        manager = self._spawn("kube-controller-manager", [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self._state / 'controller-manager'}",
            "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS)}",
            # Each controller acts as its own ServiceAccount, as in a real cluster, so the
            # built-in RBAC roles are exercised the way the operator will meet them.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
        ])
        self._wait(manager, f"https://127.0.0.1:{port}/healthz", deadline, expect=b"ok", tls=None)

    def _wait(self, component: Component, url: str, deadline: float, *, expect: bytes,
              tls: Pki | None = None) -> None:
        if url.startswith("https"):
            context = ssl.create_default_context(cafile=str(tls.ca_cert)) if tls else ssl._create_unverified_context()
            if tls:
                context.load_cert_chain(str(tls.admin_cert), str(tls.admin_key))
        else:
            context = None
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not component.alive():
                if "address already in use" in component.log_tail():
                    raise _PortTaken(f"{component.name}: a port was taken; log {component.log}")
                raise ControlPlaneError(
                    f"{component.name} exited during start-up; log {component.log}:\n{component.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    body = response.read()
                    if expect in body:
                        return
                    last = f"HTTP {response.status}: {body[:200]!r}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:300]!r}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{component.name} not ready at {url} ({last}); log {component.log}:\n{component.log_tail()}")

    # -- persistence for `up` / `down` -----------------------------------------------------
    def _save_state(self) -> None:
        record = {
            "bin_dir": str(self.bin_dir),
            "ports": self.ports,
            "components": [{"name": c.name, "pid": c.pid, "binary": c.binary, "log": str(c.log)}
                           for c in self.components],
        }
        (self._state / "plane.json").write_text(json.dumps(record, indent=2))

    @classmethod
    def attach(cls, state_dir: Path) -> ControlPlane:
        """The plane recorded in ``state_dir`` by an earlier :meth:`start` (of any process)."""
        record_path = state_dir / "plane.json"
        if not record_path.is_file():
            raise ControlPlaneError(f"no control plane recorded in {state_dir} (start one with `up`)")
        record = json.loads(record_path.read_text())
        plane = cls(state_dir=state_dir, bin_dir=Path(record["bin_dir"]), ports=record["ports"])
        plane.components = [Component(name=c["name"], pid=c["pid"], binary=c["binary"], log=Path(c["log"]))
                            for c in record["components"]]
        return plane

    # -- clients ---------------------------------------------------------------------
    def api_client(self, kubeconfig: Path | None = None):
        """A ``kubernetes.client.ApiClient``: admin unless another kubeconfig is given."""
        from kubernetes import config  # deferred: the kubernetes client takes 0.3 s to import; up/down/env use none

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def kubectl(self, *args: str, kubeconfig: Path | None = None, check: bool = True,
                input: str | None = None) -> subprocess.CompletedProcess:
        env = self.env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        done = subprocess.run([str(self.binary("kubectl")), *args], env=env, input=input,
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def kubeconfig_for_token(self, token: str, path: Path, *, user_name: str = "token-user",
                             namespace: str | None = None) -> Path:
        """A kubeconfig authenticating with a bearer ``token`` (e.g. a ServiceAccount's)."""
        return write_kubeconfig(path, self.server_url, self.pki.ca_cert, {"token": token},
                                user_name=user_name, namespace=namespace)

    def service_account_token(self, namespace: str, name: str, *, seconds: int = 3600) -> str:
        """A token for an existing ServiceAccount, from the TokenRequest API."""
        from kubernetes import client  # deferred: as in api_client

        with self.api_client() as api:
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds))
            response = client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request)
        return response.status.token

    def kubeconfig_for_service_account(self, namespace: str, name: str, path: Path | None = None, *,
                                       seconds: int = 3600) -> Path:
        """A kubeconfig acting as ``system:serviceaccount:<namespace>:<name>``
        (the ServiceAccount must exist), default namespace set to ``namespace``."""
        path = path or self._state / "kubeconfigs" / f"{namespace}.{name}.kubeconfig"
        token = self.service_account_token(namespace, name, seconds=seconds)
        return self.kubeconfig_for_token(token, path, user_name=f"{namespace}:{name}", namespace=namespace)


# --------------------------------------------------------------------------- command line


def _up(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    if (state_dir / "plane.json").is_file():
        existing = ControlPlane.attach(state_dir)
        if existing.running():
            print(f"already running: {existing.server_url}", file=sys.stderr)
            _print_env(existing)
            return 0
        existing.stop()  # leftovers of a plane that died: clear them before starting over
    started = time.monotonic()
    plane = ControlPlane(state_dir=state_dir, detached=True).start()
    where = "" if state_dir == DEFAULT_STATE_DIR else f" --state-dir {state_dir}"
    print(f"control plane up in {time.monotonic() - started:.1f}s: {plane.server_url}, "
          f"logs in {plane.logs_dir}; stop it with: hack/control-plane/up.sh down{where}", file=sys.stderr)
    _print_env(plane)
    return 0


def _down(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    if not state_dir.exists():
        print(f"nothing to stop in {state_dir}", file=sys.stderr)
        return 0
    if (state_dir / "plane.json").is_file():
        ControlPlane.attach(state_dir).stop()
    else:
        shutil.rmtree(state_dir, ignore_errors=True)
    print(f"control plane stopped, {state_dir} removed", file=sys.stderr)
    return 0


def _env(args: argparse.Namespace) -> int:
    plane = ControlPlane.attach(Path(args.state_dir))
    if not plane.running():
        print(f"the control plane in {args.state_dir} is not running (start it with `up`)", file=sys.stderr)
        return 1
    _print_env(plane)
    return 0


def _print_env(plane: ControlPlane) -> None:
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(f"export PATH={plane.bin_dir}:$PATH")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stalledpolicy.devenv.controlplane",
        description="A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager). "
                    "`eval \"$(hack/control-plane/up.sh up)\"` starts it and sets KUBECONFIG and PATH.")
    parser.add_argument("command", choices=("up", "down", "env", "build"))
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR),
                        help=f"TLS material, etcd data, logs and kubeconfig (default {DEFAULT_STATE_DIR})")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(ensure_binaries())
            return 0
        return {"up": _up, "down": _down, "env": _env}[args.command](args)
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
