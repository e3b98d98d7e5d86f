"""Control-plane fixtures: one real etcd + kube-apiserver + kube-controller-manager
for the whole session (``stalledpolicy.devenv.controlplane``).

- ``control_plane``: the started :class:`ControlPlane` (``.kubeconfig``,
  ``.server_url``, ``.kubectl()``, ``.kubeconfig_for_service_account()``, ...).
- ``kubeconfig``: path of the admin kubeconfig.
- ``kube_api``: a ``kubernetes.client.ApiClient`` acting as admin.
- ``kube_namespace``: a fresh namespace for one test, deleted after it.

A test using any of them is marked ``kube`` automatically, so ``-m "not kube"``
leaves the plane unstarted; a test marked ``kube`` gets the plane started even
when it only shells out to kubectl. Missing binaries are built once collection
is done, before the first test (``hack/control-plane/build.sh``; CI builds them
beforehand). When a test of the
session failed, the control-plane logs are copied to a directory named in the
terminal summary. ``STALLEDPOLICY_KUBECONFIG`` points the fixtures at a plane
that is already up (``hack/control-plane/up.sh up``) instead of starting one.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from stalledpolicy.devenv.controlplane import ControlPlane, ControlPlaneError, ensure_binaries

KUBE_FIXTURES = {"control_plane", "kubeconfig", "kube_api", "kube_namespace"}
EXTERNAL_KUBECONFIG_ENV = "STALLEDPOLICY_KUBECONFIG"

_kept_logs: list[Path] = []
_binaries_error: str | None = None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = getattr(item, "fixturenames", None)
        if names is None:
            continue
        if KUBE_FIXTURES & set(names):
            item.add_marker(pytest.mark.kube)
        elif item.get_closest_marker("kube"):
            # Set up like a requested fixture, so the plane is up before the test runs.
            names.append("control_plane")


def pytest_collection_finish(session):
    """Build missing binaries before any test runs: a cold build takes far longer
    than the per-test timeout, which would count it if the fixture did it."""
    global _binaries_error
    if session.config.option.collectonly or os.environ.get(EXTERNAL_KUBECONFIG_ENV):
        return
    if not any(item.get_closest_marker("kube") for item in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            ensure_binaries()  # returns at once when the cache is complete
        except ControlPlaneError as exc:
            _binaries_error = str(exc)


def pytest_terminal_summary(terminalreporter):
    for path in _kept_logs:
        terminalreporter.write_line(f"control-plane logs kept in {path}", yellow=True)


class _ExternalPlane(ControlPlane):
    """A plane started elsewhere; the fixtures must not stop it."""

    def stop(self, *, keep_logs_in=None):  # noqa: ARG002
        pass


def _external_plane(kubeconfig: Path) -> ControlPlane:
    state_dir = kubeconfig.parent
    if (state_dir / "plane.json").is_file():
        plane = _ExternalPlane.attach(state_dir)
        if not plane.running():
            pytest.fail(f"{EXTERNAL_KUBECONFIG_ENV}={kubeconfig}: that control plane is not running "
                        f"(start it with: hack/control-plane/up.sh up --state-dir {state_dir})")
        return plane
    pytest.fail(f"{EXTERNAL_KUBECONFIG_ENV}={kubeconfig}: not a kubeconfig written by `up.sh up` "
                "(its directory has no plane.json); unset it to let the tests start their own plane")


@pytest.fixture(scope="session")
def control_plane(request):
    external = os.environ.get(EXTERNAL_KUBECONFIG_ENV)
    if external:
        yield _external_plane(Path(external))
        return
    if _binaries_error:
        pytest.fail(f"control-plane binaries: {_binaries_error}")
    started = time.monotonic()
    plane = ControlPlane().start()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"control plane {plane.server_url} ready in {time.monotonic() - started:.1f}s "
            f"(state {plane.state_dir})")
    try:
        yield plane
    finally:
        keep = None
        if request.session.testsfailed:
            keep = Path(tempfile.gettempdir()) / f"stalledpolicy-control-plane-logs-{int(time.time())}"
            _kept_logs.append(keep)
        plane.stop(keep_logs_in=keep)


@pytest.fixture(scope="session")
def kubeconfig(control_plane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def kube_api(control_plane):
    client = control_plane.api_client()
    yield client
    client.close()


@pytest.fixture
def kube_namespace(kube_api) -> str:
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "stalledpolicy-operator"


class Helm:
    """The control plane's helm binary, with its cache, config and data under ``home``;
    a failed command fails the test with helm's output."""

    def __init__(self, control_plane, home: Path) -> None:
        self.binary = str(control_plane.binary("helm"))
        self.env = control_plane.env()
        for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            self.env[name] = str(home / name.lower())

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([self.binary, *args], env=self.env, capture_output=True, text=True, timeout=400)
        if check and done.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}\n{done.stdout}")
        return done

    def template(self, *args: str, namespace: str = "stalledpolicy-system") -> list[dict]:
        out = self("template", "rel", str(CHART), "--namespace", namespace, *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]
