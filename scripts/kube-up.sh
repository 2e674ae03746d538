#!/usr/bin/env bash
# Starts a real, throw-away Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) on 127.0.0.1 and prints its
# KUBECONFIG. Ctrl-C stops everything. Needs `make install install-k8s` first.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHONPATH="$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m hotset_testing.kube_cluster --manifest "$ROOT/crds/servedmodel.yaml" "$@"
