"""Prometheus metric names, one scheme for every framework and component."""
from __future__ import annotations

PREFIX = "modelplane"

REQUESTS_TOTAL = f"{PREFIX}_requests_total"            # labels: model, framework, pod, code
REQUEST_SECONDS = f"{PREFIX}_request_seconds"          # histogram; labels: model, framework, pod
MODEL_LOAD_SECONDS = f"{PREFIX}_model_load_seconds"    # histogram; labels: model, framework, pod
MODEL_LOADS_TOTAL = f"{PREFIX}_model_loads_total"      # labels: model, framework, pod, result
EVICTIONS_TOTAL = f"{PREFIX}_evictions_total"          # labels: model, framework, pod
MODEL_BYTES = f"{PREFIX}_model_bytes"                  # gauge; labels: model, framework, pod
MEMORY_USED_BYTES = f"{PREFIX}_memory_used_bytes"      # gauge; labels: pod
MEMORY_BUDGET_BYTES = f"{PREFIX}_memory_budget_bytes"  # gauge; labels: pod
QUEUED_REQUESTS = f"{PREFIX}_queued_requests"          # gauge: requests waiting for room; labels: model, framework, pod
QUEUE_WAIT_SECONDS = f"{PREFIX}_queue_wait_seconds"    # histogram; labels: model, framework, pod
REFUSALS_TOTAL = f"{PREFIX}_refusals_total"            # 503s for lack of room, 429s of a full per-model queue; labels: model, framework, pod, reason
INFLIGHT_REQUESTS = f"{PREFIX}_inflight_requests"      # gauge: inference requests being served now; labels: model, framework, pod
MODEL_QUEUED_REQUESTS = f"{PREFIX}_model_queued_requests"  # gauge: requests waiting for a slot of spec.maxConcurrency; labels: model, framework, pod
ROUTER_REQUESTS_TOTAL = f"{PREFIX}_router_requests_total"      # labels: model, code
ROUTER_REQUEST_SECONDS = f"{PREFIX}_router_request_seconds"    # labels: model
ROUTER_PLACEMENTS_TOTAL = f"{PREFIX}_router_placements_total"  # labels: model, pod, reason
ROUTER_RETRIES_TOTAL = f"{PREFIX}_router_retries_total"        # labels: model
