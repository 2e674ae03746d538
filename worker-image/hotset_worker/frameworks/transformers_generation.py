"""Streaming generation with a transformers causal LM: chat templates, limits, per-token output.

``model.generate`` does the sampling; this module gives it a streamer that
decodes each token as it is produced (``generation.IncrementalDecoder``) and
a stopping criterion that ends generation when the client went away or a
stop sequence appeared. The prompt is checked against the model's context
before anything is generated, so a request that cannot fit is a 400 naming
``max_tokens`` (or the prompt), as OpenAI and vLLM answer it.
"""
from __future__ import annotations

import threading
from typing import Any

from hotset_common.openai_wire import OpenAIError
from hotset_worker.generation import GenerationRequest, GenerationResult, IncrementalDecoder, StopSequences, TokenSink


def prompt_text(tokenizer: Any, request: GenerationRequest, model_id: str) -> str:
    """The completion prompt, or the chat messages rendered with the model's own chat template."""
    if request.messages is None:
        return request.prompt or ""
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(f"model {model_id!r} has no chat template; use /v1/completions with a prompt",
                          param="messages")
    try:
        return tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja2's TemplateError (e.g. "roles must alternate") and the like
        raise OpenAIError(f"messages: model {model_id!r}'s chat template refused them: {exc}", param="messages") from exc


def new_token_budget(request: GenerationRequest, prompt_tokens: int, context: int) -> int:
    """How many tokens to generate; a 400 when the prompt and `max_tokens` do not fit the context."""
    room = context - prompt_tokens
    param = "messages" if request.messages is not None else "prompt"
    if room <= 0:
        raise OpenAIError(f"the prompt is {prompt_tokens} tokens; this model's context is {context} tokens",
                          param=param, code="context_length_exceeded")
    if request.max_tokens is None:
        return room
    if request.cap_to_context:
        return min(request.max_tokens, room)
    if request.max_tokens > room:
        raise OpenAIError(
            f"max_tokens is {request.max_tokens}, but this model's context is {context} tokens and the prompt "
            f"takes {prompt_tokens}: at most {room} can be generated",
            param="max_tokens", code="context_length_exceeded")
    return request.max_tokens


class _Streamer:
    """transformers' streamer interface (``put``/``end``): tokens to text, to the sink, per token."""

    def __init__(self, tokenizer: Any, sink: TokenSink, stops: StopSequences, eos_ids: set[int]) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._sink = sink
        self._stops = stops
        self._eos_ids = eos_ids
        self._prompt_seen = False
        self.generated = 0
        self.ended_by_eos = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate() hands the prompt over first
            self._prompt_seen = True
            return
        ids = [int(i) for i in value.reshape(-1).tolist()]
        self.generated += len(ids)
        self._sink.tokens(len(ids))
        if any(i in self._eos_ids for i in ids):
            self.ended_by_eos = True
        out = self._stops.feed(self._decoder.add(ids))
        if out:
            self._sink.text(out)

    def end(self) -> None:
        tail = self._stops.flush()
        if tail:
            self._sink.text(tail)


class _StopWhen:
    """A stopping criterion: the client went away, or a stop sequence was cut."""

    def __init__(self, sink: TokenSink, stops: StopSequences) -> None:
        self._sink = sink
        self._stops = stops

    def __call__(self, input_ids: Any, scores: Any, **_: Any) -> Any:
        import torch

        stop = self._stops.hit or self._sink.cancelled()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def generate(model: Any, tokenizer: Any, tokenizer_lock: threading.Lock, context: int, device: Any,
             request: GenerationRequest, sink: TokenSink, model_id: str) -> GenerationResult:
    """Generate for one request on this thread, streaming into `sink`."""
    import torch
    from transformers import StoppingCriteriaList

    text = prompt_text(tokenizer, request, model_id)
    with tokenizer_lock:
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=request.messages is None)
    prompt_tokens = int(encoded["input_ids"].shape[1])
    if prompt_tokens == 0:
        raise OpenAIError("prompt: must not be empty", param="prompt")
    budget = new_token_budget(request, prompt_tokens, context)
    if request.min_tokens > budget:
        raise OpenAIError(f"min_tokens is {request.min_tokens}, more than the {budget} tokens this request may generate",
                          param="min_tokens")
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    stops = StopSequences(request.stop)
    streamer = _Streamer(tokenizer, sink, stops, eos_ids)
    sampling: dict[str, Any] = {"do_sample": False}
    if request.temperature > 0:
        # OpenAI's sampling: temperature and nucleus only (no top-k cut, which transformers adds by default).
        sampling = {"do_sample": True, "temperature": request.temperature, "top_p": request.top_p, "top_k": 0}
        if request.seed is not None:
            torch.manual_seed(request.seed)  # torch's one generator: reproducible for one request at a time
    sink.started(prompt_tokens)
    with torch.inference_mode():
        model.generate(
            **{k: v.to(device) for k, v in encoded.items()}, max_new_tokens=budget, min_new_tokens=request.min_tokens,
            streamer=streamer, stopping_criteria=StoppingCriteriaList([_StopWhen(sink, stops)]),
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids), 0),
            **sampling,
        )
    reason = "stop" if streamer.ended_by_eos or stops.hit else "length"
    return GenerationResult(prompt_tokens, streamer.generated, reason)
