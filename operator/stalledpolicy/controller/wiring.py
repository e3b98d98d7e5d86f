"""Builds the Controller from the process's Kubernetes credentials (in-cluster or kubeconfig)."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.events import EventRecorder
from stalledpolicy.controller.redis_clients import RedisClients, RedisConfigError, SecretData, SecretReader
from stalledpolicy.controller.runtime import Controller


class DeadlineApiClient(client.ApiClient):
    """An ApiClient whose calls that name no ``_request_timeout`` get ``timeout``
    seconds. The client's default is no deadline: a connection the API server, or
    a load balancer before it, stops answering on held the calling thread until
    the kernel gave up on it. It has no setting for a default deadline: its REST
    layer hands urllib3 the per-call value, None included, which overrides any
    timeout of the pool; and its TCP keepalive drops a peer that is gone, not one
    that accepts and never answers."""

    def __init__(self, configuration: client.Configuration, timeout: float | None) -> None:
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(self, method: Any, url: Any, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:
        return super().call_api(method, url, header_params, body, post_params,
                                self.timeout if _request_timeout is None else _request_timeout)


def kubernetes_api_client(connections: int, timeout: float | None = None, *,
                          retries: bool | None = None) -> DeadlineApiClient:
    from kubernetes import config  # deferred: the kubernetes client takes 0.4 s to import

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = connections
    if retries is not None:  # urllib3's: False, no retry of a failed or timed-out call
        configuration.retries = retries
    return DeadlineApiClient(configuration, timeout)


def build_controller(config: OperatorConfig, api_client: client.ApiClient | None = None) -> Controller:
    import urllib3  # deferred: with the kubernetes client
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    if api_client is None:
        api = kubernetes_api_client(config.api_connections, config.api_timeout)
    else:  # its configuration, on a client of our own: the caller's keeps its own deadlines
        api = DeadlineApiClient(api_client.configuration, config.api_timeout)
    core = client.CoreV1Api(api)

    # Secrets are read by name only (RBAC: get), never watched; a digest of the
    # referenced value (Controller.secret_digest) rolls the sweeper when it changes.
    def read_secret(namespace: str, name: str) -> SecretData | None:
        try:
            secret = core.read_namespaced_secret(name, namespace)
            return SecretData(secret.data or {}, secret.metadata.uid if secret.metadata else None)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RedisConfigError(
                "SecretUnreadable",
                f"cannot read Secret {namespace}/{name}: HTTP {exc.status} {exc.reason}; "
                "check the operator's RBAC (get secrets)") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # Unreachable, or no answer within api_timeout (STALLEDPOLICY_OPERATOR_API_TIMEOUT): said, and tried again
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
