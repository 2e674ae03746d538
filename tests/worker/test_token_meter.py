"""Token figures of one request: time to first token, time per output token, tokens per second."""
from __future__ import annotations

import json

import pytest

from hotset_common import openai_wire
from hotset_worker.token_meter import EventCounter, TokenMeter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_figures_come_from_when_each_token_existed() -> None:
    clock = Clock()
    meter = TokenMeter(arrived=100.0, clock=clock)
    for at in (100.25, 100.30, 100.35, 100.40, 100.45):
        clock.now = at
        meter.tokens(1)
    figures = meter.figures()
    assert figures.output_tokens == 5
    assert figures.time_to_first_token_s == pytest.approx(0.25)
    assert figures.time_per_output_token_s == pytest.approx(0.05)
    assert figures.tokens_per_second == pytest.approx(25.0)


def test_no_token_means_no_timing_figures() -> None:
    figures = TokenMeter(arrived=0.0, clock=Clock()).figures()
    assert (figures.output_tokens, figures.time_to_first_token_s, figures.time_per_output_token_s) == (0, None, None)


def test_an_engine_stream_is_metered_as_it_passes_even_split_mid_event() -> None:
    clock = Clock()
    meter = TokenMeter(arrived=100.0, clock=clock)
    counter = EventCounter(meter)
    stream = b"".join([
        openai_wire.event(openai_wire.chat_chunk("c", "m", {"role": "assistant", "content": ""})),
        openai_wire.event(openai_wire.chat_chunk("c", "m", {"content": "hel"})),
        openai_wire.event(openai_wire.chat_chunk("c", "m", {"content": "lo"})),
        openai_wire.event(openai_wire.chat_chunk("c", "m", {}, "stop")),
        openai_wire.event(openai_wire.usage_chunk("c", "m", "chat.completion.chunk", 7, 3)),
        openai_wire.DONE_EVENT,
    ])
    for start in range(0, len(stream), 13):  # arbitrary network chunking
        clock.now += 0.01
        counter.feed(stream[start:start + 13])
    assert meter.output_tokens == 2  # the role chunk and the final chunk carry no text
    assert counter.exact_output_tokens() == 3 and meter.prompt_tokens == 7
    assert meter.figures(counter.exact_output_tokens()).output_tokens == 3


def test_a_stream_that_is_not_json_counts_nothing() -> None:
    meter = TokenMeter(arrived=0.0, clock=Clock())
    EventCounter(meter).feed(b"data: not json\n\n" + json.dumps({"x": 1}).encode())
    assert meter.output_tokens == 0
