"""The choice among a model's ready copies for an LLM request: the copy whose engine holds most of its prompt.

An engine with prefix caching (vLLM's automatic prefix caching) keeps the
attention state of the prompts it has seen, in blocks of ``block_size``
tokens, each block keyed by its tokens and every token before it. A request
whose prompt starts the same way (a shared system prompt, few-shot examples,
a conversation's earlier turns) skips recomputing those blocks, but only on
the copy that holds them. So the router scores each ready copy, as the
Gateway API Inference Extension's endpoint picker does, by small pure
scorers, each from 0 (worst) to 1 (best), summed with ``Weights``:

- **prefix affinity**: how many of the prompt's leading blocks this router
  last sent to that copy (``PrefixIndex``, an approximation of the engine's
  cache: the same chained block hashes, an LRU as large as the engine's KV
  cache); the fraction of the prompt's blocks;
- **load**: the router's own in-flight requests to the copy (current to the
  moment), lowest best, relative to the other candidates;
- **queue**: the engine's own waiting requests (its /metrics, as its
  worker's last report said: every router's requests), lowest best;
- **KV cache**: the engine's KV-cache use, lowest best (a fuller cache
  evicts sooner, and admits fewer new requests);
- **spread**: how many distinct prompts (first blocks) the copy's index
  holds, fewest best: a new prompt goes where fewer prompts compete for the
  cache (for a prompt a copy holds, affinity outweighs it), so each engine
  caches its share of the shared prompts instead of most of them;
- **LoRA affinity** (adapters only): the adapter active in that engine
  (its running or waiting requests: the Inference Extension's signal),
  which batches it with no swap.

Blocks are of the *rendered* prompt (``openai_wire.render``), about
``block_size`` tokens each: the router has no tokenizer, so a block is
``block_size x CHARS_PER_TOKEN`` characters (the engine's block size from its
report, 16 when none is known). Hashes are chained (a block's key includes
its parent's), as vLLM keys its blocks, so a block matches only where the
whole prompt before it matches too.

Before scoring, a copy over its bounded load (consistent hashing with
bounded loads: in-flight within ``load_factor`` times the average, or within
``min_room``) is left out while any copy is within it, so one hot prefix
cannot pile every request on one copy. Ties (a prompt no copy has seen)
go to the copy a rendezvous hash of the prompt's first block ranks first, so
two routers send a new prefix to the same copy. Everything here is pure
but ``PrefixIndex``, which the router updates on the event loop after each
choice (no lock: one event loop).
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import math
from typing import Callable, Sequence

class Mode(str, enum.Enum):
    """How the router chooses among an LLM model's ready copies (``--llm-routing``)."""

    PREFIX = "prefix"  # the scorers below
    RANDOM = "random"  # any ready copy, uniformly: the baseline benchmarks/llm_prefix_routing.py compares with


DEFAULT_LOAD_FACTOR = 1.25
DEFAULT_MIN_ROOM = 8  # requests at once a copy always has room for
CHARS_PER_TOKEN = 4  # the router has no tokenizer: about four characters of English text per token
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size on a GPU, until a report says the engine's own
MAX_BLOCKS = 1024  # per prompt: at most that many hashed (a prompt is read to openai_wire.PROMPT_CHARS)
MAX_ROOTS = 1024  # prompt starts an index counts (prefixes())
DEFAULT_INDEX_BLOCKS = 16384  # an index's size when the engine's KV-cache size is not known
MAX_INDEX_BLOCKS = 65536  # an index never grows past this, whatever the engine's cache


# ----- blocks ------------------------------------------------------------------------------------

def blocks(prompt: str, block_tokens: int = DEFAULT_BLOCK_TOKENS, chars_per_token: int = CHARS_PER_TOKEN,
           limit: int = MAX_BLOCKS) -> tuple[int, ...]:
    """The chained hashes of `prompt`'s whole blocks (a partial last block is not cached by the engine)."""
    size = max(1, block_tokens) * max(1, chars_per_token)
    found: list[int] = []
    parent = b""
    for start in range(0, min(len(prompt) // size, limit) * size, size):
        parent = hashlib.blake2b(prompt[start:start + size].encode(), digest_size=8, key=parent).digest()
        found.append(int.from_bytes(parent, "big"))
    return tuple(found)


class PrefixIndex:
    """The blocks this router sent to one copy lately, least recently sent evicted first: an estimate
    of what the copy's engine has cached (it cannot see the engine's own evictions)."""

    def __init__(self, capacity: int = DEFAULT_INDEX_BLOCKS) -> None:
        self.capacity = capacity
        self._blocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._roots: collections.OrderedDict[int, None] = collections.OrderedDict()  # prompts' first blocks

    def prefixes(self) -> int:
        """How many distinct prompt starts (first blocks) it holds: what a new prefix is spread by."""
        return sum(1 for root in self._roots if root in self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def matched(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`' leading blocks are here (chained: the first miss ends the match)."""
        count = 0
        for block in hashes:
            if block not in self._blocks:
                break
            count += 1
        return count

    def add(self, hashes: Sequence[int], capacity: int | None = None) -> None:
        """`hashes` were sent to this copy (now most recent); `capacity`: the engine's size, if known."""
        if capacity:
            self.capacity = min(capacity, MAX_INDEX_BLOCKS)
        if hashes:
            self._roots[hashes[0]] = None
            self._roots.move_to_end(hashes[0])
            while len(self._roots) > MAX_ROOTS:
                self._roots.popitem(last=False)
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


# ----- scorers -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Candidate:
    """One ready copy as the scorers see it."""

    url: str
    matched: int = 0  # leading blocks of the prompt its index holds
    inflight: int = 0  # this router's requests to it now
    waiting: int = 0  # its engine's waiting requests (last report)
    kv_cache_usage: float = 0.0  # its engine's KV-cache use, 0-1 (last report)
    adapter_resident: bool = False  # the requested LoRA adapter is active in its engine (running or waiting)
    prefixes: int = 0  # distinct prompt starts its index holds


@dataclasses.dataclass(frozen=True)
class Weights:
    prefix: float = 3.0
    load: float = 2.0
    queue: float = 1.0
    kv_cache: float = 1.0
    spread: float = 1.0
    lora: float = 1.0


def prefix_affinity(matched: int, total: int) -> float:
    """The share of the prompt's blocks the copy holds (0 for a prompt shorter than one block)."""
    return matched / total if total else 0.0


def lowest_best(value: float, values: Sequence[float]) -> float:
    """1 for the lowest of `values`, 0 for the highest, linear between; 1 when they are all equal."""
    low, high = min(values), max(values)
    return 1.0 if high == low else (high - value) / (high - low)


def room_left(inflight: int, bound: int) -> float:
    """The share of the bounded load's room still free: each request in flight costs the same, so
    one more request on the copy holding a prompt never outweighs the prompt's blocks (a min-max
    scale would make a difference of one request count as much as one of a hundred)."""
    return 1.0 - min(1.0, inflight / bound) if bound > 0 else 0.0


def waiting_room(waiting: int) -> float:
    """1 for an engine with nothing waiting, falling as its queue grows (1/2 at one, 1/6 at five)."""
    return 1.0 / (1 + max(0, waiting))


def kv_cache_room(usage: float) -> float:
    """The share of the engine's KV cache still free."""
    return 1.0 - min(1.0, max(0.0, usage))


def lora_affinity(resident: bool) -> float:
    return 1.0 if resident else 0.0


def load_bound(candidates: Sequence[Candidate], load_factor: float = DEFAULT_LOAD_FACTOR,
               min_room: int = DEFAULT_MIN_ROOM) -> int:
    """The most requests one copy may have in flight: `load_factor` times the average with this one
    counted, and never less than `min_room`."""
    return max(min_room, math.ceil(load_factor * (sum(c.inflight for c in candidates) + 1) / len(candidates)))


def within_bounded_load(candidates: Sequence[Candidate], load_factor: float = DEFAULT_LOAD_FACTOR,
                        min_room: int = DEFAULT_MIN_ROOM) -> list[Candidate]:
    """The candidates whose in-flight requests (one more included) stay within the bound; all of them
    when none does (not reached: some copy is at most average)."""
    bound = load_bound(candidates, load_factor, min_room)
    kept = [c for c in candidates if c.inflight + 1 <= bound]
    return kept or list(candidates)


def rendezvous(key: str, url: str) -> int:
    """Rendezvous weight of `url` for `key` (higher first): the tie-break two routers agree on."""
    return int.from_bytes(hashlib.blake2b(f"{key}\x00{url}".encode(), digest_size=8).digest(), "big")


def scores(candidates: Sequence[Candidate], total_blocks: int, weights: Weights = Weights(),
           adapter: bool = False, bound: int = DEFAULT_MIN_ROOM) -> dict[str, float]:
    """Each candidate's weighted sum of the scorers; `bound` is the bounded load's room per copy.

    Spread (fewest prompts held first) is for where a new prompt starts: a copy that holds this
    prompt's blocks gets it whole, so holding many prompts never pushes a prompt off its own copy."""
    prefixes = [c.prefixes for c in candidates]
    return {c.url: weights.prefix * prefix_affinity(c.matched, total_blocks)
            + weights.load * room_left(c.inflight, bound)
            + weights.queue * waiting_room(c.waiting)
            + weights.kv_cache * kv_cache_room(c.kv_cache_usage)
            + weights.spread * (1.0 if c.matched else lowest_best(c.prefixes, prefixes))
            + (weights.lora * lora_affinity(c.adapter_resident) if adapter else 0.0)
            for c in candidates}


def choose(candidates: Sequence[Candidate], total_blocks: int, tie_key: str, weights: Weights = Weights(),
           adapter: bool = False, load_factor: float = DEFAULT_LOAD_FACTOR,
           min_room: int = DEFAULT_MIN_ROOM) -> str:
    """The copy for a request: the best score among those within the bounded load; ties by the
    rendezvous hash of `tie_key` (the prompt's first block), so routers agree on a new prefix."""
    if len(candidates) == 1:
        return candidates[0].url
    kept = within_bounded_load(candidates, load_factor, min_room)
    scored = scores(kept, total_blocks, weights, adapter, load_bound(candidates, load_factor, min_room))
    return max(kept, key=lambda c: (round(scored[c.url], 9), rendezvous(tie_key, c.url), c.url)).url


def ranked(key: str, urls: Sequence[str]) -> list[str]:
    """`urls` in the order the rendezvous hash of `key` prefers them (the tie-break's order)."""
    return sorted(urls, key=lambda url: (rendezvous(key, url), url), reverse=True)


class PrefixRouter:
    """The router's indexes, one per (model, copy), and the choice that reads and updates them."""

    def __init__(self, weights: Weights = Weights(), load_factor: float = DEFAULT_LOAD_FACTOR,
                 min_room: int = DEFAULT_MIN_ROOM, max_indexes: int = 4096) -> None:
        self.weights = weights
        self.load_factor = load_factor
        self.min_room = min_room
        self.max_indexes = max_indexes
        self._indexes: collections.OrderedDict[tuple[str, str], PrefixIndex] = collections.OrderedDict()

    def index(self, model: str, url: str) -> PrefixIndex | None:
        return self._indexes.get((model, url))

    def choose(self, model: str, prompt: str, urls: Sequence[str], inflight: Callable[[str], int],
               engine: Callable[[str], object | None], adapter: bool = False) -> str:
        """The copy among `urls` for a request of `model` whose rendered prompt is `prompt`;
        `engine(url)` is the copy's ``wire.EngineLoad`` (or None). The chosen copy's index learns
        the prompt's blocks."""
        loads = {url: engine(url) for url in urls}
        block_tokens = next((load.block_size for load in loads.values() if load is not None and load.block_size),
                            DEFAULT_BLOCK_TOKENS)
        hashes = blocks(prompt, block_tokens)
        candidates = [Candidate(url, self._matched(model, url, hashes), inflight(url),
                                getattr(loads[url], "waiting", 0), getattr(loads[url], "kv_cache_usage", 0.0),
                                adapter and _active(model, loads[url]), self._prefixes(model, url))
                      for url in urls]
        chosen = choose(candidates, len(hashes), str(hashes[0]) if hashes else prompt[:64], self.weights, adapter,
                        self.load_factor, self.min_room)
        if hashes:
            self._learn(model, chosen, hashes, getattr(loads[chosen], "kv_cache_blocks", 0))
        return chosen

    def _prefixes(self, model: str, url: str) -> int:
        index = self._indexes.get((model, url))
        return index.prefixes() if index is not None else 0

    def _matched(self, model: str, url: str, hashes: Sequence[int]) -> int:
        index = self._indexes.get((model, url))
        return index.matched(hashes) if index is not None and hashes else 0

    def _learn(self, model: str, url: str, hashes: Sequence[int], engine_blocks: int) -> None:
        key = (model, url)
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = PrefixIndex()
            while len(self._indexes) > self.max_indexes:  # bounded in copies too: the least recently used goes
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(key)
        index.add(hashes, engine_blocks or None)


def _active(adapter: str, load: object | None) -> bool:
    return adapter in getattr(load, "running_lora_adapters", ()) or adapter in getattr(load, "waiting_lora_adapters", ())
