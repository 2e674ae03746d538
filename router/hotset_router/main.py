"""``hotset-router``: the gateway in standalone mode (a list of worker URLs) or cluster mode.

Every option also reads an environment variable (``HOTSET_ROUTER_*``,
``HOTSET_ADMIN_TOKEN``), which is how the Helm chart configures it.
Arguments and environment are read here and nowhere else.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import Sequence

import uvicorn

from hotset_common import grpc_wire, labels, quantity, slow_clients, worker_identity
from hotset_common.worker_identity import BearerToken, PodProofs, ReviewedTokens, TokenReviews, WorkerIdentity
from hotset_common.worker_ownership import WorkerTrust
from hotset_router import jwt_issuers, prefix_routing
from hotset_router.api import DEFAULT_MAX_BODY_BYTES, create_app
from hotset_router.callers import DEFAULT_AUDIENCE, AuthMode, CallerSettings, KubernetesReviews, Reviews
from hotset_router.flood import Limits
from hotset_router.discovery import Discovery, KubeDiscovery, StaticDiscovery, read_model_store
from hotset_router.replication import ReplicationSettings
from hotset_router.service import RouterService, RouterSettings


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hotset-router", description=__doc__)
    p.add_argument("--workers", default=env("HOTSET_ROUTER_WORKERS", ""),
                   help="standalone mode: comma-separated worker URLs (http://host:port)")
    p.add_argument("--model-store", default=env("HOTSET_MODEL_STORE"),
                   help="standalone mode: the workers' model store JSON, for min/max copies of each model")
    p.add_argument("--cluster", action="store_true", default=env("HOTSET_ROUTER_CLUSTER", "") in ("1", "true"),
                   help="cluster mode: discover worker pods and ServedModels through the Kubernetes API")
    p.add_argument("--namespace", default=env("HOTSET_NAMESPACE", "default"))
    p.add_argument("--watch-namespaces", default=env("HOTSET_ROUTER_WATCH_NAMESPACES", ""),
                   help="cluster mode: comma-separated namespaces whose worker pods and ServedModels to watch; "
                        "'*': every namespace; empty: --namespace alone (match the operator's watchNamespaces)")
    p.add_argument("--worker-selector", default=env("HOTSET_WORKER_SELECTOR", labels.WORKER_SELECTOR))
    p.add_argument("--worker-port", type=int, default=int(env("HOTSET_WORKER_PORT", "8080")))
    p.add_argument("--worker-trust", choices=[t.value for t in WorkerTrust],
                   default=env("HOTSET_ROUTER_WORKER_TRUST", WorkerTrust.OWNED.value),
                   help="cluster mode: which labelled pods are workers: 'owned' (only pods of the operator's "
                        "Deployments: the chart's default), 'labelled' (every pod with --worker-selector's labels: "
                        "workers the operator did not make)")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"))
    p.add_argument("--host", default=env("HOTSET_ROUTER_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("HOTSET_ROUTER_PORT", "8080")))
    p.add_argument("--grpc-port", default=env("HOTSET_ROUTER_GRPC_PORT", ""),
                   help="also serve OIP v2 over gRPC on this port (the chart: "
                        f"{grpc_wire.DEFAULT_PORT}; 0: a free one); empty: no gRPC")
    p.add_argument("--admin-token", default=env("HOTSET_ADMIN_TOKEN"),
                   help="bearer token for load/unload through the gateway; without it they answer 403")
    p.add_argument("--max-body-bytes", default=env("HOTSET_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES)))
    p.add_argument("--sync-interval", type=float, default=float(env("HOTSET_ROUTER_SYNC_INTERVAL", "1.0")))
    p.add_argument("--request-timeout", type=float, default=float(env("HOTSET_ROUTER_REQUEST_TIMEOUT", "60")))
    p.add_argument("--load-timeout", type=float, default=float(env("HOTSET_ROUTER_LOAD_TIMEOUT", "300")))
    p.add_argument("--default-max-copies", type=int, default=int(env("HOTSET_ROUTER_DEFAULT_MAX_COPIES", "1")))
    p.add_argument("--llm-routing", choices=[m.value for m in prefix_routing.Mode],
                   default=env("HOTSET_ROUTER_LLM_ROUTING", prefix_routing.Mode.PREFIX.value),
                   help="how an OpenAI request's copy is chosen among its model's ready copies: 'prefix' (the copy "
                        "whose engine holds most of its prompt, with the engines' queues and KV-cache use), "
                        "'random' (any, uniformly: a baseline for benchmarks)")
    p.add_argument("--replicate-rps-per-copy", type=float, default=float(env("HOTSET_ROUTER_REPLICATE_RPS", "20")))
    p.add_argument("--replicate-inflight-per-copy", type=float, default=float(env("HOTSET_ROUTER_REPLICATE_INFLIGHT", "4")))
    p.add_argument("--replicate-window", type=float, default=float(env("HOTSET_ROUTER_REPLICATE_WINDOW", "5")))
    p.add_argument("--idle-copy-seconds", type=float, default=float(env("HOTSET_ROUTER_IDLE_COPY_SECONDS", "60")))
    p.add_argument("--churn-guard-seconds", type=float, default=float(env("HOTSET_ROUTER_CHURN_GUARD_SECONDS", "30")),
                   help="replication: no copy added right after one was removed, and the reverse, for this long "
                        "(eviction follows each worker's own churn guard, from its report)")
    p.add_argument("--worker-token", default=env("HOTSET_WORKER_TOKEN", ""),
                   help="one fixed bearer token the workers require (a local stack); empty: none")
    p.add_argument("--worker-token-file", default=env("HOTSET_WORKER_TOKEN_FILE", ""),
                   help="cluster mode: the router's own ServiceAccount token for workers (a projected token for "
                        f"the audience {worker_identity.CALLER_AUDIENCE}), read again as the kubelet rotates it")
    p.add_argument("--worker-identity", choices=[m.value for m in WorkerIdentity],
                   default=env("HOTSET_ROUTER_WORKER_IDENTITY", WorkerIdentity.NONE.value),
                   help="cluster mode: 'pod-token' (the chart's): a worker pod gets nothing until its identity "
                        "token, reviewed by the API server, is bound to the pod discovered at its address; "
                        "'none': pods are not asked (tests with hand-made pods)")
    p.add_argument("--max-requests", type=int, default=int(env("HOTSET_ROUTER_MAX_REQUESTS", "1024")),
                   help="inference requests served at once; past it 503 with Retry-After")
    p.add_argument("--max-body-bytes-in-flight", default=env("HOTSET_ROUTER_MAX_BODY_BYTES_IN_FLIGHT", "512Mi"),
                   help="bytes of request bodies held at once; past it 503 with Retry-After")
    p.add_argument("--max-cold-waiters", type=int, default=int(env("HOTSET_ROUTER_MAX_COLD_WAITERS", "256")),
                   help="requests per model that may wait while it has no ready copy; past it 503 with Retry-After")
    p.add_argument("--watch-timeout", type=float, default=float(env("HOTSET_ROUTER_WATCH_TIMEOUT", "300")),
                   help="cluster mode: seconds a Kubernetes watch runs before it is restarted (also its read timeout)")
    p.add_argument("--router-id", default=env("HOTSET_ROUTER_ID", ""),
                   help="this replica's name to the workers, unique among the replicas (default: host name and "
                        "process id; the pod name in cluster mode)")
    p.add_argument("--max-model-series", type=int, default=int(env("HOTSET_ROUTER_MAX_MODEL_SERIES", "500")),
                   help="models with per-model metric series at once; the rest are counted as model=\"_other\"")
    p.add_argument("--model-series-idle-seconds", type=float,
                   default=float(env("HOTSET_ROUTER_MODEL_SERIES_IDLE_SECONDS", "300")),
                   help="a model's metric series go after this long without a request")
    p.add_argument("--auth", choices=[m.value for m in AuthMode], default=env("HOTSET_ROUTER_AUTH", AuthMode.NONE.value),
                   help="who may call: 'none' (everyone: the local stack), 'kubernetes' (cluster mode: a bearer "
                        "token checked by TokenReview, each model by a SubjectAccessReview of create on "
                        "servedmodels/predict; the chart's default)")
    p.add_argument("--auth-audiences", default=env("HOTSET_ROUTER_AUTH_AUDIENCES", DEFAULT_AUDIENCE),
                   help="comma-separated audiences a caller's token must be made for (empty: the API server's own)")
    p.add_argument("--auth-cache-seconds", type=float, default=float(env("HOTSET_ROUTER_AUTH_CACHE_SECONDS", "30")),
                   help="how long an identity or a grant is kept before the API server is asked again "
                        "(a refusal: 5 s at most)")
    p.add_argument("--auth-config", default=env("HOTSET_ROUTER_AUTH_CONFIG", ""),
                   help="an AuthenticationConfiguration file (Kubernetes' own format, apiserver.config.k8s.io): "
                        "the OIDC issuers whose tokens the router verifies itself, beside the TokenReview "
                        "(with --auth kubernetes)")
    p.add_argument("--log-level", default=env("HOTSET_LOG_LEVEL", "info"))
    slow_clients.add_arguments(p)
    return p.parse_args(argv)


def build_discovery(args: argparse.Namespace) -> Discovery:
    if args.cluster:
        from kubernetes import config

        if args.kubeconfig:
            config.load_kube_config(args.kubeconfig)
        else:
            config.load_incluster_config()
        namespaces = [n.strip() for n in args.watch_namespaces.split(",") if n.strip()] or [args.namespace]
        discovery = KubeDiscovery(args.namespace, args.worker_selector, args.worker_port, namespaces=namespaces,
                                  watch_timeout_s=args.watch_timeout, trust=WorkerTrust(args.worker_trust))
        discovery.start()
        return discovery
    urls = [u.strip() for u in args.workers.split(",") if u.strip()]
    if not urls:
        raise SystemExit("hotset-router: give --workers URL,URL... (standalone) or --cluster")
    specs = read_model_store(Path(args.model_store)) if args.model_store else {}
    return StaticDiscovery(urls, specs)


def build_settings(args: argparse.Namespace) -> RouterSettings:
    return RouterSettings(
        sync_interval_s=args.sync_interval,
        control_interval_s=args.sync_interval,
        request_timeout_s=args.request_timeout,
        load_timeout_s=args.load_timeout,
        worker_credential=worker_credential(args),
        default_max_copies=args.default_max_copies,
        router_id=args.router_id or f"{socket.gethostname()}-{os.getpid()}",
        max_model_series=args.max_model_series,
        model_series_idle_s=args.model_series_idle_seconds,
        callers=caller_settings(args),
        llm_routing=prefix_routing.Mode(args.llm_routing),
        freeze_heap=True,  # the command's start-up, the first reports included (service.py, heap.py)
        replication=ReplicationSettings(
            rps_per_copy=args.replicate_rps_per_copy,
            inflight_per_copy=args.replicate_inflight_per_copy,
            window_s=args.replicate_window,
            idle_s=args.idle_copy_seconds,
            churn_guard_s=args.churn_guard_seconds,
        ),
    )


def worker_credential(args: argparse.Namespace) -> BearerToken:
    if args.worker_token.strip() and args.worker_token_file.strip():
        raise SystemExit("hotset-router: --worker-token and --worker-token-file are two credentials for workers; give one")
    return BearerToken(args.worker_token, args.worker_token_file.strip() or None)


def build_proofs(args: argparse.Namespace) -> PodProofs | None:
    """Cluster mode with worker identity on: the pods' identity tokens reviewed by the API server
    (the client build_discovery configured; the chart grants create on tokenreviews)."""
    if WorkerIdentity(args.worker_identity) is WorkerIdentity.NONE:
        return None
    if not args.cluster:
        raise SystemExit("hotset-router: --worker-identity pod-token needs --cluster (pods prove themselves to the "
                         "Kubernetes API)")
    return PodProofs(ReviewedTokens(TokenReviews(None, worker_identity.IDENTITY_AUDIENCE)))


def caller_settings(args: argparse.Namespace) -> CallerSettings:
    mode = AuthMode(args.auth)
    if mode == AuthMode.KUBERNETES and not args.cluster:
        raise SystemExit("hotset-router: --auth kubernetes needs --cluster (callers are checked by the Kubernetes API)")
    audiences = tuple(a.strip() for a in args.auth_audiences.split(",") if a.strip())
    issuers = jwt_issuers.load_configuration(Path(args.auth_config)) if args.auth_config else ()
    if issuers and mode != AuthMode.KUBERNETES:
        raise SystemExit("hotset-router: --auth-config needs --auth kubernetes (a SubjectAccessReview decides "
                         "which models a verified caller may call)")
    return CallerSettings(mode=mode, audiences=audiences, cache_s=args.auth_cache_seconds,
                          refused_cache_s=min(5.0, args.auth_cache_seconds), issuers=issuers)


def build_reviews(settings: CallerSettings) -> Reviews | None:
    """The API server's TokenReview and SubjectAccessReview, with the client build_discovery configured."""
    if settings.mode != AuthMode.KUBERNETES:
        return None
    return KubernetesReviews(None, settings.audiences, settings.review_timeout_s)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = build_settings(args)
    service = RouterService(build_discovery(args), settings, build_reviews(settings.callers), build_proofs(args))
    limits = Limits(max_requests=args.max_requests,
                    max_body_bytes_in_flight=quantity.parse_bytes(args.max_body_bytes_in_flight),
                    max_cold_waiters=args.max_cold_waiters)
    grpc_port = args.grpc_port.strip()
    if grpc_port and not grpc_port.isdigit():
        raise SystemExit(f"hotset-router: --grpc-port must be a port number or empty, got {args.grpc_port!r}")
    client_limits = slow_clients.from_arguments(args)
    app = create_app(service, args.admin_token, quantity.parse_bytes(args.max_body_bytes), limits,
                     grpc_address=f"{args.host}:{grpc_port}" if grpc_port else None, client_limits=client_limits)
    # timeout_graceful_shutdown: on SIGTERM, requests in flight get this long to finish.
    uvicorn.run(host=args.host, port=args.port, log_level=args.log_level.lower(), access_log=False,
                timeout_graceful_shutdown=30, **slow_clients.serve_options(app, client_limits))


if __name__ == "__main__":
    main()
