"""`hotset-operator`: parse settings, then run kopf with the operator's handlers.

Settings come from the command line or HOTSET_OPERATOR_* variables (the
Helm chart sets these); both are read here and nowhere else.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import kopf
import prometheus_client
import pydantic

from hotset_operator.config import OperatorConfig
from hotset_operator.handlers import build_registry
from hotset_operator.metrics import OperatorMetrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hotset-operator", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default=None,
                        help="the operator's namespace, where the shared pool lives (default: HOTSET_OPERATOR_NAMESPACE, "
                             "else the pod's namespace, else 'default'); HOTSET_OPERATOR_WATCH_NAMESPACES adds others")
    parser.add_argument("--log-level", default=os.environ.get("HOTSET_LOG_LEVEL", "INFO"))
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="kopf's liveness endpoint for the Deployment's probe")
    return parser.parse_args(argv)


def _pod_namespace() -> str | None:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    return open(path).read().strip() if os.path.exists(path) else None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespace = args.namespace or os.environ.get("HOTSET_OPERATOR_NAMESPACE") or _pod_namespace() or "default"
    try:
        config = OperatorConfig.from_env(namespace=namespace)
    except pydantic.ValidationError as exc:
        sys.exit(f"hotset-operator: invalid settings: {exc}")
    metrics = OperatorMetrics()
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port, registry=metrics.registry)
    namespaces = config.served_namespaces()
    kopf.run(registry=build_registry(config, metrics), standalone=True, clusterwide=not namespaces,
             namespaces=namespaces, liveness_endpoint=args.liveness)


if __name__ == "__main__":
    main()
