"""Hugging Face transformers models saved with ``save_pretrained``, run in the worker's process.

Three tasks: ``text-classification`` (softmax probabilities named by the
model's own ``config.id2label``), ``embedding`` (mean pooling over the
tokens, L2-normalised) and ``text-generation`` (a causal LM: streamed
generation with the model's chat template, transformers_generation.py).
Files come from the model's source folder only; the hub is never asked.
"""
from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import Any

import numpy as np

from modelplane_common import errors
from modelplane_common.spec import Task
from modelplane_worker import engine, memory
from modelplane_worker.frameworks import sources, torch_common, transformers_generation
from modelplane_worker.frameworks.base import FrameworkWorker, TensorSpec
from modelplane_worker.generation import GenerationRequest, GenerationResult, TokenSink

log = logging.getLogger(__name__)

TEXT_INPUT = "text"
PROBABILITIES_OUTPUT = "probabilities"
EMBEDDING_OUTPUT = "embedding"
GENERATED_OUTPUT = "text_output"
SUPPORTED_TASKS = (Task.TEXT_CLASSIFICATION, Task.EMBEDDING, Task.TEXT_GENERATION)
# /predict and OIP infer on a text-generation model: a greedy continuation of this many tokens at most.
PREDICT_MAX_TOKENS = 32
# A token covers about four characters of ordinary text; the model keeps only `max_length`
# tokens, so a text is cut to this many characters per token before tokenizing. Otherwise a
# 1 MiB text is tokenized whole (about a second per MiB, under the model's tokenizer lock, with
# hundreds of MB of token objects) only for all but its start to be dropped.
CHARS_PER_TOKEN = 8


@engine.register("transformers")
class TransformersWorker(FrameworkWorker):
    """A text classifier or a sentence encoder."""

    def __init__(self, spec: Any, context: Any) -> None:
        super().__init__(spec, context)
        self._model: Any = None
        self._tokenizer: Any = None
        self._labels: list[str] = []
        self._width = 0  # classes or embedding dimensions
        self._bytes = 0
        self._max_length = 512
        self._device: Any = None
        # Fast tokenizers raise "Already borrowed" when two threads call one at once.
        self._tokenizer_lock = threading.Lock()

    @classmethod
    def prepare(cls) -> None:
        """Import torch and transformers' auto classes at pod start (seconds), not in the first load."""
        import torch  # noqa: F401
        from transformers import (  # noqa: F401
            AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
        )
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # a server's log is no terminal

    @classmethod
    def prepare_models(cls, specs: list[Any], context: Any) -> None:
        """Import each architecture's modeling module (``BertForSequenceClassification`` and the like)."""
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

        for spec in specs:
            try:
                config = AutoConfig.from_pretrained(str(sources.resolve(spec.source, context.source_roots)),
                                                    local_files_only=True)
                auto = AutoModelForSequenceClassification if Task(spec.task) == Task.TEXT_CLASSIFICATION else AutoModel
                auto._model_mapping[type(config)]  # the lazy mapping imports the class's module
            except Exception as exc:  # noqa: BLE001 - the model's own load reports what is wrong with it
                log.info("could not prepare %s: %s", spec.id, exc)

    @classmethod
    def declared_tensors(cls, spec: Any, context: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """From config.json: the number of labels, or the embedding width."""
        config = json.loads((sources.resolve(spec.source, context.source_roots, context.file_roots) / "config.json").read_text())
        described = cls(spec, context)
        if Task(spec.task) == Task.TEXT_CLASSIFICATION:
            described._width = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
        elif Task(spec.task) == Task.TEXT_GENERATION:
            pass
        else:
            described._width = int(config.get("hidden_size", 0))
        return described.inputs(), described.outputs()

    @property
    def task(self) -> Task:
        return Task(self.spec.task)

    def load(self) -> None:
        if self.task not in SUPPORTED_TASKS:
            supported = ", ".join(t.value for t in SUPPORTED_TASKS)
            raise errors.ModelLoadFailed(
                f"model {self.spec.id!r}: the transformers worker serves tasks {supported}, not {self.task.value!r}"
            )
        folder = sources.resolve(self.spec.source, self.context.source_roots, self.context.file_roots)
        self.prepare()
        from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        self._device = torch_common.torch_device(self.context.device)
        model_class = {Task.TEXT_CLASSIFICATION: AutoModelForSequenceClassification,
                       Task.TEXT_GENERATION: AutoModelForCausalLM}.get(self.task, AutoModel)
        # On CPU, read the weights into our memory instead of mapping the file: the first
        # requests then do not page-fault from disk, the measured size is resident, and a
        # file replaced on the volume cannot change a loaded model. (CUDA copies anyway.)
        read_into_memory = self._device.type == "cpu"
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            model = model_class.from_pretrained(str(folder), local_files_only=True, disable_mmap=read_into_memory)
        except Exception as exc:  # transformers raises OSError, ValueError, KeyError, safetensors errors...
            raise errors.ModelLoadFailed(
                f"model {self.spec.id!r}: transformers could not load {folder}: {type(exc).__name__}: {exc}"
            ) from exc
        model = model.to(self._device).eval()
        self._tokenizer, self._model = tokenizer, model
        # Tokenizers saved without a model_max_length report a huge one: cap at the model's positions.
        positions = getattr(model.config, "max_position_embeddings", None) or 512
        self._max_length = min(int(getattr(tokenizer, "model_max_length", positions) or positions), int(positions))
        if self.task == Task.TEXT_CLASSIFICATION:
            id2label = model.config.id2label or {}
            self._width = int(model.config.num_labels)
            self._labels = [str(id2label.get(i, f"LABEL_{i}")) for i in range(self._width)]
        elif self.task == Task.TEXT_GENERATION:
            self._max_length = int(positions)  # the whole context: prompt and generated tokens
        else:
            self._width = int(model.config.hidden_size)
        self._bytes = memory.module_bytes(model)

    def _require_loaded(self) -> None:
        if self._model is None:
            raise errors.BackendUnavailable(f"model {self.spec.id!r} is not loaded")

    def _run(self, texts: list[str]) -> np.ndarray:
        """Probabilities [N, C] or normalised embeddings [N, D] as float32."""
        self._require_loaded()
        torch_common.check_batch_size(len(texts), "input text list")
        import torch

        limit = self._max_length * CHARS_PER_TOKEN
        texts = [text[:limit] for text in texts]
        with self._tokenizer_lock:
            batch = self._tokenizer(texts, padding=True, truncation=True, max_length=self._max_length,
                                    return_tensors="pt")
        batch = {name: tensor.to(self._device) for name, tensor in batch.items()}
        with torch.inference_mode():
            if self.task == Task.TEXT_CLASSIFICATION:
                result = torch.softmax(self._model(**batch).logits.float(), dim=-1)
            else:
                hidden = self._model(**batch).last_hidden_state.float()
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                result = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        return result.cpu().numpy().astype(np.float32)

    def predict(self, input_data: Any) -> Any:
        texts = _texts_from_json(input_data)
        if self.task == Task.TEXT_GENERATION:
            return [{"generated_text": text} for text in self._continue(texts)]
        result = self._run(texts)
        if self.task == Task.TEXT_CLASSIFICATION:
            return torch_common.labelled_rows(result, self._labels)
        return [{"embedding": row} for row in result.tolist()]

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        if set(inputs) != {TEXT_INPUT}:
            raise errors.BadInput(
                f"model {self.spec.id!r} takes exactly one input {TEXT_INPUT!r} (BYTES [N]); got {sorted(inputs)}"
            )
        texts = _texts_from_tensor(inputs[TEXT_INPUT])
        if self.task == Task.TEXT_GENERATION:
            return {GENERATED_OUTPUT: np.array([t.encode() for t in self._continue(texts)], dtype=np.object_)}
        result = self._run(texts)
        name = PROBABILITIES_OUTPUT if self.task == Task.TEXT_CLASSIFICATION else EMBEDDING_OUTPUT
        return {name: result}

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec(TEXT_INPUT, "BYTES", [-1])]

    def outputs(self) -> list[TensorSpec]:
        if self.task == Task.TEXT_GENERATION:
            return [TensorSpec(GENERATED_OUTPUT, "BYTES", [-1])]
        name = PROBABILITIES_OUTPUT if self.task == Task.TEXT_CLASSIFICATION else EMBEDDING_OUTPUT
        return [TensorSpec(name, "FP32", [-1, self._width or -1])]

    def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        self._require_loaded()
        if self.task != Task.TEXT_GENERATION:
            raise errors.BadInput(f"model {self.spec.id!r} is a {self.task.value} model; it does not generate text")
        return transformers_generation.generate(self._model, self._tokenizer, self._tokenizer_lock, self._max_length,
                                                self._device, request, sink, self.spec.id)

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        if self.task != Task.EMBEDDING:
            raise errors.BadInput(f"model {self.spec.id!r} is a {self.task.value} model; it does not embed text")
        with self._tokenizer_lock:
            counted = self._tokenizer(texts, truncation=True, max_length=self._max_length)["input_ids"]
        return self._run(texts).tolist(), sum(len(ids) for ids in counted)

    def _continue(self, texts: list[str]) -> list[str]:
        """A short greedy continuation of each text (the seed and OIP APIs; OpenAI's are richer)."""
        torch_common.check_batch_size(len(texts), "input text list")
        outputs = []
        for text in texts:
            sink = _Collect()
            self.generate(GenerationRequest(prompt=text, temperature=0.0, max_tokens=PREDICT_MAX_TOKENS,
                                            cap_to_context=True), sink)
            outputs.append("".join(sink.parts))
        return outputs

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    def unload(self) -> None:
        dropped = [weakref.ref(self._model)] if self._model is not None else []
        self._model = None
        self._tokenizer = None
        memory.release(dropped)

    def measured_bytes(self) -> int:
        return self._bytes

    def is_ready(self) -> bool:
        return self._model is not None


class _Collect:
    """A TokenSink that keeps the text (predict and infer answer whole)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def started(self, prompt_tokens: int) -> None:
        pass

    def text(self, delta: str) -> None:
        self.parts.append(delta)

    def tokens(self, count: int) -> None:
        pass

    def cancelled(self) -> bool:
        return False


def _texts_from_json(input_data: Any) -> list[str]:
    if isinstance(input_data, str):
        return [input_data]
    if isinstance(input_data, list) and all(isinstance(item, str) for item in input_data):
        return list(input_data)
    raise errors.BadInput(
        f"input_data must be a string or a list of strings, got {type(input_data).__name__}"
    )


def _texts_from_tensor(tensor: np.ndarray) -> list[str]:
    if tensor.ndim == 2 and tensor.shape[1] == 1:
        tensor = tensor[:, 0]
    if tensor.ndim != 1:
        raise errors.BadInput(f"input {TEXT_INPUT!r} must have shape [N], got {list(tensor.shape)}")
    texts = []
    for item in tensor.tolist():
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise errors.BadInput(f"input {TEXT_INPUT!r} holds bytes that are not UTF-8 text: {exc}") from exc
        if not isinstance(item, str):
            raise errors.BadInput(f"input {TEXT_INPUT!r} must be BYTES (text), got {tensor.dtype} elements")
        texts.append(item)
    return texts
