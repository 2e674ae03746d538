"""Tokens leave as text the moment they complete it: per token, never half a character, stop sequences cut.

Uses the tiny-chat sample's real byte-level BPE tokenizer, where one emoji
spans several tokens and a lone token can be an incomplete UTF-8 sequence.
"""
from __future__ import annotations

import pytest

from hotset_worker.generation import IncrementalDecoder, StopSequences


@pytest.fixture(scope="module")
def tokenizer(sample_store):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sample_store.parent / "tiny-chat"))


@pytest.mark.parametrize("text", ["the sky is blue.", "hello! how can i help you today?", "café ☕ naïve 🙂 done",
                                  "  spaced   out  "])
def test_the_pieces_add_up_to_the_text_and_each_piece_is_whole(tokenizer, text) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.add([token]) for token in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in piece for piece in pieces)  # an incomplete character is held, not sent broken


def test_ascii_words_leave_one_token_at_a_time(tokenizer) -> None:
    ids = tokenizer("one two three four", add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(tokenizer)
    assert [decoder.add([token]) for token in ids] == ["one", " two", " three", " four"]


def test_a_stop_sequence_cuts_the_text_even_when_it_arrives_in_pieces() -> None:
    stops = StopSequences(["END"])
    sent = [stops.feed(piece) for piece in ["the sky", " is E", "N", "D and more"]]
    assert "".join(sent) == "the sky is " and stops.hit
    assert stops.feed("later") == "" and stops.flush() == ""


def test_text_that_only_looked_like_a_stop_sequence_is_sent_in_the_end() -> None:
    stops = StopSequences(["\n\n"])
    assert stops.feed("line one\n") == "line one"  # held: it may be the start of "\n\n"
    assert stops.feed("line two") == "\nline two"
    assert stops.feed("\n") == "" and stops.flush() == "\n" and not stops.hit


def test_without_stop_sequences_nothing_is_held() -> None:
    stops = StopSequences([])
    assert [stops.feed(p) for p in ("a", "b")] == ["a", "b"]
