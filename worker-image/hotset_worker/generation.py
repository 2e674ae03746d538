"""Text generation in the worker's process: what a request asks for, and how its tokens come out.

A framework worker that generates text (transformers' ``text-generation``
task) runs ``generate(request, sink)`` on a thread. The sink is how tokens
leave that thread as they exist: ``started`` once the prompt was checked (a
refused prompt raises before it, so the client gets a 400, not a broken
stream), then ``text`` for each decoded piece and ``tokens`` for each step.
The OpenAI routes (openai_routes.py) turn those calls into server-sent events.

Decoding is incremental and per token, the way vLLM does it: each new token
is decoded together with the few before it (so a tokenizer that strips a
word's leading space when it stands alone still spaces it), and text is held
back only while it ends in an incomplete UTF-8 sequence, or while it could
be the start of a stop sequence. transformers' ``TextIteratorStreamer``
holds text until a word ends; here a token goes out when it exists.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One completion or chat completion, in the worker's terms."""

    prompt: str | None = None  # /v1/completions
    messages: Sequence[dict[str, str]] | None = None  # /v1/chat/completions: role and text of each message
    max_tokens: int | None = None  # None: as many as the model's context leaves
    min_tokens: int = 0  # no end of text before this many (vLLM's extension of the API)
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    cap_to_context: bool = False  # a max_tokens the context cannot hold is reduced, not refused


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of text or a stop sequence) or "length"


class TokenSink(Protocol):
    """Where a generating thread hands its output (called on that thread)."""

    def started(self, prompt_tokens: int) -> None:
        """The prompt was accepted; tokens follow."""

    def text(self, delta: str) -> None:
        """The next piece of text, ready to send."""

    def tokens(self, count: int) -> None:
        """`count` more output tokens were generated."""

    def cancelled(self) -> bool:
        """Whether the client went away (generation stops at the next token)."""


class IncrementalDecoder:
    """Token ids in, text out as soon as it is complete (vLLM's prefix/read offsets)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # first id decoded as context for the new ones
        self._read = 0  # ids before this one are already text

    def add(self, ids: Sequence[int]) -> str:
        """The text the new ids complete ('' while it ends in an incomplete character)."""
        self._ids.extend(int(i) for i in ids)
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""
        # The ids just turned into text are the next decode's context.
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""


class StopSequences:
    """Cuts the text at the first stop sequence, holding back what could still become one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""
        self.hit = False

    def feed(self, text: str) -> str:
        """What of `text` (after what was held back) can be sent now."""
        if self.hit:
            return ""
        self._pending += text
        if not self._stops:
            out, self._pending = self._pending, ""
            return out
        cut = min((i for i in (self._pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            out, self._pending = self._pending[:cut], ""
            return out
        keep = self._longest_partial_stop()
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep:]
        return out

    def flush(self) -> str:
        """At the end of generation: what was held back (it did not become a stop sequence)."""
        out, self._pending = ("" if self.hit else self._pending), ""
        return out

    def _longest_partial_stop(self) -> int:
        """Length of the longest tail of the pending text that starts some stop sequence."""
        best = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if stop.startswith(self._pending[-size:]):
                    best = size
                    break
        return best
