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
import mmap
import threading
import weakref
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from hotset_common import errors
from hotset_common.spec import Task
from hotset_worker import engine, memory
from hotset_worker.frameworks import shared_tokenizers, sources, torch_common, transformers_generation
from hotset_worker.batching import group_by_length
from hotset_worker.frameworks.base import FrameworkWorker, Rows, RowsResult, TensorSpec
from hotset_worker.generation import GenerationRequest, GenerationResult, TokenSink

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
# transformers' from_pretrained patches process-wide objects while it builds a model (it replaces
# PreTrainedModel.tie_weights and torch.linspace, sets torch's default dtype) and puts them back
# after. Two loads on two threads interleave those patches: one restores the other's stand-in as
# "the original", tie_weights stays a no-op for the rest of the process, and every later load of a
# model with tied weights fails with "Cannot copy out of meta tensor" (its head is never tied).
# Measured: 1 of 6 concurrent tiny-chat + mini-embed loads broke the process that way. So one
# from_pretrained runs at a time; the rest of a load (moving to the device, warm-up) does not wait.
_FROM_PRETRAINED = threading.Lock()
# Single-file checkpoints load through fast_load (the library's own config and model classes,
# weights assigned in place) and fall back to from_pretrained whenever it is not the same load.
# Weights read into memory pass through it up to this size (a load holds the file's bytes and
# the tensors at once); mapped weights at any size.
FAST_LOAD = True
FAST_LOAD_MAX_BYTES = 512 * 2**20


@engine.register("transformers")
class TransformersWorker(FrameworkWorker):
    """A text classifier or a sentence encoder."""

    def __init__(self, spec: Any, context: Any) -> None:
        super().__init__(spec, context)
        self._model: Any = None
        # Shared with every copy whose tokenizer files are the same (shared_tokenizers.py); its lock,
        # because fast tokenizers raise "Already borrowed" when two threads call one at once.
        self._tokenizer: shared_tokenizers.SharedTokenizer | None = None
        self._labels: list[str] = []
        self._width = 0  # classes or embedding dimensions
        self._bytes = 0
        self._max_length = 512
        self._device: Any = None

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
        """Import each architecture's modeling module (``BertForSequenceClassification`` and the like),
        once per distinct config: a catalog of thousands of fine-tunes of one base is one import."""
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

        seen: set[tuple[bool, bytes]] = set()
        for spec in specs:
            try:
                folder = sources.cached_folder(spec, context)  # never a download at pod start
                if folder is None:
                    continue
                classifier = Task(spec.task) == Task.TEXT_CLASSIFICATION
                key = (classifier, (folder / "config.json").read_bytes())
                if key in seen:
                    continue
                seen.add(key)
                config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
                auto = AutoModelForSequenceClassification if classifier else AutoModel
                auto._model_mapping[type(config)]  # the lazy mapping imports the class's module
            except Exception as exc:  # noqa: BLE001 - the model's own load reports what is wrong with it
                log.info("could not prepare %s: %s", spec.id, exc)

    @classmethod
    def declared_tensors(cls, spec: Any, context: Any) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
        """From config.json: the number of labels, or the embedding width."""
        folder = sources.cached_folder(spec, context)
        if folder is None:
            return None  # a remote source not fetched yet: known once loaded
        config = json.loads((folder / "config.json").read_text())
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
        folder = sources.folder(self.spec, self.context)
        self.prepare()
        from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        self._device = torch_common.torch_device(self.context.device)
        model_class = {Task.TEXT_CLASSIFICATION: AutoModelForSequenceClassification,
                       Task.TEXT_GENERATION: AutoModelForCausalLM}.get(self.task, AutoModel)
        # On CPU, weights from a folder whose files never change under a loaded copy (the source
        # cache, an image volume: sources.immutable) are mapped from the file, with every page
        # read during the load: no copy of the bytes the page cache already holds (a 200 MiB
        # model loads in tens of milliseconds instead of hundreds). Weights from file:// and
        # pvc:// folders are read into our memory: their users may rewrite a file in place,
        # which must not change (or crash) a loaded model. (CUDA copies anyway.)
        on_cpu = self._device.type == "cpu"
        mapped = on_cpu and sources.immutable(self.spec)
        shared = None
        try:
            shared = shared_tokenizers.TOKENIZERS.acquire(
                folder, lambda: AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
            model = None
            if on_cpu and self.task != Task.TEXT_GENERATION and FAST_LOAD:
                model = fast_load(model_class, folder, mapped=mapped)
            if model is None:
                with _FROM_PRETRAINED:  # one at a time: it patches process-wide objects
                    model = model_class.from_pretrained(str(folder), local_files_only=True,
                                                        disable_mmap=on_cpu and not mapped)
        except Exception as exc:  # transformers raises OSError, ValueError, KeyError, safetensors errors...
            if shared is not None:
                shared_tokenizers.TOKENIZERS.release(shared)
            raise errors.ModelLoadFailed(
                f"model {self.spec.id!r}: transformers could not load {folder} (source {self.spec.source!r}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        model = model.to(self._device).eval()
        self._tokenizer, self._model = shared, model
        tokenizer = shared.tokenizer
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

    def _encode(self, texts: list[str]) -> Any:
        """Tokenize `texts` into one padded batch (cut first: the model keeps only `max_length` tokens)."""
        limit = self._max_length * CHARS_PER_TOKEN
        texts = [text[:limit] for text in texts]
        with self._tokenizer.lock:
            return self._tokenizer.tokenizer(texts, padding=True, truncation=True, max_length=self._max_length,
                                             return_tensors="pt")

    def _pass(self, batch: dict[str, Any]) -> np.ndarray:
        """Probabilities [N, C] or normalised embeddings [N, D] as float32, for one padded batch."""
        import torch

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

    # ----- dynamic batching: every text request goes through forward() -------------------------

    def batchable(self) -> bool:
        return self.task in (Task.TEXT_CLASSIFICATION, Task.EMBEDDING)

    def _rows(self, texts: list[str], finish: Any) -> Rows:
        self._require_loaded()
        torch_common.check_batch_size(len(texts), "input text list")
        return Rows(len(texts), texts, finish)

    def rows_for_predict(self, input_data: Any) -> Rows:
        if self.task == Task.TEXT_GENERATION:
            raise errors.BadInput(f"model {self.spec.id!r} generates text: its requests are not batched")
        labels = self._labels
        if self.task == Task.TEXT_CLASSIFICATION:
            return self._rows(_texts_from_json(input_data), lambda r: torch_common.labelled_rows(r.values, labels))
        return self._rows(_texts_from_json(input_data), lambda r: [{"embedding": row} for row in r.values.tolist()])

    def rows_for_infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Rows:
        if set(inputs) != {TEXT_INPUT}:
            raise errors.BadInput(
                f"model {self.spec.id!r} takes exactly one input {TEXT_INPUT!r} (BYTES [N]); got {sorted(inputs)}"
            )
        name = PROBABILITIES_OUTPUT if self.task == Task.TEXT_CLASSIFICATION else EMBEDDING_OUTPUT
        return self._rows(_texts_from_tensor(inputs[TEXT_INPUT]), lambda r: {name: r.values})

    def rows_for_embed(self, texts: list[str]) -> Rows:
        if self.task != Task.EMBEDDING:
            raise errors.BadInput(f"model {self.spec.id!r} is a {self.task.value} model; it does not embed text")
        return self._rows(list(texts), lambda r: (r.values.tolist(), r.tokens))

    def forward(self, batch: list[Rows]) -> list[RowsResult]:
        """Tokenize every request's texts at once, then run one pass per group of similar length
        (``batching.group_by_length``): short texts are not padded to a long one's length."""
        self._require_loaded()
        texts = [text for rows in batch for text in rows.payload]
        encoded = self._encode(texts)
        mask = encoded["attention_mask"]
        lengths = mask.sum(dim=1).tolist()
        groups = group_by_length(lengths) if len(texts) > 1 else [[0]]
        if len(groups) == 1:
            values = self._pass(dict(encoded))
        else:
            values = np.empty((len(texts), self._width), dtype=np.float32)
            left = getattr(self._tokenizer.tokenizer, "padding_side", "right") == "left"
            for group in groups:
                longest = max(lengths[index] for index in group)
                columns = slice(mask.shape[1] - longest, None) if left else slice(0, longest)
                values[group] = self._pass({name: tensor[group][:, columns] for name, tensor in encoded.items()})
        results, start = [], 0
        for rows in batch:
            end = start + rows.count
            results.append(RowsResult(values[start:end], int(sum(lengths[start:end]))))
            start = end
        return results

    def _one(self, rows: Rows) -> Any:
        return rows.finish(self.forward([rows])[0])

    def predict(self, input_data: Any) -> Any:
        if self.task == Task.TEXT_GENERATION:
            return [{"generated_text": text} for text in self._continue(_texts_from_json(input_data))]
        return self._one(self.rows_for_predict(input_data))

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        if self.task == Task.TEXT_GENERATION:
            if set(inputs) != {TEXT_INPUT}:
                raise errors.BadInput(
                    f"model {self.spec.id!r} takes exactly one input {TEXT_INPUT!r} (BYTES [N]); got {sorted(inputs)}"
                )
            texts = _texts_from_tensor(inputs[TEXT_INPUT])
            return {GENERATED_OUTPUT: np.array([t.encode() for t in self._continue(texts)], dtype=np.object_)}
        return self._one(self.rows_for_infer(inputs, parameters))

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
        return transformers_generation.generate(self._model, self._tokenizer.tokenizer, self._tokenizer.lock, self._max_length,
                                                self._device, request, sink, self.spec.id)

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        return self._one(self.rows_for_embed(texts))

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
        if self._tokenizer is not None:
            shared_tokenizers.TOKENIZERS.release(self._tokenizer)
        self._tokenizer = None
        memory.release(dropped)

    def measured_bytes(self) -> int:
        return self._bytes

    def measures_its_own_bytes(self) -> bool:
        return True  # the module's parameters and buffers, counted tensor by tensor

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


def fast_load(model_class: Any, folder: Path, mapped: bool = False) -> Any:
    """The model of `folder` as ``from_pretrained`` would build it, for a single-file safetensors
    checkpoint saved by ``save_pretrained`` with this very architecture; None when that cannot be
    shown, so the caller takes ``from_pretrained`` (prefixes to adapt, weights the checkpoint
    lacks, another dtype, quantized or adapter models, sharded or pickled weights).

    ``from_pretrained`` spends most of a small model's load in Python around the weights (file
    lookups, key matching, initialising weights it then overwrites); here the library builds the
    architecture from its config without initialising weights, and the checkpoint's tensors are
    assigned in place. The answer is the same model (tests compare outputs).

    `mapped`: the tensors stay views of the file mapped into memory (only for files that never
    change while the model is loaded: ``sources.immutable``), every page read once here so the
    first request does not fault them in; else they are read into memory the model owns (two
    passes over the bytes, so only checkpoints up to ``FAST_LOAD_MAX_BYTES``)."""
    import safetensors.torch
    from transformers import AutoConfig

    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights

    weights = folder / "model.safetensors"
    if not weights.is_file() or (folder / "adapter_config.json").exists():
        return None
    if not mapped and weights.stat().st_size > FAST_LOAD_MAX_BYTES:
        return None
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    if getattr(config, "quantization_config", None):
        return None
    with no_init_weights():
        model = model_class.from_config(config)
    # load_file maps the file (copy-on-write: the model can never write to it); load() of the
    # bytes makes tensors that own their memory.
    state = safetensors.torch.load_file(weights) if mapped else safetensors.torch.load(weights.read_bytes())
    expected = model.state_dict()
    if set(state) - set(expected) or any(state[k].dtype != expected[k].dtype or state[k].shape != expected[k].shape
                                        for k in state):
        return None
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    loaded = {tensor.data_ptr() for tensor in state.values()}
    current = model.state_dict()
    if any(current[key].data_ptr() not in loaded for key in missing):
        return None  # a weight the checkpoint lacks and no tie provides: from_pretrained's job
    if mapped:
        read_every_page(state.values())
    del state
    return model.eval()


def read_every_page(tensors: Iterable[Any]) -> None:
    """Read one byte of every memory page the `tensors` span, so their pages are resident (from
    the page cache, or from disk if it dropped them) when the load ends, not at the first request."""
    import torch

    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        raw = tensor.detach().reshape(-1).view(torch.uint8)
        raw[::mmap.PAGESIZE].sum()
        raw[-1:].sum()  # the last page, which the stride may step over
