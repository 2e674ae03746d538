"""The catalogs worker pods follow: per pool, every accepted model's entry, numbered by change.

The operator used to write each pool's catalog into one ConfigMap key: one
object for every model (a ceiling of about 1,850 models under etcd's 1 MiB),
rewritten whole on every change, and every worker pod patched so its kubelet
remounted it. Now the catalog is what it always was, derived state, held here
and served by ``feed.py``: each change to one model is one entry in, or out,
of its pool's catalog, under a new revision; a pod that holds revision R is
sent only what changed after R (docs/architecture.md, "The catalog").

A ``Catalog`` keeps, besides the entries, the log of which model changed at
which revision (compacted as it grows) and when removed models left, so a
delta costs what changed since R, not the catalog's size. A cursor older than
what it kept, or from another operator process (``epoch``), gets the complete
catalog.
"""
from __future__ import annotations

import asyncio
import bisect
import uuid
from dataclasses import dataclass
from typing import Iterable

StoreKey = tuple[str, str]  # (namespace, workloads.catalog_store(...)): "pool" or "dedicated/<model>"


@dataclass(frozen=True)
class Answer:
    """What one reader is sent: everything (`complete`) or what changed after its revision."""

    revision: int
    complete: bool
    entries: tuple[bytes, ...]  # encoded model-store entries (hotset_common.model_store.encode_entry)
    removed: tuple[str, ...]


class Catalog:
    """One pool's (or one dedicated group's) catalog, with a revision per change."""

    def __init__(self, keep_removed: int = 50_000) -> None:
        self.revision = 0
        self.keep_removed = keep_removed
        self._entries: dict[str, tuple[int, bytes]] = {}  # model -> (revision it changed at, entry)
        self._removed: dict[str, int] = {}  # model -> revision it left at
        self._log: list[tuple[int, str]] = []  # (revision, model), ascending
        self._floor = 0  # a cursor below this may have missed a removal: it gets everything
        self._changed: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def bytes(self) -> int:
        return sum(len(entry) for _, entry in self._entries.values())

    def put(self, model: str, entry: bytes) -> bool:
        """Add or replace `model`'s entry; False (and no new revision) when it is unchanged."""
        held = self._entries.get(model)
        if held is not None and held[1] == entry:
            return False
        self._record(model)
        self._entries[model] = (self.revision, entry)
        self._removed.pop(model, None)
        return True

    def remove(self, model: str) -> bool:
        if self._entries.pop(model, None) is None:
            return False
        self._record(model)
        self._removed[model] = self.revision
        return True

    def read(self, since: int | None) -> Answer:
        """What a reader holding revision `since` needs; None (or too old): the whole catalog."""
        if since is None or since < self._floor or since > self.revision:
            return Answer(self.revision, True, tuple(entry for _, entry in self._entries.values()), ())
        start = bisect.bisect_right(self._log, (since, "\uffff"))
        changed = {model for _, model in self._log[start:]}
        entries = tuple(held[1] for model in changed if (held := self._entries.get(model)) is not None)
        removed = tuple(sorted(model for model in changed if model in self._removed))
        return Answer(self.revision, False, entries, removed)

    async def changed_after(self, revision: int, timeout_s: float) -> None:
        """Return once the catalog is past `revision`, or after `timeout_s`."""
        if self.revision > revision or timeout_s <= 0:
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    def _record(self, model: str) -> None:
        self.revision += 1
        self._log.append((self.revision, model))
        if len(self._log) > 2 * (len(self._entries) + len(self._removed)) + 1024:
            self._compact()
        if self._changed is not None:
            self._changed.set()  # wakes every reader waiting; the next waiter makes a new event
            self._changed = None

    def _compact(self) -> None:
        """Keep one log line per model (its last change) and at most `keep_removed` removals."""
        if len(self._removed) > self.keep_removed:
            oldest = sorted(self._removed.items(), key=lambda item: item[1])
            cut = oldest[len(self._removed) - self.keep_removed - 1][1]
            self._floor = max(self._floor, cut)
            self._removed = {model: at for model, at in self._removed.items() if at > cut}
        latest = {model: at for model, (at, _) in self._entries.items()} | self._removed
        self._log = sorted((at, model) for model, at in latest.items())


class Catalogs:
    """Every catalog this operator serves, and the epoch that numbers their revisions."""

    def __init__(self) -> None:
        self.epoch = uuid.uuid4().hex[:12]
        self._stores: dict[StoreKey, Catalog] = {}

    def get(self, store: StoreKey) -> Catalog:
        """The catalog of `store` (an empty one for a pool that has no model yet)."""
        found = self._stores.get(store)
        if found is None:
            found = self._stores[store] = Catalog()
        return found

    def stores(self) -> Iterable[tuple[StoreKey, Catalog]]:
        return self._stores.items()

    def put(self, store: StoreKey, model: str, entry: bytes) -> bool:
        return self.get(store).put(model, entry)

    def remove(self, store: StoreKey, model: str) -> bool:
        found = self._stores.get(store)
        return found is not None and found.remove(model)
