"""The local control plane is a real Kubernetes API: health, version, garbage
collection through owner references, RBAC, and a clean teardown."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from stalledpolicy.devenv.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll until ``predicate()`` is truthy; the controllers act asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def exists(read) -> bool:
    try:
        read()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def test_readyz_answers_ok_through_kubectl(control_plane):
    done = control_plane.kubectl("get", "--raw", "/readyz")
    assert done.stdout.strip() == "ok"


def test_server_and_client_report_the_built_release(control_plane, kube_api):
    versions = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"].startswith("v1.37.")
    assert versions["clientVersion"]["gitVersion"] == versions["serverVersion"]["gitVersion"]
    assert (versions["serverVersion"]["major"], versions["serverVersion"]["minor"]) == ("1", "37")
    assert client.VersionApi(kube_api).get_code().git_version == versions["serverVersion"]["gitVersion"]


def _deployment(name: str, owner: client.V1ConfigMap | None = None) -> client.V1Deployment:
    labels = {"app": name}
    owners = None
    if owner is not None:
        owners = [client.V1OwnerReference(api_version="v1", kind="ConfigMap", name=owner.metadata.name,
                                          uid=owner.metadata.uid)]
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels, owner_references=owners),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="example.invalid/none")]),
            ),
        ),
    )


def test_deployment_owned_by_a_configmap_is_garbage_collected_with_it(kube_api, kube_namespace):
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    owner = core.create_namespaced_config_map(
        kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"), data={"k": "v"}))
    apps.create_namespaced_deployment(kube_namespace, _deployment("owned", owner))
    apps.create_namespaced_deployment(kube_namespace, _deployment("independent"))

    # The deployment controller runs: the owned Deployment gets its ReplicaSet.
    replica_sets = wait_for(
        lambda: apps.list_namespaced_replica_set(kube_namespace, label_selector="app=owned").items,
        "the owned Deployment's ReplicaSet")
    assert replica_sets[0].metadata.owner_references[0].name == "owned"

    core.delete_namespaced_config_map("owner", kube_namespace)

    wait_for(lambda: not exists(lambda: apps.read_namespaced_deployment("owned", kube_namespace)),
             "the garbage collector to delete the owned Deployment", timeout=120)
    wait_for(lambda: not apps.list_namespaced_replica_set(kube_namespace, label_selector="app=owned").items,
             "the garbage collector to delete the owned Deployment's ReplicaSet")
    assert exists(lambda: apps.read_namespaced_deployment("independent", kube_namespace))


def test_rbac_refuses_a_service_account_until_a_role_binding_allows_it(control_plane, kube_api, kube_namespace,
                                                                      tmp_path):
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(
        kube_namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    as_reader = control_plane.kubeconfig_for_service_account(kube_namespace, "reader", tmp_path / "reader.kubeconfig")

    with control_plane.api_client(as_reader) as reader_api:
        reader = client.CoreV1Api(reader_api)
        with pytest.raises(ApiException) as refused:
            reader.list_namespaced_pod(kube_namespace)
        assert refused.value.status == 403
        assert f"system:serviceaccount:{kube_namespace}:reader" in refused.value.body

        rbac.create_namespaced_role(kube_namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])]))
        rbac.create_namespaced_role_binding(kube_namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reader-reads-pods"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=kube_namespace)]))

        def allowed() -> bool:
            try:
                reader.list_namespaced_pod(kube_namespace)
                return True
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return False

        wait_for(allowed, "the RoleBinding to take effect", timeout=30)
        # The binding is namespaced: the rest of the cluster stays closed.
        with pytest.raises(ApiException) as elsewhere:
            reader.list_namespaced_pod("kube-system")
        assert elsewhere.value.status == 403

    # kubectl with the same kubeconfig agrees.
    can_i = control_plane.kubectl("auth", "can-i", "delete", "pods", kubeconfig=as_reader, check=False)
    assert can_i.stdout.strip() == "no"
    assert control_plane.kubectl("get", "pods", kubeconfig=as_reader).returncode == 0


def _running(pid: int, binary: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except FileNotFoundError:
        return False
    return stat[2] != "Z" and cmdline == binary


def test_a_detached_plane_is_stopped_from_its_state_dir_without_leftovers(control_plane, tmp_path):
    """What `up` then `down` do: the second ControlPlane only knows the state dir."""
    state_dir = tmp_path / "plane"
    plane = ControlPlane(state_dir=state_dir, bin_dir=control_plane.bin_dir, detached=True).start()
    started = [(c.pid, c.binary, c.popen) for c in plane.components]
    assert {c.name for c in plane.components} == {"etcd", "kube-apiserver", "kube-controller-manager"}
    assert plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"

    attached = ControlPlane.attach(state_dir)
    assert attached.server_url == plane.server_url and attached.running()
    attached.stop(keep_logs_in=tmp_path / "logs")

    for pid, binary, popen in started:
        assert not _running(pid, binary)
        popen.wait(10)  # reap: they were this process's children
    assert not state_dir.exists()
    assert sorted(os.listdir(tmp_path / "logs")) == ["etcd.log", "kube-apiserver.log", "kube-controller-manager.log"]
    assert control_plane.running()


def test_a_port_taken_between_choice_and_bind_is_replaced(control_plane, tmp_path, monkeypatch):
    import socket

    from stalledpolicy.devenv import controlplane

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    handed_out = []
    really_free = controlplane.free_port

    def first_port_taken() -> int:
        port = taken if not handed_out else really_free()
        handed_out.append(port)
        return port

    monkeypatch.setattr(controlplane, "free_port", first_port_taken)
    plane = ControlPlane(state_dir=tmp_path / "plane", bin_dir=control_plane.bin_dir)
    try:
        plane.start()
        assert handed_out[0] == taken
        assert plane.ports["etcd"] != taken
        assert plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        assert (plane.logs_dir / "etcd.attempt1.log").is_file()
    finally:
        plane.stop()
        squatter.close()
