"""The prefix-aware choice among an LLM's ready copies: its blocks, its index, each scorer, and the choice.

Pure functions and one small class (no router, no engine): the end-to-end
effect on real engines is benchmarks/llm_prefix_routing.py, the router's use
of it tests/router/test_openai_engines_through_router.py.
"""
from __future__ import annotations

import collections

import pytest

from hotset_common.wire import EngineLoad
from hotset_router import prefix_routing as pr
from hotset_router.prefix_routing import Candidate

COPIES = ["http://a:1", "http://b:1", "http://c:1"]
SYSTEM = "system:" + "you answer in one short sentence, always politely. " * 40  # about 2,000 characters


def test_blocks_are_whole_blocks_of_the_prompt_chained_so_one_differing_block_ends_the_match() -> None:
    size = 16 * pr.CHARS_PER_TOKEN
    hashes = pr.blocks(SYSTEM + "user:a question")
    assert len(hashes) == len(SYSTEM + "user:a question") // size  # the partial last block is not cached
    assert pr.blocks(SYSTEM + "user:another")[:len(SYSTEM) // size] == hashes[:len(SYSTEM) // size]
    changed = "X" + SYSTEM[1:]  # the first block differs: every later block's key differs too
    assert not set(pr.blocks(changed)) & set(hashes)
    assert pr.blocks("short") == ()
    assert len(pr.blocks(SYSTEM, block_tokens=128)) == len(SYSTEM) // (128 * pr.CHARS_PER_TOKEN)


def test_an_index_matches_leading_blocks_only_and_forgets_the_least_recently_sent_first() -> None:
    index = pr.PrefixIndex(capacity=4)
    first, second = pr.blocks("a" * 64 * 3), pr.blocks("b" * 64 * 3)
    index.add(first)
    assert index.matched(first) == 3 and index.matched(second) == 0
    assert index.matched((second[0], *first[1:])) == 0  # the first miss ends the match
    index.add(second)  # 6 blocks into 4: first's two oldest go
    assert len(index) == 4 and index.matched(second) == 3 and index.matched(first) == 0
    index.add(second[:1], capacity=2)  # the engine's own size, once known, bounds it
    assert len(index) == 2


def test_each_scorer_runs_from_0_worst_to_1_best() -> None:
    assert pr.prefix_affinity(3, 4) == 0.75 and pr.prefix_affinity(0, 0) == 0.0
    assert [pr.lowest_best(v, [2, 4, 6]) for v in (2, 4, 6)] == [1.0, 0.5, 0.0]
    assert pr.lowest_best(3, [3, 3]) == 1.0  # all alike: no copy is worse
    assert pr.kv_cache_room(0.25) == 0.75 and pr.kv_cache_room(1.7) == 0.0 and pr.kv_cache_room(-1) == 1.0
    assert pr.lora_affinity(True) == 1.0 and pr.lora_affinity(False) == 0.0


def test_the_copy_holding_the_prompt_wins_until_its_load_outweighs_it() -> None:
    holder = Candidate(COPIES[0], matched=30)
    others = [Candidate(COPIES[1]), Candidate(COPIES[2])]
    assert pr.choose([holder, *others], total_blocks=32, tie_key="k") == COPIES[0]
    # Its engine's queue and cache are fuller, its in-flight highest: prefix 3 x 0.94 + room 2 x 2/8 + queue 1/6
    # + kv 0.1 + spread 1 = 4.58, under an idle copy's room 2 + queue 1 + kv 1 + spread 1 = 5.
    busy = Candidate(COPIES[0], matched=30, inflight=6, waiting=5, kv_cache_usage=0.9)
    assert pr.choose([busy, *others], total_blocks=32, tie_key="k") != COPIES[0]


def test_the_copy_holding_the_prompt_keeps_it_at_every_load_within_its_room() -> None:
    """One request more in flight costs an eighth of the room, not the whole load score: the copy
    holding a shared prompt keeps it up to its room (8), however many prompts it holds besides."""
    idle = [Candidate(COPIES[1]), Candidate(COPIES[2])]
    for inflight in range(pr.DEFAULT_MIN_ROOM):
        holder = Candidate(COPIES[0], matched=32, inflight=inflight, kv_cache_usage=0.5, prefixes=20)
        assert pr.choose([holder, *idle], 32, "k") == COPIES[0], inflight
    full = Candidate(COPIES[0], matched=32, inflight=pr.DEFAULT_MIN_ROOM)
    assert pr.choose([full, *idle], 32, "k") != COPIES[0]


def test_a_copy_past_its_bounded_load_is_left_out_while_another_has_room() -> None:
    favourite = Candidate(COPIES[0], matched=32, inflight=12)
    # 12 in flight over 3 copies: room is max(8, ceil(1.25 * 13 / 3)) = 8 each: the favourite has none.
    assert pr.choose([favourite, Candidate(COPIES[1]), Candidate(COPIES[2])], 32, "k") != COPIES[0]
    assert pr.within_bounded_load([favourite]) == [favourite]
    room = Candidate(COPIES[0], matched=32, inflight=pr.DEFAULT_MIN_ROOM - 1)  # at low load it keeps its prefix
    assert pr.choose([room, Candidate(COPIES[1], inflight=0), Candidate(COPIES[2])], 32, "k") == COPIES[0]


def test_a_resident_adapter_counts_only_for_adapter_requests() -> None:
    with_adapter = Candidate(COPIES[1], adapter_resident=True)
    assert pr.choose([Candidate(COPIES[0]), with_adapter], 0, "k", adapter=True) == COPIES[1]
    tie = [Candidate(COPIES[0]), Candidate(COPIES[1], adapter_resident=True)]
    assert pr.choose(tie, 0, "k") == pr.ranked("k", COPIES[:2])[0]  # not an adapter: the tie-break decides


def test_a_new_prefix_goes_where_the_rendezvous_hash_says_whatever_the_order_of_copies() -> None:
    candidates = [Candidate(url) for url in COPIES]
    first = pr.choose(candidates, 8, "block-1")
    assert all(pr.choose(order, 8, "block-1") == first for order in (candidates[::-1], candidates[1:] + candidates[:1]))
    spread = collections.Counter(pr.choose(candidates, 8, f"block-{i}") for i in range(300))
    assert set(spread) == set(COPIES) and min(spread.values()) > 60


def test_the_router_sends_a_shared_system_prompt_back_to_the_copy_it_sent_it_to() -> None:
    router = pr.PrefixRouter()
    loads = {url: EngineLoad(model="m", block_size=16, kv_cache_blocks=1000) for url in COPIES}
    inflight: collections.Counter[str] = collections.Counter()
    first = router.choose("m", SYSTEM + "user:one", COPIES, inflight.__getitem__, loads.get)
    inflight[first] += 3  # busier now, but within its room: the prompt's blocks still decide
    assert all(router.choose("m", SYSTEM + f"user:question {i}", COPIES, inflight.__getitem__, loads.get) == first
               for i in range(5))
    assert router.index("m", first).capacity == 1000  # as large as the engine's KV cache
    others = collections.Counter(router.choose("m", f"system:prompt {i} " * 60, COPIES, inflight.__getitem__, loads.get)
                                 for i in range(30))
    assert len(others) >= 2  # other prompts spread over the copies
    assert router.index("other-model", first) is None  # an index per model and copy


@pytest.mark.parametrize("waiting, usage", [(9, 0.0), (0, 0.97)])
def test_an_engine_that_reports_a_long_queue_or_a_full_cache_loses_a_new_prefix(waiting, usage) -> None:
    router = pr.PrefixRouter()
    key = str(pr.blocks(SYSTEM)[0])
    favourite = pr.ranked(key, COPIES)[0]
    loads = {url: EngineLoad(model="m", waiting=waiting if url == favourite else 0,
                             kv_cache_usage=usage if url == favourite else 0.0) for url in COPIES}
    assert router.choose("m", SYSTEM, COPIES, lambda url: 0, loads.get) != favourite
    assert pr.PrefixRouter().choose("m", SYSTEM, COPIES, lambda url: 0, lambda url: None) == favourite


def test_new_prompts_spread_over_the_copies_by_how_many_prompts_each_already_holds() -> None:
    """Eight shared prompts that the rendezvous tie-break would all send to one copy, one after another
    at no load: four on each of two copies, so each engine caches half of them, not all."""
    copies = COPIES[:2]
    prompts = [p for p in (f"system:prompt {i} " * 60 for i in range(200))
               if pr.ranked(str(pr.blocks(p)[0]), copies)[0] == copies[0]][:8]
    for weights, expected in ((pr.Weights(spread=0), {copies[0]: 8}), (pr.Weights(), {copies[0]: 4, copies[1]: 4})):
        router = pr.PrefixRouter(weights)
        chosen = collections.Counter(router.choose("m", p, copies, lambda url: 0, lambda url: None) for p in prompts)
        assert chosen == expected, weights
    assert pr.PrefixIndex().prefixes() == 0
