"""Builds the Controller from the process's Kubernetes credentials (in-cluster or kubeconfig)."""

from __future__ import annotations

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.events import EventRecorder
from stalledpolicy.controller.redis_clients import RedisClients, RedisConfigError, SecretData, SecretReader
from stalledpolicy.controller.runtime import Controller


def kubernetes_api_client(connections: int):
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def build_controller(config: OperatorConfig, api_client=None) -> Controller:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = api_client or kubernetes_api_client(config.api_connections)
    core = client.CoreV1Api(api)

    # Secrets are read by name only (RBAC: get), never watched; a digest of the
    # referenced value (Controller.secret_digest) rolls the sweeper when it changes.
    def read_secret(namespace: str, name: str):
        try:
            secret = core.read_namespaced_secret(name, namespace)
            return SecretData(secret.data or {}, secret.metadata.uid)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RedisConfigError(
                "SecretUnreadable",
                f"cannot read Secret {namespace}/{name}: HTTP {exc.status} {exc.reason}; "
                "check the operator's RBAC (get secrets)") from None

    return Controller(
        config,
        apps=client.AppsV1Api(api), core=core, custom=client.CustomObjectsApi(api),
        recorder=EventRecorder(core),
        secrets=SecretReader(read_secret, ttl=config.secret_ttl),
        clients=RedisClients(timeout=config.redis_timeout),
    )
