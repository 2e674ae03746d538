"""Prometheus metric names, one scheme for every framework and component."""
from __future__ import annotations

PREFIX = "hotset"

REQUESTS_TOTAL = f"{PREFIX}_requests_total"            # labels: model, framework, pod, code
REQUEST_SECONDS = f"{PREFIX}_request_seconds"          # histogram; labels: model, framework, pod
MODEL_LOAD_SECONDS = f"{PREFIX}_model_load_seconds"    # histogram; labels: model, framework, pod
MODEL_LOADS_TOTAL = f"{PREFIX}_model_loads_total"      # labels: model, framework, pod, result
MODEL_WARMUP_SECONDS = f"{PREFIX}_model_warmup_seconds"  # histogram: spec.warmup after a load; labels: model, framework, pod
EVICTIONS_TOTAL = f"{PREFIX}_evictions_total"          # labels: model, framework, pod
MODEL_BYTES = f"{PREFIX}_model_bytes"                  # gauge; labels: model, framework, pod
MEMORY_USED_BYTES = f"{PREFIX}_memory_used_bytes"      # gauge; labels: pod
MEMORY_BUDGET_BYTES = f"{PREFIX}_memory_budget_bytes"  # gauge; labels: pod
QUEUED_REQUESTS = f"{PREFIX}_queued_requests"          # gauge: requests waiting for room; labels: model, framework, pod
QUEUE_WAIT_SECONDS = f"{PREFIX}_queue_wait_seconds"    # histogram; labels: model, framework, pod
REFUSALS_TOTAL = f"{PREFIX}_refusals_total"            # 503s for lack of room, 429s of a full per-model queue; labels: model, framework, pod, reason
INFLIGHT_REQUESTS = f"{PREFIX}_inflight_requests"      # gauge: inference requests being served now; labels: model, framework, pod
MODEL_QUEUED_REQUESTS = f"{PREFIX}_model_queued_requests"  # gauge: requests waiting for a slot of spec.maxConcurrency; labels: model, framework, pod
MODEL_SERIES = f"{PREFIX}_model_series"                # gauge: models with per-model series of their own (model_series.py); labels: pod
SHARE_WEIGHT = f"{PREFIX}_share_weight"                # gauge: a namespace's weight in the inference threads' shares (as the router last sent it); labels: namespace, pod
# Remote model sources (s3://, gs://, hf://, https://) and the pod's source cache.
SOURCE_FETCHES_TOTAL = f"{PREFIX}_source_fetches_total"          # labels: model, framework, pod, scheme, result (hit, download, failure)
SOURCE_CACHE_HITS_TOTAL = f"{PREFIX}_source_cache_hits_total"    # loads served from the cache; labels: model, framework, pod, scheme
SOURCE_DOWNLOAD_BYTES_TOTAL = f"{PREFIX}_source_download_bytes_total"  # labels: model, framework, pod, scheme
SOURCE_DOWNLOAD_SECONDS = f"{PREFIX}_source_download_seconds"    # histogram; labels: model, framework, pod, scheme
SOURCE_CACHE_BYTES = f"{PREFIX}_source_cache_bytes"              # gauge: entries and fills in progress; labels: pod
SOURCE_CACHE_BUDGET_BYTES = f"{PREFIX}_source_cache_budget_bytes"  # gauge; labels: pod
SOURCE_CACHE_EVICTIONS_TOTAL = f"{PREFIX}_source_cache_evictions_total"  # labels: pod
# Dynamic batching of in-process models (worker-image/hotset_worker/batching.py); labels: model, framework, pod.
BATCH_ROWS = f"{PREFIX}_batch_rows"                    # histogram: rows per forward pass
BATCH_REQUESTS = f"{PREFIX}_batch_requests"            # histogram: requests per forward pass
BATCH_QUEUE_SECONDS = f"{PREFIX}_batch_queue_seconds"  # histogram: a request's wait for its pass to start
# Token metrics of generative models (OpenAI routes), every framework alike; labels: model, framework, pod.
TIME_TO_FIRST_TOKEN_SECONDS = f"{PREFIX}_time_to_first_token_seconds"        # histogram: request arrival -> first token
TIME_PER_OUTPUT_TOKEN_SECONDS = f"{PREFIX}_time_per_output_token_seconds"    # histogram: per request, (last - first) / (tokens - 1)
OUTPUT_TOKENS_PER_SECOND = f"{PREFIX}_output_tokens_per_second"              # histogram: per request, tokens / generation seconds
PROMPT_TOKENS_TOTAL = f"{PREFIX}_prompt_tokens_total"                        # counter
OUTPUT_TOKENS_TOTAL = f"{PREFIX}_output_tokens_total"                        # counter: rate() is the model's tokens per second
ROUTER_REQUESTS_TOTAL = f"{PREFIX}_router_requests_total"      # labels: model, code
ROUTER_REQUEST_SECONDS = f"{PREFIX}_router_request_seconds"    # labels: model
ROUTER_PLACEMENTS_TOTAL = f"{PREFIX}_router_placements_total"  # labels: model, reason
ROUTER_RETRIES_TOTAL = f"{PREFIX}_router_retries_total"        # labels: model
ROUTER_COPY_REMOVALS_TOTAL = f"{PREFIX}_router_copy_removals_total"  # idle extra copies unloaded; labels: model
ROUTER_PODS = f"{PREFIX}_router_pods"                          # gauge: worker pods in the router's map
ROUTER_UNOWNED_WORKER_PODS = f"{PREFIX}_router_unowned_worker_pods"  # gauge: labelled pods sent nothing: unowned or unproven
ROUTER_POD_WAITS_TOTAL = f"{PREFIX}_router_pod_waits_total"    # requests held for a pod to start; labels: model, result
ROUTER_CALLER_REVIEWS_TOTAL = f"{PREFIX}_router_caller_reviews_total"  # API calls checking callers; labels: question, answer
ROUTER_POD_WAIT_SECONDS = f"{PREFIX}_router_pod_wait_seconds"  # histogram: how long they were held; labels: model
# The operator's pools (a shared pool per pool namespace, a dedicated group per model); labels: namespace, pool.
POOL_PODS = f"{PREFIX}_pool_pods"                              # gauge: the Deployment's replicas now
POOL_DESIRED_PODS = f"{PREFIX}_pool_desired_pods"              # gauge: what the autoscaler asks for
POOL_MIN_PODS = f"{PREFIX}_pool_min_pods"                      # gauge
POOL_MAX_PODS = f"{PREFIX}_pool_max_pods"                      # gauge
POOL_LOWER_BOUND_PODS = f"{PREFIX}_pool_lower_bound_pods"      # gauge: no packing of the wanted copies uses fewer
POOL_WANTED_BYTES = f"{PREFIX}_pool_wanted_bytes"              # gauge: bytes of the copies the pool should hold
POOL_SCALE_EVENTS_TOTAL = f"{PREFIX}_pool_scale_events_total"  # labels: namespace, pool, direction (up, down)
QUOTA_USED = f"{PREFIX}_quota_used"                            # gauge; labels: namespace, resource (memory, copies, gpus)
QUOTA_LIMIT = f"{PREFIX}_quota_limit"                          # gauge; labels: namespace, resource
QUOTA_REFUSED_MODELS = f"{PREFIX}_quota_refused_models"        # gauge: models refused for the quota; labels: namespace
# The operator's own work, which follows what changes (docs/operator.md, "Cost follows change").
OPERATOR_ADMISSION_PASSES_TOTAL = f"{PREFIX}_operator_admission_passes_total"  # labels: kind (all, appended)
OPERATOR_ADMISSION_DECISIONS_TOTAL = f"{PREFIX}_operator_admission_decisions_total"  # models judged, all passes
OPERATOR_POOL_PASSES_TOTAL = f"{PREFIX}_operator_pool_passes_total"  # pool sizing passes (one per sync interval)
OPERATOR_STATUS_WRITES_TOTAL = f"{PREFIX}_operator_status_writes_total"  # labels: resource (servedmodels, ...)
OPERATOR_WRITES_PENDING = f"{PREFIX}_operator_writes_pending"  # gauge: status writes and events not yet sent
OPERATOR_UNOWNED_WORKER_PODS = f"{PREFIX}_operator_unowned_worker_pods"  # gauge: labelled pods it asks nothing: unowned or unproven
OPERATOR_REPORT_BYTES_TOTAL = f"{PREFIX}_operator_report_bytes_total"  # bytes of worker /status answers read
CATALOG_MODELS = f"{PREFIX}_catalog_models"                    # gauge: entries of a catalog; labels: namespace, store
# 1 per accepted ServedModel: whom to call about it (dashboards and alerts join it on `model`).
MODEL_INFO = f"{PREFIX}_model_info"                              # gauge; labels: namespace, model, owner, oncall, latency_class
ROUTER_VERSION_REQUESTS_TOTAL = f"{PREFIX}_router_version_requests_total"  # answers by version; labels: model, version
# Router and worker series are bounded in models (hotset_common.model_series): per-model labels name at most
# a configured number of recently used models, "_other" the rest and "_unknown" names no worker knows.
ROUTER_MODEL_SERIES = f"{PREFIX}_router_model_series"  # gauge: models with per-model series of their own now
ROUTER_EVENT_LOOP_LAG_SECONDS = f"{PREFIX}_router_event_loop_lag_seconds"  # histogram: how late timers woke
# The Gateway API Inference Extension's model-server protocol, in the names it gives for vLLM: every
# worker exports them for the vLLM engines it runs, all of them together (one series per pod, which an
# endpoint picker scraping the pod reads; worker engine_load.py), from each engine's own /metrics.
MODEL_SERVER_WAITING = "vllm:num_requests_waiting"      # gauge: TotalQueuedRequests; labels: pod
MODEL_SERVER_RUNNING = "vllm:num_requests_running"      # gauge: TotalRunningRequests; labels: pod
MODEL_SERVER_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # gauge 0-1: KVCacheUtilization (blocks in use of all); labels: pod
# gauge, value the sample's unix time: LoRA adapters resident; labels: pod, max_lora, running_lora_adapters,
# waiting_lora_adapters (comma-separated names)
MODEL_SERVER_LORA_INFO = "vllm:lora_requests_info"
# What the worker reads from each engine's /metrics (vLLM 0.32's names): the above, and for prefix routing
# the cache's size and its hits (tokens, counters since the engine started).
ENGINE_CACHE_CONFIG_INFO = "vllm:cache_config_info"     # labels include num_gpu_blocks, block_size
ENGINE_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # counter (exposed as _total)
ENGINE_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"        # counter (exposed as _total)
