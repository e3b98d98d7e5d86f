"""Builds the Controller from the process's Kubernetes credentials (in-cluster or kubeconfig)."""

from __future__ import annotations

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.events import EventRecorder
from stalledpolicy.controller.redis_clients import RedisClients, RedisConfigError, SecretData, SecretReader
from stalledpolicy.controller.runtime import Controller


def kubernetes_api_client(connections: int, timeout: float | None = None):
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = connections
    return with_deadline(client.ApiClient(configuration), timeout)


def with_deadline(api, timeout: float | None):
    """``api`` with ``timeout`` seconds as the deadline of every call that names
    none (the Kubernetes client's default is none: a connection the API server,
    or a load balancer before it, stops answering on held the calling thread
    until the kernel gave up on it, hours later)."""
    if timeout is None or getattr(api, "_stalledpolicy_deadline", None) == timeout:
        return api
    call = api.call_api

    def call_api(method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        return call(method, url, header_params, body, post_params,
                    timeout if _request_timeout is None else _request_timeout)

    api.call_api = call_api
    api._stalledpolicy_deadline = timeout
    return api


def build_controller(config: OperatorConfig, api_client=None) -> Controller:
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    if api_client is None:
        api = kubernetes_api_client(config.api_connections, config.api_timeout)
    else:  # its configuration, on a client of our own: the caller's keeps its own deadlines
        api = with_deadline(client.ApiClient(api_client.configuration), config.api_timeout)
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
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # Unreachable, or no answer within --api-timeout: said, and tried again
            # on the next refresh (it raised out of the refresh, a traceback each time).
            raise RedisConfigError(
                "SecretUnreadable",
                f"cannot read Secret {namespace}/{name}: the Kubernetes API server did not answer "
                f"({type(exc).__name__}); it is tried again") from None

    return Controller(
        config,
        apps=client.AppsV1Api(api), core=core, custom=client.CustomObjectsApi(api),
        recorder=EventRecorder(core),
        secrets=SecretReader(read_secret, ttl=config.secret_ttl),
        clients=RedisClients(timeout=config.redis_timeout),
    )
