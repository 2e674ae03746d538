"""The OpenAI-compatible API's wire shapes: routes, requests, answers, stream chunks and errors.

The router, the worker and a test's stand-in engine all speak this API, so
its shapes are defined once here. Two rules shape the module:

- **Errors are OpenAI's**, not hotset's usual ``{"detail", "error"}``:
  ``{"error": {"message", "type", "param", "code"}}``, which the official
  clients turn into typed exceptions (``openai.NotFoundError``...). A request
  OpenAI would refuse as invalid is a 400 (not 422), as OpenAI and vLLM answer.
- **Requests are read leniently and checked strictly**: unknown fields pass
  (clients send fields that servers ignore), but the fields hotset reads
  are typed, so a malformed message list is a 400 naming the field. The router
  only ``peek``s (model, stream, prompt prefix); the worker validates the rest,
  and an engine that speaks this API itself (vLLM) validates its own bodies.
"""
from __future__ import annotations

import array
import base64
import dataclasses
import json
import sys
import time
import uuid
from typing import Annotated, Any, Literal, Sequence

import msgspec
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from hotset_common import errors
from hotset_common.spec import MAX_MODEL_ID

MODELS = "/v1/models"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
# Routes whose answers may be a stream of server-sent events.
GENERATION_ROUTES = (COMPLETIONS, CHAT_COMPLETIONS)
INFERENCE_ROUTES = (COMPLETIONS, CHAT_COMPLETIONS, EMBEDDINGS)

EVENT_STREAM = "text/event-stream"
DONE_EVENT = b"data: [DONE]\n\n"
# Characters of a prompt the stand-in engine's tests count prompts by (``prompt_prefix``).
PREFIX_CHARS = 256
# How much of a rendered prompt prefix-aware routing reads (about 8k tokens): its blocks, hashed,
# find the copy whose engine has the longest part of it cached (router prefix_routing.py).
PROMPT_CHARS = 32768
# Messages larger than this are not decoded to be rendered: their JSON text as sent stands in.
RENDER_LIMIT_BYTES = 32 * 2**10  # decoded and rendered in under 3 ms whatever their shape (a hostile 64 KiB of {}: 5.8 ms)

ROLES = ("system", "developer", "user", "assistant", "tool")


# ----- errors -------------------------------------------------------------------------------

def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``: what OpenAI's clients read."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


class OpenAIError(errors.HotsetError):
    """A refused OpenAI request that names the field at fault (``param``) and OpenAI's ``code``."""

    status_code = 400

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status_code = status


def body_of_error(exc: errors.HotsetError) -> tuple[int, dict[str, Any]]:
    """Any hotset error as an OpenAI answer: (status, body). A 422 (malformed request) is a 400 here."""
    status = 400 if exc.status_code == 422 else exc.status_code
    param = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    if isinstance(exc, errors.ModelNotFound) and code is None:
        param, code = "model", "model_not_found"
    return status, error_body(exc.message, status, param, code)


def describe_validation_error(exc: pydantic.ValidationError) -> OpenAIError:
    """The first problem of a request body, naming its field (``messages.0.role``) as OpenAI's ``param``."""
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"] if not _union_tag(part))
    message = "field required" if first["type"] == "missing" else first["msg"]
    return OpenAIError(f"{location}: {message}" if location else message, param=location or None)


def _union_tag(part: Any) -> bool:
    """Pydantic names the member of a union it tried (``str``, ``list[TextPart]``): not a field."""
    return isinstance(part, str) and (part in _TYPE_NAMES or "[" in part or part.startswith("function-")
                                      or part[:1].isupper())


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


# ----- requests -------------------------------------------------------------------------------

class _Lenient(BaseModel):
    """Unknown fields pass: clients send options a server may ignore."""

    model_config = ConfigDict(extra="allow")


# A list in a request body stops at its first bad item: a message list of 200,000 bad items took
# 2.3 s of event loop and built an error for every one, of which the answer names the first.
FailFast = Field(fail_fast=True)


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], FailFast] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Sampling(_Lenient):
    """What completions and chat completions share."""

    model: str = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)  # vLLM's extension: no end of text before this many tokens
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], FailFast] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)  # a 64-bit integer, as OpenAI and vLLM take it

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise OpenAIError("stop: at most 4 stop sequences", param="stop")
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], FailFast]
    echo: bool = False

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise OpenAIError(f"prompt: one prompt per request is supported, got {len(self.prompt)}", param="prompt")
        return self.prompt[0]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1, fail_fast=True)
    max_completion_tokens: int | None = Field(None, ge=1)

    def token_limit(self) -> int | None:
        """`max_completion_tokens` (newer clients) or `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


class EmbeddingRequest(_Lenient):
    model: str = Field(..., min_length=1)
    input: str | Annotated[list[str], FailFast]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)

    def texts(self) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else list(self.input)
        if not texts:
            raise OpenAIError("input: must not be empty", param="input")
        return texts


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a 400 in OpenAI's shape saying why not."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpenAIError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise OpenAIError(errors.TOO_DEEP) from None
    if not isinstance(value, dict):
        raise OpenAIError("request body must be a JSON object")
    return value


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """A request body as `model`; a 400 in OpenAI's shape naming the first field at fault."""
    value = json_object(raw)
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as exc:
        raise describe_validation_error(exc) from None
    except RecursionError:
        raise OpenAIError(errors.TOO_DEEP) from None


@dataclasses.dataclass(frozen=True)
class Peek:
    """What routing needs from a request body, read without validating the rest."""

    model: str
    stream: bool
    prefix: str  # the rendered prompt's first PROMPT_CHARS characters (``render``; "" for embeddings)


_ABSENT = msgspec.Raw(b"")


class _RequestHead(msgspec.Struct):
    """The fields routing reads of an OpenAI body, each kept as its raw JSON text. Decoding into it
    scans the body once and builds nothing else: a body of a million tiny items costs one pass, not a
    million Python objects (json.loads of a 4 MiB body of ``[],`` held 90 MiB), and a body that is not
    an object fails at its first byte."""

    model: msgspec.Raw = _ABSENT
    stream: msgspec.Raw = _ABSENT
    prompt: msgspec.Raw = _ABSENT
    messages: msgspec.Raw = _ABSENT


class _Part(msgspec.Struct):
    text: str = ""


class _Message(msgspec.Struct):
    role: str = ""
    content: str | list[_Part] | None = None


def render(messages: list[_Message] | list[dict[str, Any]], chars: int = PROMPT_CHARS) -> str:
    """Messages as one text, role and content in order, to `chars` characters: what a chat template
    makes of them up to its markup, so two requests sharing a conversation start share a prefix of it
    whatever their JSON's spacing or key order."""
    parts: list[str] = []
    size = 0
    for message in messages:
        role = message.get("role", "") if isinstance(message, dict) else message.role
        content = message.get("content") if isinstance(message, dict) else message.content
        if isinstance(content, list):
            content = "".join(p.text if isinstance(p, _Part) else p.get("text", "") if isinstance(p, dict) else ""
                              for p in content)
        text = f"{role}:{content if isinstance(content, str) else ''}\n"
        parts.append(text)
        size += len(text)
        if size >= chars:
            break
    return "".join(parts)[:chars]


def _rendered(head: "_RequestHead", chars: int) -> str:
    """The prompt routing reads: the rendered messages, else the prompt's text (the first of a list)."""
    if len(head.messages):
        if len(head.messages) <= RENDER_LIMIT_BYTES:
            try:
                return render(msgspec.json.decode(head.messages, type=list[_Message]), chars)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                pass  # a shape the worker refuses with its reason; routing reads the text as sent
        return memoryview(head.messages)[:4 * chars].tobytes().decode("utf-8", "ignore")[:chars]
    if len(head.prompt):
        try:
            prompt = msgspec.json.decode(head.prompt, type=str | list[str])
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return ""
        return (prompt if isinstance(prompt, str) else prompt[0] if prompt else "")[:chars]
    return ""


def peek(raw: bytes, prefix_chars: int = PROMPT_CHARS) -> Peek:
    """The model, `stream` and the rendered prompt's prefix of an OpenAI request body (400 when there
    is no model).

    The prefix is the prompt's text, or the messages rendered (``render``: role and content in order),
    to `prefix_chars` characters: prefix-aware routing hashes it in blocks of about an engine's cache
    block (prefix_routing.py). Messages over RENDER_LIMIT_BYTES are not decoded: their JSON text as
    sent stands in (the same client sends the same conversation start as the same bytes)."""
    try:
        head = msgspec.json.decode(raw, type=_RequestHead)
    except msgspec.ValidationError:
        raise OpenAIError("request body must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise OpenAIError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise OpenAIError(errors.TOO_DEEP) from None
    try:
        model = msgspec.json.decode(head.model, type=str) if len(head.model) else ""
    except (msgspec.ValidationError, RecursionError):
        model = ""
    if not model:
        raise OpenAIError("model: a model name is required", param="model")
    if len(model) > MAX_MODEL_ID:
        raise OpenAIError(f"model: {errors.excerpt(model)} is no model: model ids take at most {MAX_MODEL_ID} "
                          "characters", param="model", code="model_not_found", status=404)
    return Peek(model, len(head.stream) == 4 and bytes(head.stream) == b"true", _rendered(head, prefix_chars))


def prompt_prefix(body: dict[str, Any], chars: int = PREFIX_CHARS) -> str:
    """The leading text a prefix cache would reuse: the messages in order (role and text), or the prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[:chars]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    return render([m for m in messages if isinstance(m, dict)], chars)


# ----- answers ----------------------------------------------------------------------------------

def new_id(kind: str) -> str:
    """``cmpl-…`` or ``chatcmpl-…``: unique per answer."""
    return f"{kind}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(answer_id: str, model: str, text: str, finish_reason: str | None, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
    return {"id": answer_id, "object": "text_completion", "created": now(), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion_chunk(answer_id: str, model: str, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": answer_id, "object": "text_completion", "created": now(), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}


def chat_completion(answer_id: str, model: str, text: str, finish_reason: str | None, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": answer_id, "object": "chat.completion", "created": now(), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_chunk(answer_id: str, model: str, delta: dict[str, str], finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": answer_id, "object": "chat.completion.chunk", "created": now(), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def usage_chunk(answer_id: str, model: str, kind: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage`` asked for it: no choices, only usage."""
    return {"id": answer_id, "object": kind, "created": now(), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def embeddings(model: str, vectors: Sequence[Sequence[float]], encoding_format: str, prompt_tokens: int) -> dict[str, Any]:
    """``/v1/embeddings``: float lists, or base64 of little-endian float32 (what the official client asks for)."""
    data = []
    for index, row in enumerate(vectors):
        vector: Any = [float(x) for x in row]
        if encoding_format == "base64":
            packed = array.array("f", vector)
            if sys.byteorder == "big":
                packed.byteswap()
            vector = base64.b64encode(packed.tobytes()).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def model_card(model_id: str, owned_by: str = "hotset", parent: str | None = None) -> dict[str, Any]:
    """One entry of ``/v1/models`` (``parent``: the base model of a LoRA adapter, as vLLM lists it)."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": owned_by, "root": model_id, "parent": parent}


def event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
