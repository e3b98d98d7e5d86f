"""The local pod runner: the test harness standing in for the kubelet.

This machine cannot run a kubelet, but the local control plane runs the real
deployment and replicaset controllers, so a sweeper Deployment gets real Pods
(never scheduled). The runner plays the kubelet for those Pods only: for each
live Pod labelled ``app.kubernetes.io/managed-by=stalledpolicy-operator`` in
one namespace it runs the container's command as a local process, with its
env resolved (``valueFrom.secretKeyRef`` read from the Secret, ``fieldRef`` to
the Pod's name and namespace) and the metrics port moved to a free local port;
it probes the container's readiness endpoint and writes the Pod's status
(Running, Ready) through the status subresource. The controllers do the rest,
as in a cluster: ReplicaSet and Deployment availability, rolling updates on a
new pod template (a new config hash means a new Pod, so a new process), scale
to zero and garbage collection delete Pods, and a deleted Pod's process is
stopped. The Deployment status is written by the deployment controller only,
so nothing fights over it.

    python -m stalledpolicy.devenv.podrunner --kubeconfig KUBECONFIG --namespace NS

SIGTERM or SIGINT stops every child process (SIGTERM, then SIGKILL after a
grace period) and exits.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from stalledpolicy import logs
from stalledpolicy.devenv.ports import free_port

log = logging.getLogger("stalledpolicy.podrunner")

MANAGED_SELECTOR = "app.kubernetes.io/managed-by=stalledpolicy-operator"
METRICS_PORT_ENV = "STALLEDPOLICY_METRICS_PORT"
METRICS_ADDRESS_ENV = "STALLEDPOLICY_METRICS_ADDRESS"
# Inherited from the runner's own environment (the rest comes from the Pod spec).
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")
RESTART_BACKOFF_MAX = 10.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EnvError(Exception):
    """The container's env cannot be resolved (a missing Secret or key): the kubelet's CreateContainerConfigError."""


def local_command(container: Mapping[str, Any]) -> list[str]:
    """The container's command as a local process: ``stalledpolicy`` runs from this Python."""
    command = list(container.get("command") or []) + list(container.get("args") or [])
    if not container.get("command"):
        command = ["stalledpolicy", *command]  # the image's ENTRYPOINT (Dockerfile)
    if command and command[0] == "stalledpolicy":
        command = [sys.executable, "-m", "stalledpolicy", *command[1:]]
    return command


def resolve_env(container: Mapping[str, Any], pod: Mapping[str, Any],
                read_secret) -> dict[str, str]:
    """The container's env as plain strings. ``read_secret(name)`` returns a Secret's data or None."""
    meta = pod.get("metadata") or {}
    fields = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "status.podIP": "127.0.0.1"}
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = str(item["value"])
            continue
        source = item.get("valueFrom") or {}
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = read_secret(ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"secret {ref['name']!r} not found")
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise EnvError(f"couldn't find key {ref['key']} in Secret {ref['name']}")
            env[name] = base64.b64decode(data[ref["key"]]).decode()
        elif "fieldRef" in source:
            env[name] = fields.get(source["fieldRef"].get("fieldPath"), "")
        else:
            env[name] = ""
    return env


def probe_port(probe: Mapping[str, Any] | None, container: Mapping[str, Any],
               port_map: Mapping[int, int]) -> tuple[int, str] | None:
    """(local port, path) of an httpGet probe, the named port resolved and remapped."""
    if not probe or "httpGet" not in probe:
        return None
    get = probe["httpGet"]
    port = get.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
    if port is None:
        return None
    return port_map.get(int(port), int(port)), get.get("path", "/")


@dataclass
class LocalPod:
    uid: str
    name: str
    container: dict
    log_path: Path
    process: subprocess.Popen | None = None
    port_map: dict[int, int] = field(default_factory=dict)
    restarts: int = 0
    started_at: str | None = None
    next_start: float = 0.0
    ready: bool | None = None  # as last written to the Pod's status
    waiting_reason: str | None = None
    written: tuple | None = None


class PodRunner:
    def __init__(self, api_client, namespace: str, *, log_dir: Path | None = None,
                 poll_interval: float = 0.5, selector: str = MANAGED_SELECTOR) -> None:
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.selector = selector
        self.poll_interval = poll_interval
        self.log_dir = Path(log_dir) if log_dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"podrunner-{namespace}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pods: dict[str, LocalPod] = {}
        self._stop = threading.Event()

    # -- the loop --------------------------------------------------------------
    def run(self) -> None:
        log.info("pod runner started", extra={"namespace": self.namespace, "selector": self.selector})
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # noqa: BLE001 - API hiccups: try again next tick
                log.warning("sync failed", extra={"error": f"{type(exc).__name__}: {exc}"[:300]})
            self._stop.wait(self.poll_interval)
        self.stop_all()
        log.info("pod runner stopped", extra={"namespace": self.namespace})

    def request_stop(self) -> None:
        self._stop.set()

    def sync_once(self) -> None:
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        live = {}
        for pod in listed.items:
            body = self.core.api_client.sanitize_for_serialization(pod)
            if (body.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            live[body["metadata"]["uid"]] = body
        for uid in list(self.pods):
            if uid not in live:
                self._stop_pod(self.pods.pop(uid))
        for uid, body in live.items():
            local = self.pods.get(uid)
            if local is None:
                local = self._adopt(body)
                self.pods[uid] = local
            self._tend(local, body)

    # -- one pod -----------------------------------------------------------------
    def _adopt(self, pod: Mapping[str, Any]) -> LocalPod:
        container = (pod.get("spec") or {}).get("containers", [{}])[0]
        name = pod["metadata"]["name"]
        return LocalPod(uid=pod["metadata"]["uid"], name=name, container=container,
                        log_path=self.log_dir / f"{name}.log")

    def _read_secret(self, name: str):
        try:
            return self.core.read_namespaced_secret(name, self.namespace).data or {}
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _start(self, local: LocalPod, pod: Mapping[str, Any]) -> None:
        container = local.container
        try:
            env = resolve_env(container, pod, self._read_secret)
        except EnvError as exc:
            if local.waiting_reason != str(exc):
                log.warning("cannot start container", extra={"pod": local.name, "error": str(exc)})
            local.waiting_reason = str(exc)
            local.next_start = time.monotonic() + 1.0
            return
        local.waiting_reason = None
        for port in container.get("ports") or []:
            local.port_map.setdefault(int(port["containerPort"]), free_port())
        if METRICS_PORT_ENV in env and env[METRICS_PORT_ENV].isdigit():
            original = int(env[METRICS_PORT_ENV])
            env[METRICS_PORT_ENV] = str(local.port_map.setdefault(original, free_port()))
            env[METRICS_ADDRESS_ENV] = "127.0.0.1"
        base = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        command = local_command(container)
        try:
            with open(local.log_path, "ab") as out:
                local.process = subprocess.Popen(
                    command, env={**base, "PYTHONUNBUFFERED": "1", **env}, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            reason = f"cannot run {command[0] if command else '(no command)'}: {exc.strerror or exc}"
            if local.waiting_reason != reason:
                log.warning("cannot start container", extra={"pod": local.name, "error": reason})
            local.waiting_reason = reason
            local.next_start = time.monotonic() + 5.0
            return
        local.started_at = _now()
        log.info("container started", extra={"pod": local.name, "pid": local.process.pid,
                                              "restarts": local.restarts,
                                              "ports": dict(local.port_map)})

    def _tend(self, local: LocalPod, pod: Mapping[str, Any]) -> None:
        if local.process is not None and local.process.poll() is not None:
            log.warning("container exited", extra={"pod": local.name,
                                                   "code": local.process.returncode})
            local.process = None
            local.restarts += 1
            local.next_start = time.monotonic() + min(RESTART_BACKOFF_MAX, 2 ** min(local.restarts, 4) / 2)
        if local.process is None and time.monotonic() >= local.next_start:
            self._start(local, pod)
        ready = local.process is not None and self._probe_ok(local)
        self._write_status(local, pod, ready)

    def _probe_ok(self, local: LocalPod) -> bool:
        target = probe_port(local.container.get("readinessProbe"), local.container, local.port_map)
        if target is None:
            return True  # no readiness probe: ready once running, as a kubelet says
        port, path = target
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1.0) as answer:
                return 200 <= answer.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _write_status(self, local: LocalPod, pod: Mapping[str, Any], ready: bool) -> None:
        running = local.process is not None
        key = (running, ready, local.restarts, local.waiting_reason)
        if key == local.written:
            return
        now = _now()
        flag = "True" if ready else "False"
        if running:
            state = {"running": {"startedAt": local.started_at or now}}
        else:
            reason = "CreateContainerConfigError" if local.waiting_reason else "ContainerCreating"
            state = {"waiting": {"reason": reason, "message": local.waiting_reason or ""}}
        container = local.container
        status = {
            "phase": "Running" if running else "Pending",
            "startTime": (pod.get("status") or {}).get("startTime") or now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                {"type": "Ready", "status": flag, "lastTransitionTime": now},
            ],
            "containerStatuses": [{
                "name": container.get("name", "main"),
                "image": container.get("image", ""),
                "imageID": "",
                "ready": ready,
                "started": running,
                "restartCount": local.restarts,
                "state": state,
            }],
        }
        try:
            self.core.patch_namespaced_pod_status(local.name, self.namespace, {"status": status})
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        local.written = key
        log.info("pod status written", extra={"pod": local.name, "ready": ready, "running": running})

    def _stop_pod(self, local: LocalPod, grace: float = 10.0) -> None:
        process = local.process
        local.process = None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(5)
        log.info("container stopped", extra={"pod": local.name, "code": process.returncode})

    def stop_all(self) -> None:
        for uid in list(self.pods):
            self._stop_pod(self.pods.pop(uid))

    def processes(self) -> dict[str, subprocess.Popen]:
        """Pod name -> running process (tests)."""
        return {p.name: p.process for p in self.pods.values() if p.process is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalledpolicy.devenv.podrunner",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--log-dir", help="where each container's output goes (default $TMPDIR/podrunner-NS)")
    parser.add_argument("--selector", default=MANAGED_SELECTOR, help="label selector of the Pods to run")
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    logs.configure(args.log_format, "info")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    runner = PodRunner(api, args.namespace, log_dir=Path(args.log_dir) if args.log_dir else None,
                       poll_interval=args.poll_interval, selector=args.selector)

    def on_signal(signum, _frame):
        log.info("signal received; stopping", extra={"signal": signal.Signals(signum).name})
        runner.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
