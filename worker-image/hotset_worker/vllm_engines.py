"""vLLM engines as a backend: one engine process per loaded model, started and stopped by its load and unload.

vLLM is a serving engine, not a library call: it claims its share of the
GPU at start (``gpu_memory_utilization`` of the device, weights and KV cache
together), batches continuously and speaks the OpenAI API itself. So a
``vllm`` model's copy here is an engine process of its own
(``python -m vllm.entrypoints.openai.api_server`` on a loopback port), which
the framework worker starts in ``load`` and stops in ``unload``; the OpenAI
requests for it are passed to that process untouched.

``VllmEngines`` is the pod's record of those processes and a ``Backend``
like the Triton sidecar, so what the pod already does for backends applies:

- ``held_models``: the models whose engine process is alive, and the LoRA
  adapters loaded into one. An engine that died (or was stopped with its
  base model) drops its copies within a second (``Backends.keep_in_sync``),
  and the next request starts it again.
- ``require``: a pod without vLLM refuses ``vllm`` loads with a 503 naming
  the reason, before anything is evicted.

Engine output goes to the worker's log, line by line (with the model's id),
and its last lines are kept for the error message of a failed start.
Processes run in their own session and are stopped by process group:
SIGTERM, a grace period, then SIGKILL; the worker stops every engine when it
shuts down (a worker killed outright leaves them to the container's end).
"""
from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import aiohttp

from hotset_common import errors
from hotset_common.spec import Framework, ModelSpec

log = logging.getLogger(__name__)

NAME = "vllm"
DEFAULT_COMMAND = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
DEFAULT_START_TIMEOUT_S = 600.0  # a large model's weights and CUDA graphs take minutes
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 40
# Request headers an OpenAI request keeps on its way to an engine.
FORWARDED_HEADERS = ("content-type", "accept")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


@dataclass(eq=False)
class Engine:
    """One running engine process and what is loaded in it."""

    model_id: str
    process: subprocess.Popen[bytes]
    port: int
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    adapters: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self) -> str:
        return "\n".join(self.tail)


class VllmEngines:
    """The pod's vLLM engine processes, by model id; a ``backends.Backend``."""

    name = NAME
    frameworks = frozenset({Framework.VLLM})

    def __init__(self, command: Sequence[str] | None = None, device_bytes: int = 0,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S, environment: dict[str, str] | None = None) -> None:
        """`command`: what starts an engine (vLLM's OpenAI server; tests pass a stand-in); None: vLLM's
        own, when it is installed. `device_bytes`: the memory ``gpu_memory_utilization`` is a share of."""
        self.command = tuple(command) if command else (DEFAULT_COMMAND if _vllm_installed() else ())
        self.device_bytes = device_bytes
        self.start_timeout_s = start_timeout_s
        self.environment = environment or {}
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def parse_command(value: str) -> tuple[str, ...]:
        return tuple(shlex.split(value))

    # ----- Backend -------------------------------------------------------

    @property
    def configured(self) -> bool:
        return bool(self.command)

    async def ready(self) -> bool:
        """Engines start per model: the pod's readiness never waits for one."""
        return self.configured

    async def held_models(self) -> set[str] | None:
        with self._lock:
            engines = list(self._engines.values())
        held: set[str] = set()
        for engine in engines:
            if engine.alive():
                held.add(engine.model_id)
                held |= engine.adapters
        return held

    async def require(self, spec: ModelSpec) -> None:
        if not self.configured:
            raise errors.BackendUnavailable(
                f"model {spec.id!r} needs vLLM, which this worker does not have (vllm is not installed in its "
                f"Python, and no --vllm-command was given): serve vllm models from GPU pods with vLLM installed")

    async def aclose(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for engine in engines:
            stop(engine)
        if self._session is not None:
            await self._session.close()

    # ----- engines ---------------------------------------------------------

    def engine(self, model_id: str) -> Engine | None:
        """The live engine of `model_id`, if it runs here."""
        with self._lock:
            engine = self._engines.get(model_id)
        return engine if engine is not None and engine.alive() else None

    def start(self, spec: ModelSpec, folder: Path, engine_flags: Sequence[str]) -> Engine:
        """Start `spec`'s engine and wait until it answers ``/health`` (runs on a load thread)."""
        if not self.configured:
            raise errors.BackendUnavailable(f"model {spec.id!r} needs vLLM, which this worker does not have")
        port = _free_port()
        # A canary version's engine answers to the model's own name too (the body the client sent
        # names it), and names it first, so that its answers say the model that was asked for.
        names = [spec.variant_of, spec.id] if spec.variant_of else [spec.id]
        argv = [*self.command, "--model", str(folder), "--served-model-name", *names,
                "--host", "127.0.0.1", "--port", str(port), *engine_flags]
        log.info("starting the vLLM engine of %s: %s", spec.id, shlex.join(argv))
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "HF_HUB_OFFLINE": "1", **self.environment}
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
        engine = Engine(spec.id, process, port)
        threading.Thread(target=_copy_output, args=(engine,), name=f"vllm-log-{spec.id}", daemon=True).start()
        try:
            _wait_healthy(engine, self.start_timeout_s)
        except BaseException:
            stop(engine)
            raise
        with self._lock:
            self._engines[spec.id] = engine
        log.info("the vLLM engine of %s answers on port %d (pid %d)", spec.id, port, process.pid)
        return engine

    def stop(self, model_id: str) -> None:
        """Stop `model_id`'s engine (its adapters go with it)."""
        with self._lock:
            engine = self._engines.pop(model_id, None)
        if engine is not None:
            stop(engine)

    # ----- HTTP to engines ---------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        """The event loop's client for forwarding (created on first use, inside the loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  skip_auto_headers=("Accept-Encoding",),
                                                  timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0))
        return self._session


def stop(engine: Engine) -> None:
    """SIGTERM to the engine's process group, SIGKILL after the grace period."""
    if engine.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(engine.pid, signal.SIGTERM)
        try:
            engine.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("the vLLM engine of %s (pid %d) ignored SIGTERM; killing it", engine.model_id, engine.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(engine.pid, signal.SIGKILL)  # whatever it started is gone too
    with contextlib.suppress(subprocess.TimeoutExpired):
        engine.process.wait(10)
    log.info("stopped the vLLM engine of %s (pid %d)", engine.model_id, engine.pid)


def _wait_healthy(engine: Engine, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not engine.alive():
                raise errors.ModelLoadFailed(
                    f"the vLLM engine of {engine.model_id!r} exited with {engine.process.returncode} while starting; "
                    f"its last lines:\n{engine.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(engine.url + "/health").status_code == 200:
                    return
            time.sleep(0.2)
    raise errors.ModelLoadFailed(
        f"the vLLM engine of {engine.model_id!r} did not answer /health within {timeout_s:.0f}s; its last lines:\n"
        f"{engine.log_tail()}")


def _copy_output(engine: Engine) -> None:
    """The engine's output into the worker's log, and its tail for error messages."""
    assert engine.process.stdout is not None
    for raw in engine.process.stdout:
        line = raw.decode(errors="replace").rstrip()
        engine.tail.append(line)
        log.info("[vllm %s] %s", engine.model_id, line)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def forwarded_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}


def answer_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
