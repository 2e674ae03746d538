"""Token timing of one generation: time to first token, time per output token, tokens per second.

Every generative request is metered the same way whatever produces its
tokens: the in-process generator reports each token step as it happens
(``tokens``), and an engine's stream (vLLM) is read as it passes through
(``EventCounter``: one content chunk is one token step, and the usage chunk,
when the client asked for one, gives the exact count). Times are measured
from the request's arrival at the worker, so the first token's time includes
any wait for room and for the model's load: what the client waited.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class TokenFigures:
    prompt_tokens: int
    output_tokens: int
    time_to_first_token_s: float | None  # None: no token came (or the engine's answer was not a stream)
    time_per_output_token_s: float | None  # None: fewer than two tokens
    tokens_per_second: float | None


class TokenMeter:
    """Counts one request's output tokens and when they came (one producer thread at a time)."""

    def __init__(self, arrived: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._arrived = arrived
        self._first: float | None = None
        self._last: float | None = None
        self.output_tokens = 0
        self.prompt_tokens = 0

    def tokens(self, count: int) -> None:
        """`count` more tokens exist now."""
        if count <= 0:
            return
        now = self._clock()
        if self._first is None:
            self._first = now
        self._last = now
        self.output_tokens += count

    def figures(self, exact_output_tokens: int | None = None) -> TokenFigures:
        """The request's figures; `exact_output_tokens` (an engine's usage) replaces the counted steps."""
        count = exact_output_tokens if exact_output_tokens is not None else self.output_tokens
        if self._first is None or self._last is None:
            return TokenFigures(self.prompt_tokens, count, None, None, None)
        ttft = self._first - self._arrived
        span = self._last - self._first
        tpot = span / (count - 1) if count > 1 and span > 0 else None
        return TokenFigures(self.prompt_tokens, count, ttft, tpot, count / span if tpot else None)


class EventCounter:
    """Reads an OpenAI event stream as it passes (bytes in, untouched) and meters its tokens."""

    def __init__(self, meter: TokenMeter) -> None:
        self._meter = meter
        self._pending = b""
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        while b"\n\n" in self._pending:
            raw, self._pending = self._pending.split(b"\n\n", 1)
            self._event(raw)

    def _event(self, raw: bytes) -> None:
        for line in raw.splitlines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                payload = json.loads(data)
            except ValueError:
                return
            if isinstance(payload.get("usage"), dict):
                self.usage = payload["usage"]
                self._meter.prompt_tokens = int(self.usage.get("prompt_tokens") or 0)
            if any(_has_text(choice) for choice in payload.get("choices") or []):
                self._meter.tokens(1)

    def exact_output_tokens(self) -> int | None:
        return int(self.usage["completion_tokens"]) if self.usage and "completion_tokens" in self.usage else None


def _has_text(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    return bool(choice.get("text")) or (isinstance(delta, dict) and bool(delta.get("content")))


def usage_of(answer: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a whole (non-streamed) OpenAI answer, if it says."""
    try:
        usage = json.loads(answer).get("usage") or {}
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return None
