"""`moe-operator run`: the operator (reconciler + admission webhook) against the current KUBECONFIG."""

from __future__ import annotations

import argparse
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from moe_operator.api import keys as K
from moe_operator.cli.webhook import certificate_source, watch_certificate, webhook_files
from moe_operator.render.network import NetworkSettings, SelectorError
from moe_operator.render.network import add_flags as add_network_flags
from moe_operator.render.network import from_args as network_from_args
from moe_operator.validation.platform import PlatformPolicy, PolicyError
from moe_operator.validation.platform import add_flags as add_platform_flags


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the operator against the current KUBECONFIG (or in-cluster config)",
        description="Reconciles MoEDeployments and serves the validating admission webhook.",
    )
    p.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    p.add_argument(
        "--peering",
        default="moe-operator",
        metavar="NAME",
        help="the kopf peering object through which replicas elect the one that acts (a ClusterKopfPeering, "
        "or a KopfPeering per namespace with --namespace); without it the operator runs alone",
    )
    p.add_argument(
        "--peering-required",
        action="store_true",
        help="refuse to run without the peering object (set when several replicas run)",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; default: earlier-started replicas first, so a restarted one never "
        "takes over from a healthy leader",
    )
    p.add_argument(
        "--peering-lifetime",
        type=int,
        default=15,
        help="seconds a replica's peering record lives: a dead leader is replaced within about this",
    )
    p.add_argument("--standalone", action="store_true", help="no peering at all: only one replica may run")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint URL")
    p.add_argument("--metrics-port", type=int, default=9100, help="Prometheus metrics port (0 disables)")
    p.add_argument("--webhook-addr", default="127.0.0.1", help="address the webhook server listens on")
    p.add_argument("--webhook-host", default=None, help="hostname/IP the apiserver calls (default: addr)")
    p.add_argument("--webhook-port", type=int, default=9443)
    p.add_argument("--webhook-cert", type=Path, default=None, help="serving cert (default: generated)")
    p.add_argument("--webhook-key", type=Path, default=None)
    p.add_argument("--webhook-ca", type=Path, default=None, help="CA bundle the apiserver trusts the cert by")
    p.add_argument("--no-webhook", action="store_true", help="do not serve or register the webhook")
    p.add_argument(
        "--webhook-cert-secret",
        default=None,
        metavar="NAME",
        help="keep the generated webhook CA and certificate in this Secret (in --webhook-cert-namespace), "
        "so every replica serves the same one; renewed near expiry",
    )
    p.add_argument(
        "--webhook-cert-namespace",
        default=os.environ.get("POD_NAMESPACE", "moe-system"),
        help="namespace of --webhook-cert-secret (default: $POD_NAMESPACE, else moe-system)",
    )
    p.add_argument(
        "--runtime-image",
        default=os.environ.get("MOE_RUNTIME_IMAGE", "ghcr.io/moe-inference/moe-runtime:0.1.0"),
        help="image whose /opt/moe-runtime is copied into engine pods",
    )
    add_platform_flags(p)
    add_network_flags(p)
    p.add_argument(
        "--planning",
        choices=["runtimes", "operator"],
        default="runtimes",
        help="where each engine instance's expert placement is planned (eplb mode operator): by the "
        "instance's own runtime, the operator checking and scoring each proposal itself (an instance "
        "whose runtime does not propose is planned here), or all in the operator's process; docs/scale.md",
    )
    p.add_argument(
        "--apply-concurrency",
        type=int,
        default=8,
        help="server-side applies in flight at once across reconciles (1: one by one)",
    )
    p.set_defaults(func=run)


class RoutineSuccessFilter(logging.Filter):
    """Drops kopf's INFO success line of the named handlers; keeps everything else.

    For handlers that run every second per deployment or on every watched event: kopf logs each
    success, which at 1,000 deployments is 1,000+ lines a second of noise. Failures still show.
    """

    def __init__(self, handler_names: Iterable[str]) -> None:
        super().__init__()
        names = "|".join(re.escape(n) for n in handler_names)
        self._routine = re.compile(rf"^(Timer|Handler) '({names})' succeeded\.$")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and self._routine.match(record.getMessage()))


def platform_policy(args: argparse.Namespace) -> PlatformPolicy:
    """The platform's limits from the flags; a wrong policy stops the operator before it admits anything."""
    try:
        policy = PlatformPolicy.from_args(args)
    except PolicyError as exc:
        raise SystemExit(f"moe-operator run: the platform policy is refused: {exc}") from exc
    logging.getLogger(__name__).info(f"platform policy: {policy.to_values()}")
    return policy


def network_settings(args: argparse.Namespace) -> NetworkSettings:
    """The engine pods' NetworkPolicy settings from the flags; a bad selector stops the operator."""
    try:
        net = network_from_args(args)
    except SelectorError as exc:
        raise SystemExit(f"moe-operator run: {exc}") from exc
    logging.getLogger(__name__).info(f"network policy: {net}")
    return net


# Events are best effort: the status carries every decision. kopf retries a refused post, 403
# included, and a namespace being deleted refuses every post with 403 (NamespaceTerminating):
# kopf's default (1, 1, 2, 3, 5, 8, 13, 21) spends 54 s and 9 writes on each such event.
EVENT_BACKOFFS_S = (1.0, 2.0, 4.0)

OPTIONAL_APIS = {
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
    "PodMonitor": ("monitoring.coreos.com/v1", "podmonitors"),
    "PrometheusRule": ("monitoring.coreos.com/v1", "prometheusrules"),
    "ComputeDomain": ("resource.nvidia.com/v1beta1", "computedomains"),
}


def served_optional_kinds(kube: Any) -> frozenset[str]:
    """The optional kinds the cluster serves (discovery), asked once at start."""
    from moe_operator.handlers.kube import KubeError

    found: set[str] = set()
    groups: dict[str, set[str]] = {}
    for kind, (group_version, plural) in OPTIONAL_APIS.items():
        if group_version not in groups:
            try:
                doc = kube.get(f"/apis/{group_version}") or {}
            except KubeError as exc:
                logging.getLogger(__name__).warning(f"cannot tell whether {group_version} is served: {exc}")
                doc = {}
            groups[group_version] = {str(r.get("name")) for r in doc.get("resources") or []}
        if plural in groups[group_version]:
            found.add(kind)
    return frozenset(found)


def configure_peering(settings: Any, args: argparse.Namespace) -> None:
    """Leader election through kopf peering: the replica with the highest priority acts, the others
    pause until its record (``--peering-lifetime`` seconds) expires. The default priority is minus
    the start time in microseconds: the oldest live replica leads, ties cannot happen in practice
    (kopf freezes every replica of equal priority), and a restarted replica waits behind the leader."""
    settings.peering.name = args.peering
    settings.peering.mandatory = args.peering_required
    settings.peering.priority = args.priority if args.priority is not None else -(time.time_ns() // 1000)
    settings.peering.lifetime = args.peering_lifetime
    settings.peering.stealth = True  # keep-alives are not logged


# A timer tick still running when its object is deleted holds the finalizer. kopf looks again after
# cancellation_polling, 60 s by default: a delete that lands mid-tick (control loop every 5 s) took a
# minute. Ticks are bounded (each read times out in seconds), so wait for one briefly (each of the
# object's timers in turn, in its own worker; kopf advises well under a second), then look often.
TICK_EXIT_WAIT_S = 0.2
TICK_EXIT_POLL_S = 2.0


def configure_timer_exit(settings: Any) -> None:
    """How long a deletion waits for a timer tick in flight: seconds, not kopf's default minute."""
    settings.background.instant_exit_timeout = TICK_EXIT_WAIT_S
    settings.background.cancellation_polling = TICK_EXIT_POLL_S


def run(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    from moe_operator.handlers import autoscale_loop, control_loop, indexes, reconcile  # noqa: F401  (registers handlers)

    if not args.no_webhook:
        # Imported only when served: kopf refuses to start with admission handlers and no server.
        from moe_operator.handlers import admission  # noqa: F401
    from moe_operator.handlers.kube import Kube
    from moe_operator.handlers.metrics import OperatorMetrics
    from moe_operator.handlers.state import OperatorState
    from moe_operator.handlers.wakeups import Wakeups
    from moe_operator.hardware import PROFILES_ENV, profile_names
    from moe_operator.render.group import RuntimeSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # a platform's malformed profile file stops the operator here, with the reason
        logging.getLogger(__name__).info(f"hardware profiles: {', '.join(profile_names())}")
    except (OSError, ValueError) as exc:
        logging.getLogger(__name__).error(f"cannot load the hardware profiles ({PROFILES_ENV}): {exc}")
        return 2
    routine: tuple[Callable[..., Any], ...] = (
        reconcile.on_timer,
        reconcile.on_child_event,
        reconcile.on_event,
        control_loop.control_timer,
        autoscale_loop.autoscale_timer,
    )
    logging.getLogger("kopf.objects").addFilter(RoutineSuccessFilter(f.__name__ for f in routine))
    metrics = OperatorMetrics()
    state = OperatorState(
        kube=Kube(
            apply_concurrency=args.apply_concurrency,
            on_request=lambda verb: metrics.counter("moe_operator_api_requests_total", verb).inc(),
        ),
        settings=RuntimeSettings(runtime_image=args.runtime_image, network=network_settings(args)),
        metrics=metrics,
        wakeups=Wakeups(reconcile.RECONCILE_INTERVAL_S),
        platform=platform_policy(args),
        planning=args.planning,
    )
    if args.metrics_port:
        start_http_server(args.metrics_port, addr="0.0.0.0", registry=metrics.registry)
    webhook = None if args.no_webhook else webhook_files(args, state.kube)
    if webhook is not None:
        watch_certificate(webhook[0], certificate_source(args, state.kube))

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=K.DOMAIN)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=K.DOMAIN, key="last-handled-configuration"
        )
        settings.persistence.finalizer = K.FINALIZER
        settings.posting.level = logging.WARNING  # decisions are posted explicitly as events
        settings.posting.default_backoffs = EVENT_BACKOFFS_S
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.inactivity_timeout = 600
        settings.execution.max_workers = 16
        configure_peering(settings, args)
        configure_timer_exit(settings)
        state.executor = settings.execution.executor
        # kopf only watches what discovery listed at start: optional kinds are used only when watched.
        state.watched_kinds = served_optional_kinds(state.kube)
        logging.getLogger(__name__).info(
            f"optional APIs served at start: {sorted(state.watched_kinds) or 'none'}"
        )
        if webhook is not None:
            cert, key, ca = webhook
            settings.admission.server = kopf.WebhookServer(
                addr=args.webhook_addr,
                port=args.webhook_port,
                host=args.webhook_host or args.webhook_addr,
                certfile=str(cert),
                pkeyfile=str(key),
                cafile=str(ca),
            )
            settings.admission.managed = K.DOMAIN

    kopf.run(
        memo=kopf.Memo(operator=state),
        standalone=True if args.standalone else None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
    )
    return 0
