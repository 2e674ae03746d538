"""vLLM models on GPU nodes: one engine process per model, or a LoRA adapter inside its base model's engine.

A base model's ``load`` starts its engine (vllm_engines.py) with
``--gpu-memory-utilization`` as its share of the device, and ``unload``
stops it. The share comes from the spec: ``engineArgs.gpu_memory_utilization``
if given, else the spec's ``memory`` over the device's memory. That share
(weights plus KV cache) is what the copy occupies under the pod's byte
budget: vLLM sizes its KV cache to fill exactly that share at start, so the
share is the measure, and a count of models says nothing. (Each engine's
CUDA context, about half a GiB, lies outside it: leave that headroom.)

A spec with ``baseModel`` is a LoRA adapter: ``load`` asks the base model's
engine to load it (``/v1/load_lora_adapter``; the base needs
``engineArgs.enable_lora``), ``unload`` to drop it. It counts its weight
files' bytes, a light model under the same budget, and only exists while its
base is loaded: the OpenAI routes hold the base for every adapter request,
and an adapter whose engine went away is dropped like any lost copy.

A base model's ``loraAdapters`` are static adapters: its engine starts with
them (``--lora-modules name=folder``), and each one's copy (a spec of its own,
``ModelSpec.static_adapters``) only checks that the running engine has it:
nothing is loaded at runtime, and it counts no bytes of its own.

Requests reach the engine untouched (``open_openai``); vLLM batches them
continuously and validates them itself (its 400s pass through as they are).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Mapping

import aiohttp
import numpy as np

from hotset_common import engine_args, errors
from hotset_common.spec import Task
from hotset_worker import engine
from hotset_worker.frameworks import sources
from hotset_worker.frameworks.base import FrameworkWorker, StreamedResponse, TensorSpec
from hotset_worker.vllm_engines import NAME, Engine, VllmEngines, answer_headers, forwarded_headers

ADAPTER_WEIGHTS = ("*.safetensors", "*.bin", "*.pt")
# How long an engine that refused or cut a connection has to exit before the refusal is its answer:
# vLLM's API server stops serving when its engine core dies and exits a moment later.
ENGINE_EXIT_GRACE_S = 5.0


def engine_flags(args: Mapping[str, Any]) -> list[str]:
    """``{"max_model_len": 2048, "enable_lora": True}`` as ``--enable-lora --max-model-len 2048``; a key the
    pinned vLLM lacks or the project does not pass (hotset_common.engine_args, which the operator also
    checks at admission) fails the load naming it: a model from a local store meets no admission."""
    try:
        return engine_args.to_flags(args)
    except ValueError as exc:
        raise errors.ModelLoadFailed(str(exc)) from exc


def memory_share(spec: Any, device_bytes: int) -> tuple[float, int]:
    """(gpu_memory_utilization, bytes) of a base model's engine, from its engine args or its memory."""
    given = spec.engine_args.get("gpu_memory_utilization")
    if given is not None:
        share = float(given)
    elif spec.memory_bytes and device_bytes:
        share = spec.memory_bytes / device_bytes
    else:
        raise errors.ModelLoadFailed(
            f"model {spec.id!r}: a vLLM engine claims its share of the GPU when it starts, so give the "
            f"ServedModel's memory (its bytes) or engineArgs.gpu_memory_utilization (a share of the device)")
    if not 0.0 < share <= 1.0:
        raise errors.ModelLoadFailed(
            f"model {spec.id!r}: gpu_memory_utilization {share:.3f} is not a share of the device (0-1]"
            + ("" if given is not None else f": memory {spec.memory_bytes} bytes of a {device_bytes}-byte device"))
    return share, int(share * device_bytes)


@engine.register("vllm")
class VllmWorker(FrameworkWorker):
    """A model served by its own vLLM engine, or a LoRA adapter in its base model's engine."""

    def __init__(self, spec: Any, context: Any) -> None:
        super().__init__(spec, context)
        self._engine: Engine | None = None
        self._bytes = 0
        self._folder: Path | None = None
        self._adapter_lock: asyncio.Lock | None = None

    @property
    def engines(self) -> VllmEngines:
        engines = self.context.backends.get(NAME)
        if engines is None:
            raise errors.BackendUnavailable(f"model {self.spec.id!r} needs vLLM, which this worker does not have")
        return engines

    @property
    def adapter(self) -> bool:
        return bool(self.spec.base_model)

    # ----- lifecycle -------------------------------------------------------

    def load(self) -> None:
        if Task(self.spec.task) != Task.TEXT_GENERATION:
            raise errors.ModelLoadFailed(f"model {self.spec.id!r}: the vllm worker serves text-generation models, "
                                         f"not {Task(self.spec.task).value!r}")
        self._folder = sources.folder(self.spec, self.context)  # file:// within file_roots, remote via the cache
        if self.adapter:
            self._load_adapter()
            return
        share, size = memory_share(self.spec, self.engines.device_bytes)
        flags = ["--gpu-memory-utilization", f"{share:.4f}",
                 *engine_flags({k: v for k, v in self.spec.engine_args.items() if k != "gpu_memory_utilization"}),
                 *self._static_adapter_flags()]
        self._engine = self.engines.start(self.spec, self._folder, flags)
        static = {adapter.name for adapter in self.spec.lora_adapters}
        self._engine.static_adapters = frozenset(static)
        self._engine.adapters |= static
        # On CPU the share covers the compute process's weights and KV cache only; the API server and
        # engine core processes take about 1.3 GB more (measured on vLLM 0.32). The copy counts what the
        # whole engine holds once it has answered, when that is more. (On a GPU the budget is the
        # device's, which the share is of.)
        on_cpu = self.engines.cpu_cores is not None
        self._bytes = max(size, self._engine.resident_bytes()) if on_cpu else size

    def _static_adapter_flags(self) -> list[str]:
        """``--enable-lora --lora-modules name=folder ...`` for the adapters the spec starts its engine
        with (``loraAdapters``), each fetched like a model's source; nothing without them."""
        adapters = self.spec.static_adapters()
        if not adapters:
            return []
        modules = [f"{adapter.id}={sources.folder(adapter, self.context)}" for adapter in adapters]
        enable = [] if self.spec.engine_args.get("enable_lora") else ["--enable-lora"]
        return [*enable, "--lora-modules", *modules]

    def _load_adapter(self) -> None:
        import httpx

        base = self.engines.engine(self.spec.base_model)
        if base is None:
            raise errors.BackendUnavailable(
                f"LoRA adapter {self.spec.id!r} runs on {self.spec.base_model!r}, which is not loaded on this worker")
        if self.spec.static_adapter:  # started with its base's engine: nothing to ask of it
            if self.spec.id not in base.static_adapters:
                raise errors.ModelLoadFailed(
                    f"LoRA adapter {self.spec.id!r} is one of {self.spec.base_model!r}'s loraAdapters, but its running "
                    f"engine was started without it; it comes with the engine's next start")
            self._engine, self._bytes = base, 0  # its weights are the engine's, within the base's share
            return
        assert self._folder is not None
        answer = httpx.post(base.url + "/v1/load_lora_adapter", timeout=120.0, headers=base.headers,
                            json={"lora_name": self.spec.id, "lora_path": str(self._folder)})
        if answer.status_code != 200 and "already" not in answer.text:
            raise errors.ModelLoadFailed(f"the engine of {self.spec.base_model!r} refused LoRA adapter "
                                         f"{self.spec.id!r} ({answer.status_code}): {answer.text[:500]}")
        base.adapters.add(self.spec.id)
        self._engine = base
        self._bytes = sum(p.stat().st_size for pattern in ADAPTER_WEIGHTS for p in self._folder.glob(pattern))

    def unload(self) -> None:
        engine_, self._engine = self._engine, None
        if engine_ is None:
            return
        if not self.adapter:
            self.engines.stop(self.spec.id, engine_)  # its own engine only (a new load may have started another)
            return
        if self.spec.static_adapter:
            return  # it stays in the engine it started with (and goes with that engine)
        engine_.adapters.discard(self.spec.id)
        if engine_.alive():
            import httpx

            try:
                httpx.post(engine_.url + "/v1/unload_lora_adapter", json={"lora_name": self.spec.id},
                           headers=engine_.headers, timeout=30.0)
            except httpx.HTTPError:
                pass  # the engine is going away anyway

    def measured_bytes(self) -> int:
        return self._bytes

    def is_ready(self) -> bool:
        return self._engine is not None and self._engine.alive()

    def lost(self) -> bool:
        """Its own engine exited (an adapter follows its base's restart in ``_current_engine``)."""
        return not self.adapter and self._engine is not None and not self._engine.alive()

    # ----- requests ----------------------------------------------------------

    async def open_openai(self, path: str, body: bytes, headers: Mapping[str, str]) -> StreamedResponse | None:
        engine_ = await self._current_engine()
        try:
            response = await self.engines.session().post(engine_.url + path, data=body,
                                                         headers=forwarded_headers(headers) | engine_.headers)
        except (aiohttp.ClientConnectionError, OSError) as exc:
            if await _exits(engine_, ENGINE_EXIT_GRACE_S):
                raise errors.EngineLost(f"the vLLM engine of {self.spec.id!r} exited "
                                        f"({engine_.process.returncode}) as a request reached it") from exc
            raise errors.BackendUnavailable(f"the vLLM engine of {self.spec.id!r} does not answer: {exc}") from exc

        async def chunks():  # type: ignore[no-untyped-def]
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
                return  # the engine went away mid-answer: the answer ends here

        async def close() -> None:
            if response.content.at_eof():
                response.release()
            else:
                response.close()  # the client left: the engine sees the connection go and aborts the request

        return StreamedResponse(response.status, answer_headers(response.headers), chunks(), close)

    async def _current_engine(self) -> Engine:
        """The engine to send to; an adapter whose base engine was restarted is loaded into the new one."""
        if not self.adapter:
            if self._engine is None or not self._engine.alive():
                raise errors.BackendUnavailable(f"the vLLM engine of {self.spec.id!r} is not running")
            return self._engine
        if self._adapter_lock is None:
            self._adapter_lock = asyncio.Lock()
        async with self._adapter_lock:
            current = self.engines.engine(self.spec.base_model)
            if current is None:
                raise errors.BackendUnavailable(f"{self.spec.base_model!r}, the base of {self.spec.id!r}, is not running")
            if current is not self._engine:
                await asyncio.to_thread(self._load_adapter)
            return current

    def warm_up(self, sample: Any) -> None:
        """A warm-up input through the engine's own API (on the load thread, before READY).

        A string is a completion's prompt; an object is a request body without its model
        (``{"messages": [...]}`` a chat, ``{"prompt": ...}`` a completion), which the engine
        validates itself. Anything but a 200 fails the load with the engine's answer.
        """
        import httpx

        engine_ = self._engine
        if engine_ is None or not engine_.alive():
            raise errors.BackendUnavailable(f"the vLLM engine of {self.spec.id!r} is not running")
        body: dict[str, Any] = {"prompt": sample} if isinstance(sample, str) else dict(sample) if isinstance(sample, Mapping) else {}
        if not body:
            raise errors.BadInput(f"a vllm warm-up input is a prompt or a request body, not {type(sample).__name__}")
        body.setdefault("max_tokens", 8)
        body["model"], body["stream"] = self.spec.id, False
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        answer = httpx.post(engine_.url + path, json=body, headers=engine_.headers, timeout=120.0)
        if answer.status_code != 200:
            raise errors.ModelLoadFailed(f"the engine answered {path} with {answer.status_code}: {answer.text[:300]}")

    def predict(self, input_data: Any) -> Any:
        raise errors.BadInput(f"model {self.spec.id!r} is served by vLLM: use /v1/completions or /v1/chat/completions")

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        raise errors.BadInput(f"model {self.spec.id!r} is served by vLLM: use /v1/completions or /v1/chat/completions")

    def inputs(self) -> list[TensorSpec]:
        return []

    def outputs(self) -> list[TensorSpec]:
        return []


async def _exits(engine_: Engine, within_s: float) -> bool:
    """Whether `engine_`'s process exits within `within_s` (at once when it has already)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while engine_.alive():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True
