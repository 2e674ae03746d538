"""Label keys and values on the Kubernetes objects modelplane creates.

The operator stamps them on worker pods; the router selects worker pods by
them. One definition so the selector and the stamp cannot disagree.
"""
from __future__ import annotations

PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
NAME = "app.kubernetes.io/name"
POOL = "modelplane.io/pool"              # "shared" or the ServedModel name of a dedicated group
SERVED_MODEL = "modelplane.io/servedmodel"  # on dedicated workloads: the model they pin

PROJECT = "modelplane"
WORKER = "worker"
OPERATOR = "operator"
SHARED_POOL = "shared"

# Every modelplane worker pod, shared or dedicated, matches this selector.
WORKER_SELECTOR = f"{PART_OF}={PROJECT},{COMPONENT}={WORKER}"
