"""The custom resources the operator watches, as kopf and the kubernetes client name them.

ServedModel is shared with the router (hotset_common.spec); WorkerPool
(a pool's size, with a scale subresource for the HPA or KEDA) and ModelQuota
(a namespace's allowance) are the operator's alone.
"""
from __future__ import annotations

from hotset_common.spec import GROUP, KIND, PLURAL, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
SERVED_MODEL = KIND
SERVED_MODELS = {"group": GROUP, "version": VERSION, "plural": PLURAL}
WORKER_POOL = "WorkerPool"
WORKER_POOLS = {"group": GROUP, "version": VERSION, "plural": "workerpools"}
MODEL_QUOTA = "ModelQuota"
MODEL_QUOTAS = {"group": GROUP, "version": VERSION, "plural": "modelquotas"}
# The Gateway API Inference Extension's pool of model-server pods, published per dedicated vllm
# group (an option: the chart's inferencePool); its CRD is the extension's, installed by the cluster.
INFERENCE_POOL = "InferencePool"
INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"
INFERENCE_POOLS = {"group": "inference.networking.k8s.io", "version": "v1", "plural": "inferencepools"}
# What the operator watches besides its own kinds: its worker pods, the Deployments it made.
PODS = {"group": "", "version": "v1", "plural": "pods"}
DEPLOYMENTS = {"group": "apps", "version": "v1", "plural": "deployments"}
# Which ReplicaSet owns a labelled pod, and which Deployment that ReplicaSet (hotset_common.worker_ownership).
REPLICA_SETS = {"group": "apps", "version": "v1", "plural": "replicasets"}
