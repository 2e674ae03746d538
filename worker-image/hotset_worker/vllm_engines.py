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

What an engine is started with, beyond the model's own flags:

- **Usage statistics off** (``VLLM_NO_USAGE_STATS``, ``DO_NOT_TRACK``): vLLM
  reports each engine start to its usage service unless told not to, and a
  platform must not phone home on its users' behalf.
- **An API key of its own** (a fresh secret per engine): the engine listens
  on loopback, but every container in the pod shares it, and runtime LoRA
  loading is on; only the worker, which holds the key, may call its ``/v1``
  routes. It goes in the engine's environment (``VLLM_API_KEY``, which vLLM
  reads where ``--api-key`` is not given), not on its command line: any
  process of the pod may read another's ``/proc/<pid>/cmdline``, while its
  ``environ`` is readable by the same user (and root) only.
- **Cores of its own on CPU** (``VLLM_CPU_OMP_THREADS_BIND``): vLLM's CPU
  build binds its compute threads to cores starting at core 0 unless told
  which, so two engines on one pod would share the same cores and halve each
  other. ``CoreSets`` hands each engine a disjoint block of the pod's cores.
- **One start at a time on a GPU**: each engine profiles the device's free
  memory while it starts and sizes its KV cache from what it finds; two
  engines profiling at once each count the other's memory as free (a known
  vLLM failure: both start, then one runs out). Starts on a GPU pod wait
  for each other; on CPU (cores of their own, memory from the host) they
  overlap.
- **A first token before it counts as loaded**: ``/health`` answers as soon as
  the server is up, even for a model the engine cannot run (an attention head
  size its backend lacks kills it on the first request). One single-token
  completion after ``/health`` finds that at load time, with the engine's
  own last lines as the reason, so no copy reads READY that cannot answer.

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
import secrets
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
from hotset_worker import memory

log = logging.getLogger(__name__)

NAME = "vllm"
DEFAULT_COMMAND = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
DEFAULT_START_TIMEOUT_S = 600.0  # a large model's weights and CUDA graphs take minutes
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 40
# Request headers an OpenAI request keeps on its way to an engine.
FORWARDED_HEADERS = ("content-type", "accept")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
# What every engine's environment says, whatever the worker's own says.
ENGINE_ENVIRONMENT = {
    "VLLM_NO_USAGE_STATS": "1",  # vLLM's own switch for its usage reports
    "DO_NOT_TRACK": "1",  # the convention vLLM (and libraries it loads) also honours
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # adapters load into a running base (behind the engine's key)
    "HF_HUB_OFFLINE": "1",  # weights come from the worker's sources, never from the hub at engine start
}
API_KEY_VARIABLE = "VLLM_API_KEY"  # vLLM's own: its key where --api-key is not given (never on a command line)
PROBE_TIMEOUT_S = 120.0  # a first token on CPU, or after CUDA graph capture


class CoreSets:
    """Disjoint blocks of the pod's CPU cores, one per engine, for engines that compute on CPU.

    vLLM's CPU build pins its compute threads to the cores ``VLLM_CPU_OMP_THREADS_BIND``
    names, and to cores from 0 up when it names none: two engines then compete for the
    same cores while the rest idle. Each engine takes the free block of `per_engine` cores;
    when every block is taken, the block with the fewest engines is shared (and logged),
    since refusing a load for want of a whole block would serve less, not faster.
    """

    def __init__(self, cores: Sequence[int], per_engine: int) -> None:
        ordered = sorted(cores)
        size = max(1, min(per_engine, len(ordered))) if ordered else 1
        self.blocks: list[tuple[int, ...]] = [tuple(ordered[i:i + size]) for i in range(0, len(ordered), size)
                                             if len(ordered[i:i + size]) == size] or [tuple(ordered)]
        self._users: dict[tuple[int, ...], set[str]] = {block: set() for block in self.blocks}  # engine keys
        self._lock = threading.Lock()

    @classmethod
    def of_this_process(cls, per_engine: int = 0) -> "CoreSets":
        """The cores this process may run on; `per_engine` 0: half of them (two engines side by side)."""
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        return cls(cores, per_engine or max(1, len(cores) // 2))

    def take(self, engine_key: str) -> tuple[int, ...]:
        """A block for the engine `engine_key` names (one per engine process: a model's next engine
        has a key of its own, so a late give-back of its last one leaves the new one's block alone)."""
        with self._lock:
            block = min(self.blocks, key=lambda b: len(self._users[b]))
            if self._users[block]:
                log.warning("every block of CPU cores has an engine: %s shares cores %s with %s", engine_key,
                            bind_list(block), ", ".join(sorted(self._users[block])))
            self._users[block].add(engine_key)
            return block

    def give_back(self, engine_key: str) -> None:
        with self._lock:
            for users in self._users.values():
                users.discard(engine_key)


def bind_list(cores: Sequence[int]) -> str:
    """Cores as vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` reads them: ``0,1,2,3``."""
    return ",".join(str(core) for core in cores)


@dataclass(eq=False)
class Engine:
    """One running engine process and what is loaded in it."""

    model_id: str
    process: subprocess.Popen[bytes]
    port: int
    api_key: str = ""
    core_key: str = ""  # its block of CPU cores, where it has one (CoreSets)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    adapters: set[str] = field(default_factory=set)
    static_adapters: frozenset[str] = frozenset()  # the LoRA adapters it was started with (--lora-modules)
    reader: threading.Thread | None = None  # copies its output into the log and `tail`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def headers(self) -> dict[str, str]:
        """What every call to the engine's ``/v1`` routes carries: its key."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def alive(self) -> bool:
        return self.process.poll() is None

    def resident_bytes(self) -> int:
        """Host memory the whole engine holds (its API server, engine core and compute process): on
        CPU what the engine costs the pod, beyond the share its compute process was given."""
        return memory.process_tree_bytes(self.pid)

    def log_tail(self) -> str:
        """Its last lines; once it has exited, all of them (its output is read to the end first)."""
        if not self.alive() and self.reader is not None:
            self.reader.join(2.0)
        return "\n".join(self.tail)


class VllmEngines:
    """The pod's vLLM engine processes, by model id; a ``backends.Backend``."""

    name = NAME
    frameworks = frozenset({Framework.VLLM})

    def __init__(self, command: Sequence[str] | None = None, device_bytes: int = 0,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S, environment: dict[str, str] | None = None,
                 cpu_cores: CoreSets | None = None) -> None:
        """`command`: what starts an engine (vLLM's OpenAI server; tests pass a stand-in); None: vLLM's
        own, when it is installed. `device_bytes`: the memory ``gpu_memory_utilization`` is a share of.
        `cpu_cores`: the blocks of cores engines compute on, on a pod without a GPU (None on a GPU)."""
        self.command = tuple(command) if command else (DEFAULT_COMMAND if _vllm_installed() else ())
        self.device_bytes = device_bytes
        self.start_timeout_s = start_timeout_s
        self.environment = environment or {}
        self.cpu_cores = cpu_cores
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()
        # On a GPU, one engine starts at a time (see the module docstring); held across the start.
        self._starting: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if cpu_cores is None else contextlib.nullcontext())
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

    def live(self) -> list[tuple[str, str]]:
        """(model id, URL) of every engine that runs now (engine_load.py reads their /metrics)."""
        with self._lock:
            engines = list(self._engines.values())
        return [(engine.model_id, engine.url) for engine in engines if engine.alive()]

    def start(self, spec: ModelSpec, folder: Path, engine_flags: Sequence[str]) -> Engine:
        """Start `spec`'s engine and wait until it answers ``/health`` (runs on a load thread)."""
        if not self.configured:
            raise errors.BackendUnavailable(f"model {spec.id!r} needs vLLM, which this worker does not have")
        with self._starting:
            return self._start(spec, folder, engine_flags)

    def _start(self, spec: ModelSpec, folder: Path, engine_flags: Sequence[str]) -> Engine:
        port = _free_port()
        api_key = secrets.token_hex(24)
        # A canary version's engine answers to the model's own name too (the body the client sent
        # names it), and names it first, so that its answers say the model that was asked for.
        names = [spec.variant_of, spec.id] if spec.variant_of else [spec.id]
        argv = [*self.command, "--model", str(folder), "--served-model-name", *names,
                "--host", "127.0.0.1", "--port", str(port), *engine_flags]
        log.info("starting the vLLM engine of %s: %s", spec.id, shlex.join(argv))
        env = {**os.environ, **self.environment, **ENGINE_ENVIRONMENT, API_KEY_VARIABLE: api_key}
        core_key = f"{spec.id}@{port}"
        if self.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind_list(self.cpu_cores.take(core_key))
        try:
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except BaseException:
            self._give_back_cores(core_key)
            raise
        engine = Engine(spec.id, process, port, api_key, core_key)
        engine.reader = threading.Thread(target=_copy_output, args=(engine,), name=f"vllm-log-{spec.id}", daemon=True)
        engine.reader.start()
        try:
            _wait_healthy(engine, spec.load_timeout_s(self.start_timeout_s))
            _probe(engine, names[0])
        except BaseException:
            stop(engine)
            self._give_back_cores(core_key)
            raise
        with self._lock:
            self._engines[spec.id] = engine
        log.info("the vLLM engine of %s answers on port %d (pid %d)", spec.id, port, process.pid)
        return engine

    def stop(self, model_id: str, engine: Engine | None = None) -> None:
        """Stop `model_id`'s engine (its adapters go with it); given `engine`, only that one: the
        unload of a copy whose engine died must not stop the engine a new load has started since."""
        with self._lock:
            registered = self._engines.get(model_id)
            if registered is not None and (engine is None or registered is engine):
                del self._engines[model_id]
            engine = engine or registered
        if engine is not None:
            stop(engine)
            self._give_back_cores(engine.core_key)

    def _give_back_cores(self, core_key: str) -> None:
        if self.cpu_cores is not None:
            self.cpu_cores.give_back(core_key)

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


def _probe(engine: Engine, served_name: str) -> None:
    """One single-token completion: an engine that answers /health but cannot run its model fails here.

    The engine's 4xx (a prompt it finds wrong) still proves it computes; a 5xx, no answer, or an
    engine that exits while answering is a load failure quoting the engine's last lines.
    """
    import httpx

    body = {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    try:
        answer = httpx.post(engine.url + "/v1/completions", json=body, headers=engine.headers, timeout=PROBE_TIMEOUT_S)
        failure = f"answered {answer.status_code}: {answer.text[:300]}" if answer.status_code >= 500 else ""
    except httpx.HTTPError as exc:
        failure = f"did not answer ({type(exc).__name__})"
    if not failure and engine.alive():
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        engine.process.wait(2.0)  # an engine dying from the request: let its last words reach the tail
    state = f"exited with {engine.process.returncode}" if not engine.alive() else failure
    raise errors.ModelLoadFailed(
        f"the vLLM engine of {engine.model_id!r} started but cannot run its model: its first token {state}; "
        f"its last lines:\n{engine.log_tail()}")


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
