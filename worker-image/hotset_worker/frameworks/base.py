"""The lifecycle every framework worker implements.

The manager only ever calls these methods, so adding a framework is one
class plus one ``@register`` line, and nothing else changes. Unloading is an
explicit call, never ``__del__``: the manager must know when memory is back.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, ClassVar, Mapping

import numpy as np

from hotset_common import errors
from hotset_common.spec import ModelSpec

if TYPE_CHECKING:
    from hotset_worker.generation import GenerationRequest, GenerationResult, TokenSink
    from hotset_worker.sources.fetcher import SourceFetcher


@dataclass(frozen=True)
class WorkerContext:
    """What a framework worker may need from its pod, injected (never read from globals)."""

    source_roots: dict[str, Path] = field(default_factory=dict)  # pvc claim name -> mount path
    # Folders file:// sources may name (cluster mode); None: any path (sources.py).
    file_roots: tuple[Path, ...] | None = None
    # Triton backends a triton model's config may ask for (cluster mode; the Python backend runs
    # the model's own code); None: any (triton_policy.check).
    triton_backends: frozenset[str] | None = None
    # Servers outside this process by name (backends.Backend), e.g. "triton": the pod's sidecar,
    # which the triton worker stages into, loads in and infers with.
    backends: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"  # "cuda" when torch.cuda.is_available()
    # Remote sources (s3://, hf://, oci://, https://) as local folders (hotset_worker.sources.fetcher);
    # None: only file:// and pvc:// sources load.
    fetcher: "SourceFetcher | None" = None
    # Where Triton can read what the worker can (the source cache, image volumes): a triton model
    # from under one of these is linked into the repository instead of copied (triton_worker).
    shared_roots: tuple[Path, ...] = ()


@dataclass(frozen=True)
class ForwardedResponse:
    """An OIP v2 infer answer from a backend, passed on as it came (status, headers, body)."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class StreamedResponse:
    """An engine's answer to an OpenAI request, still arriving: status and headers now, the body as
    it comes (server-sent events pass through one by one). `close` gives the connection back."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]


@dataclass
class RowsResult:
    """One request's share of a forward pass: its rows of the output, and the tokens they took."""

    values: np.ndarray
    tokens: int = 0


@dataclass
class Rows:
    """One request's inputs, checked and ready to join a batch (dynamic batching).

    `payload` is the framework's own (texts, a float array); `finish` turns this request's
    share of the output into its answer (predictions, named tensors, vectors)."""

    count: int  # rows this request adds to a forward pass
    payload: Any
    finish: Callable[[RowsResult], Any]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # OIP v2 datatype, e.g. FP32, INT64, BYTES
    shape: list[int]  # -1 for a variable dimension


class FrameworkWorker(abc.ABC):
    """One loaded (or loadable) model of one framework."""

    framework: ClassVar[str]

    def __init__(self, spec: ModelSpec, context: WorkerContext) -> None:
        self.spec = spec
        self.context = context

    @abc.abstractmethod
    def load(self) -> None:
        """Read the model from its source into memory; raise ModelLoadFailed naming the cause."""

    def warm_up(self, sample: Any) -> None:
        """Run one of the spec's warm-up inputs through the new copy (on the load thread).
        Most frameworks answer it as a request; an engine-backed one sends it to its engine."""
        self.predict(sample)

    @abc.abstractmethod
    def predict(self, input_data: Any) -> Any:
        """Seed-compatible inference: JSON in, JSON-serialisable predictions out; BadInput on bad data."""

    @abc.abstractmethod
    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        """OIP v2 inference on named tensors; BadInput names the wrong tensor, shape or dtype."""

    @abc.abstractmethod
    def inputs(self) -> list[TensorSpec]:
        """Input tensors for OIP v2 model metadata."""

    @abc.abstractmethod
    def outputs(self) -> list[TensorSpec]:
        """Output tensors for OIP v2 model metadata."""

    @abc.abstractmethod
    def unload(self) -> None:
        """Drop every reference to the model's memory and give it back (gc, empty_cache, malloc_trim)."""

    @abc.abstractmethod
    def measured_bytes(self) -> int:
        """Bytes this model occupies now that it is loaded (replaces the spec's estimate)."""

    def measures_its_own_bytes(self) -> bool:
        """Whether ``measured_bytes()`` counts this copy's own allocations (its tensors), not a
        process's resident memory or an engine's reservation, which move with what else runs.
        Only an exact measure proves a spec's ``memory`` too small (the manager then refuses the
        model, since admission counts what the spec declares). Called after load."""
        return False

    @classmethod
    def declared_tensors(cls, spec: ModelSpec, context: WorkerContext) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
        """Inputs and outputs as the model's files declare them, read without loading the model, so
        OIP metadata can describe a cold model (a generic client asks for it before its first infer,
        and asking must not load anything). None: known only once loaded. Runs on a thread."""
        return None

    @classmethod
    def prepare(cls) -> None:
        """One-time warm-up when the pod starts (heavy imports such as torch), so the first
        load does not pay for it; the pod reports ready only after it. Optional."""

    @classmethod
    def prepare_models(cls, specs: list[ModelSpec], context: WorkerContext) -> None:
        """At pod start, after `prepare()`: import the code these particular models need (a
        transformers architecture's module takes a second or more), so that neither their first
        load nor the requests waiting for it pay for it. Best effort; optional."""

    def is_ready(self) -> bool:
        """Whether the model can serve now (the triton worker asks its sidecar)."""
        return True

    def lost(self) -> bool:
        """Whether what served this copy is known to be gone (an engine process that exited), so a
        request must not be sent to it but wait for the copy to load again. Cheap: the warm path asks."""
        return False

    # ----- dynamic batching (optional; batching.py drives it) ---------------------------------

    def batchable(self) -> bool:
        """Whether requests for this copy can share a forward pass (``forward`` and the
        ``rows_for_*`` methods are implemented). In-process classifiers and encoders are."""
        return False

    def rows_for_predict(self, input_data: Any) -> Rows:
        """Check one seed ``/predict`` request's input (BadInput fails that request alone)."""
        raise NotImplementedError

    def rows_for_infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Rows:
        """Check one OIP v2 request's tensors (BadInput fails that request alone)."""
        raise NotImplementedError

    def rows_for_embed(self, texts: list[str]) -> Rows:
        """Check one OpenAI embeddings request (answers ``(vectors, prompt tokens)``)."""
        raise NotImplementedError

    def forward(self, batch: list[Rows]) -> list[RowsResult]:
        """One forward pass (or one per group of similar length) over the rows of every request in
        `batch`; each request's share, in order. Runs on an inference thread."""
        raise NotImplementedError

    async def forward_infer(self, body: bytes, headers: Mapping[str, str]) -> ForwardedResponse | None:
        """Optional: pass an OIP v2 infer body on to a backend that speaks OIP itself, untouched,
        and return its answer untouched (no decode/encode in this process). None: not supported
        here (or not now), so the caller decodes the body and calls ``infer``. Runs on the event
        loop: it must not block. Workers that override it are asked before the body is decoded."""
        return None

    def generate(self, request: "GenerationRequest", sink: "TokenSink") -> "GenerationResult":
        """Optional (``text-generation`` models run in this process): generate on the calling thread,
        handing tokens to `sink` as they exist (see generation.py). Raise BadInput before
        ``sink.started`` for a prompt the model cannot take."""
        raise errors.BadInput(f"model {self.spec.id!r} ({self.framework}) does not generate text")

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """Optional (``embedding`` models): one vector per text, and the prompt tokens they took."""
        raise errors.BadInput(f"model {self.spec.id!r} ({self.framework}) does not embed text")

    async def open_openai(self, path: str, body: bytes, headers: Mapping[str, str]) -> StreamedResponse | None:
        """Optional: send an OpenAI request (``/v1/...``) to an engine that speaks the OpenAI API itself
        (vLLM) and return its answer as it arrives, untouched. None: not supported here, so the
        worker generates or embeds in process. Runs on the event loop: it must not block."""
        return None

    @classmethod
    def forwards_openai(cls) -> bool:
        """Whether this framework overrides ``open_openai`` (its engine answers OpenAI requests itself)."""
        return cls.open_openai is not FrameworkWorker.open_openai

    @classmethod
    def forwards_infer(cls) -> bool:
        """Whether this framework overrides ``forward_infer`` (so a body is decoded only if it declines)."""
        return cls.forward_infer is not FrameworkWorker.forward_infer
