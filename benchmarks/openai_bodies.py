"""What reading an OpenAI body costs, now beside before, measured alternately in one run:

- the router's peek (model, stream, prefix): the msgspec head it reads now beside the whole-body
  json.loads it used to (kept in openai_wire as json_object + prompt_prefix);
- the worker's validation of a body with very many bad items: lists that stop at their first bad
  item (``fail_fast``) beside the same request model without it.

    .venv/bin/python benchmarks/openai_bodies.py

Time is the best of several runs without tracing; memory is tracemalloc's peak in a separate run
(tracing slows json.loads several-fold). Figures in docs/reliability.md.
"""
from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any, Callable

from pydantic import Field

from hotset_common import errors, openai_wire

MiB = 2**20


def whole_body(raw: bytes) -> Any:
    """The earlier reading: the body as Python objects, then the prefix from them."""
    value = openai_wire.json_object(raw)
    return value.get("model"), openai_wire.prompt_prefix(value)


BODIES = {
    "4 MiB of `[],` (not an object)": b"[" + b"[]," * 1_400_000 + b"[]]",
    "1.4 million empty messages (4 MiB)": b'{"model": "a", "messages": [' + b"{}," * 1_400_000 + b"{}]}",
    "two messages, 7 MiB of text": ('{"model": "a", "messages": [{"role": "system", "content": "be brief"}, '
                                    '{"role": "user", "content": "' + "x" * 7 * MiB + '"}]}').encode(),
    "a usual chat (1 KiB)": ('{"model": "a", "stream": true, "messages": [{"role": "user", "content": "'
                             + "y" * 1000 + '"}]}').encode(),
}


class EveryError(openai_wire.ChatCompletionRequest):
    """The chat request as it was: its message list checked to the end, an error built per bad item."""

    messages: list[openai_wire.ChatMessage] = Field(..., min_length=1)


BAD_MESSAGES = json.dumps({"model": "a", "messages": [{"role": "nobody", "content": "x"}] * 200_000}).encode()


def call(read: Callable[[bytes], Any], body: bytes) -> None:
    try:
        read(body)
    except errors.HotsetError:
        pass  # the 400 for a body that is not an object is an answer too


def best_ms(read: Callable[[bytes], Any], body: bytes, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call(read, body)
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def peak_mib(read: Callable[[bytes], Any], body: bytes) -> float:
    tracemalloc.start()
    try:
        call(read, body)
        return tracemalloc.get_traced_memory()[1] / MiB
    finally:
        tracemalloc.stop()


def main() -> None:
    print(f"{'body':38s} {'json.loads':>12s} {'msgspec head':>13s} {'ratio':>8s} {'MiB before':>11s} {'MiB now':>8s}")
    for name, body in BODIES.items():
        before = now = float("inf")
        for _ in range(3):  # alternate, so that a busy moment hits both
            before = min(before, best_ms(whole_body, body, 2))
            now = min(now, best_ms(openai_wire.peek, body, 2))
        print(f"{name:38s} {before:10.2f}ms {now:11.3f}ms {before / max(now, 1e-3):7.0f}x "
              f"{peak_mib(whole_body, body):11.1f} {peak_mib(openai_wire.peek, body):8.2f}")
    print()
    print(f"{'worker validation':38s} {'every error':>12s} {'first error':>13s} {'ratio':>8s} {'MiB before':>11s} {'MiB now':>8s}")
    checked = {"before": lambda raw: openai_wire.parse(EveryError, raw),
               "now": lambda raw: openai_wire.parse(openai_wire.ChatCompletionRequest, raw)}
    before = now = float("inf")
    for _ in range(2):
        before = min(before, best_ms(checked["before"], BAD_MESSAGES, 1))
        now = min(now, best_ms(checked["now"], BAD_MESSAGES, 1))
    print(f"{'200,000 messages with a bad role':38s} {before:10.0f}ms {now:11.0f}ms {before / now:7.1f}x "
          f"{peak_mib(checked['before'], BAD_MESSAGES):11.1f} {peak_mib(checked['now'], BAD_MESSAGES):8.1f}")


if __name__ == "__main__":
    main()
