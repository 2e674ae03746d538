"""The custom resources the operator watches, as kopf and the kubernetes client name them.

ServedModel is shared with the router (modelplane_common.spec); WorkerPool
(a pool's size, with a scale subresource for the HPA or KEDA) and ModelQuota
(a namespace's allowance) are the operator's alone.
"""
from __future__ import annotations

from modelplane_common.spec import GROUP, PLURAL, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
SERVED_MODELS = {"group": GROUP, "version": VERSION, "plural": PLURAL}
WORKER_POOL = "WorkerPool"
WORKER_POOLS = {"group": GROUP, "version": VERSION, "plural": "workerpools"}
MODEL_QUOTA = "ModelQuota"
MODEL_QUOTAS = {"group": GROUP, "version": VERSION, "plural": "modelquotas"}
