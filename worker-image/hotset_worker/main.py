"""``hotset-worker``: assemble the worker from options (or HOTSET_* variables) and serve it.

Every option has an environment variable, which is how the operator
configures pods; a command-line option wins over its variable. The options
are declared once, in ``hotset_common.worker_settings``.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import uvicorn
from fastapi import FastAPI

from hotset_common import quantity, slow_clients, worker_identity, worker_settings
from hotset_common.worker_settings import WorkerOption
from hotset_common.budget import BudgetMode
from hotset_common.slow_clients import ClientLimits
from hotset_common.eviction import DEFAULT_CHURN_GUARD_S, EvictionPolicy
from hotset_common.model_series import DEFAULT_MAX_MODEL_SERIES, DEFAULT_SERIES_IDLE_S
from hotset_common.worker_identity import BearerToken
from hotset_worker import api, callers, engine, memory
from hotset_worker.limits import DEFAULT_MAX_QUEUE as DEFAULT_MAX_MODEL_QUEUE
from hotset_worker.backends import Backends
from hotset_worker.engine_load import EngineLoads
from hotset_worker.manager import DEFAULT_MAX_QUEUE, DEFAULT_REQUEST_TIMEOUT_S
from hotset_worker.frameworks.base import WorkerContext
from hotset_worker.manager import ModelManager
from hotset_worker.metrics import WorkerMetrics
from hotset_worker.sources.cache import ContentCache
from hotset_worker.sources.credentials import Credentials
from hotset_worker.sources.fetcher import DEFAULT_LOAD_TIMEOUT_S, SourceFetcher
from hotset_worker.sources.plan import SourceSettings
from hotset_worker.store import FollowedModelStore, JsonModelStore, ModelStore
from hotset_worker.triton_backend import TritonBackend
from hotset_worker.vllm_engines import DEFAULT_START_TIMEOUT_S, CoreSets, VllmEngines

log = logging.getLogger("hotset_worker")

DEFAULT_SOURCE_CACHE_BYTES = 20 * 2**30


@dataclass(frozen=True)
class Settings:
    model_store: Path | None  # standalone: a JSON file; None: cluster mode follows `catalog_url`
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = None  # OIP v2 over gRPC (grpc_api.py); None: none; 0: a free port (in /status)
    gateway_port: int | None = None  # the OpenAI routes, unchecked, for an Inference Extension gateway (api.py)
    memory_budget: int | None = None  # None: derived from the device
    gpu_reserve: int | None = None  # bytes of a GPU kept out of the budget; None: 1 GiB + 10% (memory.py)
    max_models: int | None = None
    max_model_series: int = DEFAULT_MAX_MODEL_SERIES  # models with per-model metric series at once (metrics.py)
    model_series_idle_s: float = DEFAULT_SERIES_IDLE_S
    triton_url: str = ""
    triton_repository: Path = Path("/models")
    pod_name: str = field(default_factory=socket.gethostname)
    pinned: tuple[str, ...] = ()
    max_body_bytes: int = api.DEFAULT_MAX_BODY_BYTES
    source_roots: dict[str, Path] = field(default_factory=dict)
    min_residency_s: float = DEFAULT_CHURN_GUARD_S
    failed_load_backoff_s: float = 5.0
    backend_sync_s: float = 1.0  # how often copies are checked against what Triton and the engines hold
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_queue: int = DEFAULT_MAX_QUEUE
    admission_control: bool = True
    budget_mode: BudgetMode = BudgetMode.AUTO  # auto: hard on a GPU, load-first on a CPU
    inference_threads: int | None = None  # None: one per available core
    torch_threads: int | None = None  # None: available cores / inference threads (at least 1)
    vllm_command: tuple[str, ...] = ()  # empty: vLLM's own OpenAI server, when vllm is installed
    vllm_device_memory: int | None = None  # None: the first GPU's memory
    vllm_start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    vllm_metrics_interval_s: float = 0.5  # how often each engine's /metrics is read (engine_load.py)
    vllm_cpu_cores_per_engine: int = 0  # on a pod without a GPU; 0: half the pod's cores
    log_level: str = "info"
    api_token: str = ""  # one fixed token (a local stack); empty: none
    # Cluster pods (docs/security.md, "Workers that prove who they are"): the cluster's ServiceAccount
    # keys callers' tokens are verified with, the accounts answered (user names), the pod's own tokens.
    caller_keys: Path | None = None
    trusted_callers: tuple[str, ...] = ()
    identity_token_file: Path | None = None
    catalog_token_file: Path | None = None
    drain_s: float = 5.0
    max_model_queue: int = DEFAULT_MAX_MODEL_QUEUE
    file_roots: tuple[Path, ...] | None = None  # None: any path ("*")
    triton_backends: frozenset[str] | None = None  # None: any backend ("*")
    catalog_url: str = ""  # cluster mode: the operator's catalog feed of this pod's pool
    # Remote sources (hotset_worker.sources): the cache folder (None: none, remote sources fail
    # their loads), its byte budget, the pool's defaults, and where credentials are mounted.
    source_cache: Path | None = None
    source_cache_bytes: int = DEFAULT_SOURCE_CACHE_BYTES
    source_settings: SourceSettings = field(default_factory=SourceSettings)
    client_limits: ClientLimits = field(default_factory=ClientLimits)  # slow, idle and vanished clients
    source_credentials: Path | None = None
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S


# The file name the worker keeps in the Triton repository while it runs: the sidecar's preStop
# hook waits for it to go, so Triton outlives the worker's drain (docs/worker.md, "Shutdown").
RUNNING_MARKER = ".hotset-worker-running"


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """Every option of hotset_common.worker_settings (the slow-client bounds shared with the router among them)."""
    parser = argparse.ArgumentParser(prog="hotset-worker", description="hotset's multi-framework worker pod")
    worker_settings.add_arguments(parser, env)
    return parser


def parse_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    parser = build_parser(env)
    args = parser.parse_args(argv)
    if not args.model_store and not args.catalog_url:
        parser.error("--model-store (or HOTSET_MODEL_STORE) is required, or --catalog-url (HOTSET_CATALOG_URL) in a cluster")
    if args.model_store and args.catalog_url:
        parser.error("--model-store and --catalog-url name two catalogs; give one")
    roots = args.source_root if args.source_root is not None else _split(env.get(WorkerOption.SOURCE_ROOT.env, ""))
    grpc_port = args.grpc_port.strip()
    if grpc_port and (not grpc_port.isdigit() or int(grpc_port) > 65535):
        parser.error(f"--grpc-port must be a port number (0: a free one) or empty, got {args.grpc_port!r}")
    gateway_port = args.gateway_port.strip()
    if gateway_port and (not gateway_port.isdigit() or not 0 < int(gateway_port) <= 65535
                         or int(gateway_port) == int(args.port)):
        parser.error(f"--gateway-port must be a port number other than --port, or empty, got {args.gateway_port!r}")
    if float(args.backend_sync_s) <= 0:
        parser.error(f"--backend-sync-s must be positive, got {args.backend_sync_s}")
    if float(args.vllm_metrics_interval_s) <= 0:
        parser.error(f"--vllm-metrics-interval-s must be positive, got {args.vllm_metrics_interval_s}")
    if float(args.failed_load_backoff_s) < 0:
        parser.error(f"--failed-load-backoff-s must not be negative, got {args.failed_load_backoff_s}")
    if float(args.request_timeout_s) <= 0:
        parser.error(f"--request-timeout-s must be positive, got {args.request_timeout_s}")
    if int(args.max_queue) < 0:
        parser.error(f"--max-queue must not be negative, got {args.max_queue}")
    if int(args.max_model_series) < 0:
        parser.error(f"--max-model-series must not be negative, got {args.max_model_series}")
    if float(args.model_series_idle_s) <= 0:
        parser.error(f"--model-series-idle-s must be positive, got {args.model_series_idle_s}")
    if float(args.load_timeout_s) <= 0:
        parser.error(f"--load-timeout-s must be positive, got {args.load_timeout_s}")
    if args.inference_threads not in (None, "") and int(args.inference_threads) < 1:
        parser.error(f"--inference-threads must be at least 1, got {args.inference_threads}")
    if args.torch_threads not in (None, "") and int(args.torch_threads) < 1:
        parser.error(f"--torch-threads must be at least 1, got {args.torch_threads}")
    if args.caller_keys.strip() and args.api_token.strip():
        parser.error("--caller-keys and --api-token are two ways to check callers; give one")
    try:
        trusted = worker_identity.parse_accounts(args.trusted_callers)
    except ValueError as exc:
        parser.error(f"--trusted-callers: {exc}")
    if args.caller_keys.strip() and not trusted:
        parser.error("--caller-keys needs --trusted-callers (namespace:name,...): the ServiceAccounts this worker answers")
    try:
        return Settings(
            model_store=Path(args.model_store) if args.model_store else None,
            catalog_url=args.catalog_url.strip(),
            host=args.host,
            port=int(args.port),
            grpc_port=int(grpc_port) if grpc_port else None,
            gateway_port=int(gateway_port) if gateway_port else None,
            memory_budget=quantity.parse_bytes(args.memory_budget) if args.memory_budget else None,
            gpu_reserve=quantity.parse_bytes(args.gpu_reserve) if args.gpu_reserve not in (None, "") else None,
            max_models=int(args.max_models) if args.max_models not in (None, "") else None,
            max_model_series=int(args.max_model_series),
            model_series_idle_s=float(args.model_series_idle_s),
            triton_url=args.triton_url.strip(),
            triton_repository=Path(args.triton_repository),
            pod_name=args.pod_name or socket.gethostname(),
            pinned=tuple(_split(args.pinned)),
            max_body_bytes=quantity.parse_bytes(args.max_body_bytes),
            source_roots=dict(_source_root(item) for item in roots),
            min_residency_s=float(args.min_residency_s),
            failed_load_backoff_s=float(args.failed_load_backoff_s),
            backend_sync_s=float(args.backend_sync_s),
            request_timeout_s=float(args.request_timeout_s),
            max_queue=int(args.max_queue),
            admission_control=args.admission_control == "on",
            budget_mode=BudgetMode(args.budget_mode),
            inference_threads=int(args.inference_threads) if args.inference_threads not in (None, "") else None,
            torch_threads=int(args.torch_threads) if args.torch_threads not in (None, "") else None,
            vllm_command=VllmEngines.parse_command(args.vllm_command or ""),
            vllm_device_memory=quantity.parse_bytes(args.vllm_device_memory) if args.vllm_device_memory else None,
            vllm_start_timeout_s=float(args.vllm_start_timeout_s),
            vllm_metrics_interval_s=float(args.vllm_metrics_interval_s),
            vllm_cpu_cores_per_engine=int(args.vllm_cpu_cores_per_engine),
            log_level=args.log_level,
            client_limits=slow_clients.from_arguments(args),
            api_token=args.api_token.strip(),
            caller_keys=Path(args.caller_keys.strip()) if args.caller_keys.strip() else None,
            trusted_callers=trusted,
            identity_token_file=Path(args.identity_token_file.strip()) if args.identity_token_file.strip() else None,
            catalog_token_file=Path(args.catalog_token_file.strip()) if args.catalog_token_file.strip() else None,
            drain_s=float(args.drain_seconds),
            max_model_queue=int(args.max_model_queue),
            file_roots=None if args.file_roots.strip() == "*" else tuple(Path(p) for p in _split(args.file_roots)),
            triton_backends=None if args.triton_backends.strip() == "*" else frozenset(_split(args.triton_backends)),
            source_cache=Path(args.source_cache) if args.source_cache.strip() else None,
            source_cache_bytes=quantity.parse_bytes(args.source_cache_bytes),
            source_settings=SourceSettings(
                s3_endpoint=args.s3_endpoint.strip().rstrip("/"), s3_region=args.s3_region.strip(),
                s3_path_style=args.s3_path_style == "on", hf_endpoint=args.hf_endpoint.strip().rstrip("/"),
                oci_root=Path(args.oci_root), oci_image_volumes=args.oci_image_volumes == "on",
                oci_plain_http=tuple(host.lower() for host in _split(args.oci_plain_http))),
            source_credentials=Path(args.source_credentials) if args.source_credentials.strip() else None,
            load_timeout_s=float(args.load_timeout_s),
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _source_root(item: str) -> tuple[str, Path]:
    claim, sep, path = item.partition("=")
    if not sep or not claim or not path:
        raise ValueError(f"--source-root expects CLAIM=PATH, got {item!r}")
    return claim, Path(path)


def device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_torch_threads(inference_threads: int | None) -> int:
    """Cores per inference thread. Each inference thread runs torch's own intra-op threads; more
    of them than cores in all make them wait on each other: measured on 2 busy cores, a small
    BERT's forward pass took 112 ms with torch's default of 2 threads beside the event loop and
    other work, 8 ms with 1 (docs/benchmarks.md)."""
    from hotset_worker.dataplane import available_cores

    cores = available_cores()
    return max(1, cores // (inference_threads or cores))


def set_torch_threads(threads: int) -> None:
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(threads)


def memory_budget(device_name: str, asked: int | None, gpu_reserve: int | None = None) -> int:
    """On a GPU: `asked` (default: all of it) within the device's memory less the reserve
    (memory.gpu_model_budget; a budget cut to fit is logged). On CPU: `asked`, or half of the
    memory available now."""
    if device_name == "cuda":
        import torch

        budget, cut = memory.gpu_model_budget(int(torch.cuda.get_device_properties(0).total_memory), asked, gpu_reserve)
        if cut:
            log.warning("%s", cut)
        return budget
    if asked is not None:
        return asked
    import psutil

    return int(psutil.virtual_memory().available * 0.5)


def device_memory(device_name: str) -> int:
    """What vLLM's gpu_memory_utilization is a share of: the first GPU's memory (the host's on CPU,
    where only a stand-in engine runs)."""
    if device_name == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def build_app(settings: Settings, store: ModelStore | None = None,
              draining: Callable[[], bool] = lambda: False) -> FastAPI:
    """The whole worker: store, metrics, Triton probe, manager and API, wired together."""
    store = store or open_store(settings)
    unknown = [key for key in settings.pinned if key not in store.ids()]
    if unknown:  # the catalog may lag behind the pod spec: not ready until they appear and load
        log.warning("pinned models not in the model store (yet): %s", ", ".join(unknown))
    device_name = device()
    set_torch_threads(settings.torch_threads or default_torch_threads(settings.inference_threads))
    budget = memory_budget(device_name, settings.memory_budget, settings.gpu_reserve)
    engines = VllmEngines(settings.vllm_command or None, settings.vllm_device_memory or device_memory(device_name),
                          settings.vllm_start_timeout_s,
                          cpu_cores=CoreSets.of_this_process(settings.vllm_cpu_cores_per_engine)
                          if device_name == "cpu" else None)
    backends = Backends([TritonBackend(settings.triton_url, settings.triton_repository), engines])
    metrics = WorkerMetrics(settings.pod_name, budget, max_models=settings.max_model_series,
                            idle_s=settings.model_series_idle_s)
    engine_loads = EngineLoads(engines.live, engines.session, settings.pod_name, settings.vllm_metrics_interval_s)
    metrics.registry.register(engine_loads)  # the Inference Extension's model-server metrics, for its engines
    fetcher = build_fetcher(settings, metrics)
    context = WorkerContext(
        source_roots=settings.source_roots,
        file_roots=settings.file_roots,
        triton_backends=settings.triton_backends,
        backends=backends.by_name(),
        device=device_name,
        fetcher=fetcher,
        shared_roots=tuple(root for root in (settings.source_cache, settings.source_settings.oci_root) if root),
    )
    manager = ModelManager(
        store,
        context,
        budget,
        max_models=settings.max_models,
        policy=EvictionPolicy(churn_guard_s=settings.min_residency_s),
        pinned=settings.pinned,
        observer=metrics,
        preflight=backends.require,
        failure_backoff_s=settings.failed_load_backoff_s,
        request_timeout_s=settings.request_timeout_s,
        max_queue=settings.max_queue,
        admission_control=settings.admission_control,
        budget_mode=settings.budget_mode.on(device_name),
    )
    fetcher.held = manager.held_sources
    return api.create_app(
        manager, metrics, backends, pod_name=settings.pod_name, max_body_bytes=settings.max_body_bytes,
        prepare=lambda: import_frameworks(store, context), inference_threads=settings.inference_threads,
        callers=callers.from_settings(settings.api_token, settings.caller_keys, settings.trusted_callers),
        identity=BearerToken(path=settings.identity_token_file) if settings.identity_token_file else None,
        max_model_queue=settings.max_model_queue, draining=draining,
        backend_sync_s=settings.backend_sync_s, engine_loads=engine_loads,
        grpc_address=f"{settings.host}:{settings.grpc_port}" if settings.grpc_port is not None else None,
        client_limits=settings.client_limits, gateway_port=settings.gateway_port,
    )


def open_store(settings: Settings) -> ModelStore:
    """The operator's feed in a cluster (``catalog_url``), else the JSON file."""
    if settings.catalog_url:
        # The pod's catalog token; a local stack's fixed token, where it has one.
        credential = (BearerToken(path=settings.catalog_token_file) if settings.catalog_token_file
                      else BearerToken(settings.api_token))
        return FollowedModelStore(settings.catalog_url, credential=credential)
    assert settings.model_store is not None
    return JsonModelStore(settings.model_store)


def build_fetcher(settings: Settings, metrics: WorkerMetrics) -> SourceFetcher:
    """The pod's remote sources: its cache (when it has one), the pool's defaults, credentials."""
    cache = None
    if settings.source_cache is not None:
        cache = ContentCache(settings.source_cache, settings.source_cache_bytes, observer=metrics)
        metrics.cache_used(cache.used_bytes(), cache.budget_bytes)
    return SourceFetcher(cache, settings.source_settings, Credentials(settings.source_credentials),
                         observer=metrics, load_timeout_s=settings.load_timeout_s)


def import_frameworks(store: ModelStore, context: WorkerContext) -> None:
    """Import and prepare the frameworks the store needs now, then the code of its models'
    architectures, not during the first requests (torch and transformers take seconds to import,
    a model architecture's module a second or more). A load meanwhile waits for its framework's
    preparation (engine.prepare). A framework that fails here fails its loads, clearly."""
    specs = store.list()
    for framework in sorted({spec.framework.value for spec in specs}):
        try:
            engine.prepare(framework)
            engine.worker_class(framework).prepare_models([s for s in specs if s.framework.value == framework], context)
        except Exception as exc:  # noqa: BLE001 - reported again, per model, when one loads
            log.warning("framework %s is not available: %s", framework, exc)
    if context.fetcher is not None:
        context.fetcher.prepare(specs)
    memory.freeze_imports()


class DrainingServer(uvicorn.Server):
    """uvicorn that drains on SIGTERM: it reports unready (readiness 503, ``/status`` ready false, so
    the router and the Service stop sending) and keeps serving for `drain_s`, then stops as uvicorn
    does (no new connections, requests in flight finish, the lifespan unloads). A second signal
    stops at once."""

    def __init__(self, config: uvicorn.Config, drain_s: float) -> None:
        super().__init__(config)
        self.drain_s = drain_s
        self.drain_until: float | None = None

    def draining(self) -> bool:
        return self.drain_until is not None

    def handle_exit(self, sig: int, frame: object) -> None:
        if self.drain_until is not None or self.drain_s <= 0:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # exit normally (uvicorn would re-raise it): the marker must go last
            return
        self.drain_until = time.monotonic() + self.drain_s
        log.info("signal %d: draining for %.1fs (unready, still serving), then stopping", sig, self.drain_s)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and time.monotonic() >= self.drain_until:
            self.should_exit = True
        return await super().on_tick(counter)


@contextlib.contextmanager
def running_marker(settings: Settings) -> Iterator[None]:
    """Keep RUNNING_MARKER in the Triton repository while the worker runs (see its comment)."""
    marker = settings.triton_repository / RUNNING_MARKER
    if not settings.triton_url:
        yield
        return
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            marker.unlink()


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server: DrainingServer | None = None
    try:
        app = build_app(settings, draining=lambda: server is not None and server.draining())
    except ValueError as exc:
        sys.exit(f"hotset-worker: {exc}")
    log.info("worker %s on %s:%d", settings.pod_name, settings.host, settings.port)
    config = uvicorn.Config(host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                            timeout_graceful_shutdown=10, **slow_clients.serve_options(app, settings.client_limits))
    server = DrainingServer(config, settings.drain_s)
    with running_marker(settings):
        server.run(sockets=listening_sockets(config, settings.gateway_port))


def listening_sockets(config: uvicorn.Config, gateway_port: int | None) -> list[socket.socket] | None:
    """The server's port, and the gateway port beside it on the same host: one server, one app, one
    lifespan; the app tells the two apart by the socket a request came in on (api.GatewayPort).
    None: the one port uvicorn binds itself."""
    if gateway_port is None:
        return None
    gateway = uvicorn.Config(config.app, host=config.host, port=gateway_port)
    return [config.bind_socket(), gateway.bind_socket()]


if __name__ == "__main__":
    main()
