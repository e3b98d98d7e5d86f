"""``stalledpolicy operator``: run the kopf operator (kopf is imported only here, in run())."""

from __future__ import annotations

import argparse
import os
import re
import sys

from stalledpolicy.controller.config import (
    MIN_LOOP_SECONDS,
    OperatorConfig,
    check_image_pattern,
    check_metrics_port,
    parse_lease,
)
from stalledpolicy.kube_names import is_dns_label

EXIT_USAGE = 2


def _seconds(text: str) -> float:
    # deferred: the arguments are checked before kopf and the operator load
    from stalledpolicy.durations import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None  # it quotes the value, shortened
    if value < MIN_LOOP_SECONDS:
        # 0s would spin the status loop; 1ms nearly so. (The chart's schema refuses them too.)
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1s")
    return value


def _lease(text: str) -> str:
    try:
        parse_lease(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _image_pattern(text: str) -> str:
    try:
        return check_image_pattern(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_GLOB = re.compile(r"[-a-z0-9*?\[\]]+")


def _namespace(text: str) -> str:
    """A namespace name, or kopf's pattern of them: comma-separated globs
    (``*``, ``?``), each may start with ``!`` to exclude. A name that is no
    DNS-1123 label (``Bad_NS``) matches no namespace: refused, not watched in vain."""
    parts = [part.strip() for part in text.split(",")]
    for part in parts:
        glob = part.removeprefix("!")
        if any(c in glob for c in "*?[") and _GLOB.fullmatch(glob):
            continue
        if not is_dns_label(glob):  # a namespace's name
            where = "" if len(parts) == 1 else f"{text!r}: "
            raise argparse.ArgumentTypeError(
                f"{where}{glob!r} is not a namespace name: a DNS-1123 label (at most 63 lower-case "
                "letters, digits and '-', starting and ending with a letter or digit), or a glob of "
                "them such as team-* (a leading ! excludes)")
    return text


def _metrics_port(text: str) -> int:
    try:
        return check_metrics_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS", type=_namespace,
                       help="watch StalledPolicies in NS (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch StalledPolicies in every namespace")
    parser.add_argument("--sweeper-image", default=os.environ.get("STALLEDPOLICY_SWEEPER_IMAGE"),
                        help="default sweeper image when a policy sets no spec.sweeper.image "
                             "(env STALLEDPOLICY_SWEEPER_IMAGE)")
    parser.add_argument("--allowed-sweeper-image", action="append", type=_image_pattern, default=None,
                        metavar="IMAGE",
                        help="an image a policy may set as spec.sweeper.image: an exact reference, or "
                             "a prefix ending in '/*', ':*' or '@*' (registry.example/team/*); '*' allows any image. "
                             "Repeatable. Default: only the sweeper image (--sweeper-image). "
                             "(env STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES, comma-separated)")
    parser.add_argument("--liveness", metavar="URL",
                        help="serve a liveness endpoint, e.g. http://[::]:8080/healthz ('::': every "
                             "address, IPv4 included; every IPv4 address on a host without IPv6)")
    parser.add_argument("--metrics-port", type=_metrics_port, default=None, metavar="PORT",
                        help="serve the operator's Prometheus metrics on PORT at /metrics; 0: off "
                             "(default 0; env STALLEDPOLICY_OPERATOR_METRICS_PORT; the chart uses 8081)")
    parser.add_argument("--metrics-address", default=None, metavar="ADDRESS",
                        help="address the metrics server listens on, IPv4 or IPv6 ('::': every "
                             "address, IPv4 included; every IPv4 address on a host without IPv6) "
                             "(default ::; env STALLEDPOLICY_OPERATOR_METRICS_ADDRESS)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--status-interval", type=_seconds, default=None, metavar="DURATION",
                        help="time between two status reads of a policy's queue "
                             "(default 10s, at least 1s)")
    parser.add_argument("--max-backoff", type=_seconds, default=None, metavar="DURATION",
                        help="longest retry delay after an error (default 5m, at least 1s)")
    parser.add_argument("--status-workers", type=int, default=None, metavar="N",
                        help="threads refreshing status (default 8)")
    parser.add_argument("--leader-election-lease", type=_lease, default=None, metavar="NAMESPACE/NAME",
                        help="elect a leader among operator replicas with this coordination.k8s.io Lease: "
                             "one replica acts, the others wait to take over (default: no election, act at "
                             "once; env STALLEDPOLICY_OPERATOR_LEADER_LEASE; the chart sets it)")
    parser.add_argument("--leader-election-duration", type=_seconds, default=None, metavar="DURATION",
                        help="how long a Lease not renewed keeps its holder (default 15s, at least 3s): a "
                             "replica takes over that long after the leader stopped renewing")
    parser.add_argument("--peering", metavar="NAME",
                        help="kopf peering name, for experiments only (use --leader-election-lease for "
                             "several replicas; default: standalone)")
    parser.add_argument("--log-format", choices=("text", "json"),
                        default=os.environ.get("STALLEDPOLICY_LOG_FORMAT", "text"))
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        default=os.environ.get("STALLEDPOLICY_LOG_LEVEL", "info"))


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    base = OperatorConfig.from_env()
    return OperatorConfig(
        sweeper_image=args.sweeper_image or base.sweeper_image,
        allowed_sweeper_images=(tuple(args.allowed_sweeper_image) if args.allowed_sweeper_image
                                else base.allowed_sweeper_images),
        status_interval=args.status_interval or base.status_interval,
        max_backoff=args.max_backoff or base.max_backoff,
        secret_ttl=base.secret_ttl,
        status_workers=args.status_workers or base.status_workers,
        redis_timeout=base.redis_timeout,
        api_timeout=base.api_timeout,
        metrics_port=base.metrics_port if args.metrics_port is None else args.metrics_port,
        metrics_address=args.metrics_address or base.metrics_address,
        liveness=args.liveness or base.liveness,
        leader_lease=args.leader_election_lease or base.leader_lease,
        lease_seconds=args.leader_election_duration or base.lease_seconds,
    )


def metrics_listen_problem(address: str, port: int) -> str | None:
    """Why the metrics server could not listen on ``address:port``, or None. Checked
    before kopf starts, so a port in use is one line and exit 2 (the server itself
    binds at kopf's startup: a port taken in between is the same line and exit 2,
    see _listen_failure)."""
    # deferred: the arguments are checked before kopf and the operator load
    from stalledpolicy.listen import listening_socket

    try:
        listening_socket(address, port).close()  # where the server will listen, fallback included
    except OSError as exc:
        return (f"--metrics-port {port} / --metrics-address {address}: cannot listen there "
                f"({exc.strerror or exc}); choose another port, or 0 for no metrics")
    return None


def ports_problem(metrics_port: int, liveness: str | None) -> str | None:
    """The metrics server and the liveness endpoint on one port, or None (as the
    chart's schema refuses operator.metricsPort equal to operator.livenessPort):
    the second server would fail to listen, or on some hosts share the port."""
    # deferred: the arguments are checked before kopf and the operator load
    from stalledpolicy.controller.liveness import parse_endpoint

    if not metrics_port or not liveness:
        return None
    try:
        _, liveness_port, _ = parse_endpoint(liveness)
    except ValueError:
        return None  # liveness_problem names it
    if liveness_port != metrics_port:
        return None
    return (f"--metrics-port {metrics_port} is also the port of --liveness {liveness}: the two endpoints "
            "need different ports; choose another --metrics-port (or 0 for no metrics)")


def liveness_problem(url: str) -> str | None:
    """Why the liveness endpoint could not be served at ``url``, or None; checked
    before kopf starts, as the metrics port is."""
    # deferred: the arguments are checked before kopf and the operator load
    from stalledpolicy.controller.liveness import parse_endpoint
    from stalledpolicy.listen import listening_socket

    try:
        address, port, _ = parse_endpoint(url)
        listening_socket(address, port).close()
    except ValueError as exc:
        return f"--liveness {exc}"
    except OSError as exc:
        return f"--liveness {url}: cannot listen there ({exc.strerror or exc}); choose another address or port"
    return None


def credentials_problem() -> str | None:
    """Why no Kubernetes credentials can be loaded, or None. Checked before kopf
    starts: kopf would retry its login every minute, with a traceback, for ever."""
    from kubernetes import config  # deferred: the kubernetes client takes 0.4 s to import

    try:
        config.load_incluster_config()
        return None
    except config.ConfigException:
        pass
    try:
        config.load_kube_config()
        return None
    except (config.ConfigException, OSError) as exc:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        return (f"no Kubernetes credentials: not running in a cluster (no service account) and the "
                f"kubeconfig {where} cannot be used ({type(exc).__name__}); give --kubeconfig FILE "
                "or set KUBECONFIG")


def use_kubeconfig(path: str) -> None:
    """Make ``path`` the kubeconfig of every later load without a file (ours, kopf's login).

    The kubernetes client reads KUBECONFIG once, when imported, into its default. The
    argument checks are pure so that nothing imports it before this runs (the Lease's
    check once did); should anything still have, its default is set as well."""
    os.environ["KUBECONFIG"] = path
    kube_config = sys.modules.get("kubernetes.config.kube_config")
    if kube_config is not None:
        vars(kube_config)["KUBE_CONFIG_DEFAULT_LOCATION"] = path


def run(args: argparse.Namespace) -> int:
    if not args.namespace and not args.all_namespaces:
        print("stalledpolicy operator: give --namespace NS (repeatable) or --all-namespaces",
              file=sys.stderr)
        return EXIT_USAGE
    if args.status_workers is not None and args.status_workers < 1:
        print("stalledpolicy operator: --status-workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.kubeconfig:
        if not os.path.isfile(args.kubeconfig):
            print(f"stalledpolicy operator: --kubeconfig {args.kubeconfig}: no such file",
                  file=sys.stderr)
            return EXIT_USAGE
        use_kubeconfig(args.kubeconfig)
    config = config_from_args(args)
    if config.lease_seconds < 3:
        # the leader is judged lost two thirds of it after a renewal: below 2 s a slow call would end it
        print("stalledpolicy operator: --leader-election-duration must be at least 3s", file=sys.stderr)
        return EXIT_USAGE
    problem = ports_problem(config.metrics_port, config.liveness)
    if problem is not None:
        print(f"stalledpolicy operator: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if config.metrics_port:
        problem = metrics_listen_problem(config.metrics_address, config.metrics_port)
        if problem is not None:
            print(f"stalledpolicy operator: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if config.liveness:
        problem = liveness_problem(config.liveness)
        if problem is not None:
            print(f"stalledpolicy operator: {problem}", file=sys.stderr)
            return EXIT_USAGE
    problem = credentials_problem()
    if problem is not None:
        print(f"stalledpolicy operator: {problem}", file=sys.stderr)
        return EXIT_USAGE
    # The kopf entry module reads its settings from the environment, so that
    # `kopf run -m stalledpolicy.controller.main` behaves the same.
    os.environ.update(config.to_env())

    from stalledpolicy import logs  # deferred: the arguments are checked before kopf and the operator load

    logs.configure(args.log_format, args.log_level)
    # deferred: the arguments are checked before kopf and the operator load
    from stalledpolicy.controller import logfilter

    logfilter.install()

    import kopf  # deferred: the arguments are checked before kopf and the operator load

    import stalledpolicy.controller.main  # noqa: F401 - registers the handlers

    try:
        kopf.run(
            standalone=args.peering is None,
            peering_name=args.peering,
            clusterwide=bool(args.all_namespaces),
            namespaces=tuple(args.namespace),
            # No liveness_endpoint: main.serve_liveness serves config.liveness
            # (docs/architecture.md, "`::` is IPv6 only").
        )
    except Exception as exc:
        failed = _listen_failure(exc)
        if failed is None:
            raise
        # the port was taken between the check above and the server's start
        print(f"stalledpolicy operator: {failed}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _listen_failure(exc: BaseException) -> BaseException | None:
    """The ListenFailed of a startup handler behind kopf's ActivityError, or None."""
    # deferred: the arguments are checked before kopf and the operator load
    from stalledpolicy.controller.main import ListenFailed

    outcomes = getattr(exc, "outcomes", None) or {}
    candidates = [exc, exc.__cause__, *(getattr(o, "exception", None) for o in outcomes.values())]
    return next((c for c in candidates if isinstance(c, ListenFailed)), None)
