"""Every ServedModel the operator watches, as of its last event, and whether all of them were seen.

Fed by kopf's ``@kopf.on.event`` (``handlers/changes.py``) and not a kopf
index, for one measured reason: kopf pre-populates indexes behind a gate that
takes a toggle per indexed object and wakes every waiting object's worker each
time one is dropped, O(N^2) in the objects. Indexed, 1,000 ServedModels held
every handler back for 40 s after a restart on this machine, and 10,000 would
take most of an hour. The small kinds (WorkerPools, ModelQuotas, pods,
Deployments) stay kopf indexes; this is the one the operator keeps itself,
one entry per object, replaced on each of its events.

kopf's gate did one more thing: it held handlers until the first listing was
complete, so a restarted operator never judged half of its models. Here that
is ``expect``: the names a metadata-only LIST found at start; the reconciler
makes its first pass once each of them has been seen (or is gone).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from hotset_operator import index
from hotset_operator.config import OperatorConfig
from hotset_operator.index import Key, ModelEntry


class ServedModels:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self._entries: dict[Key, ModelEntry] = {}
        self.wanted: dict[Key, float] = {}  # models a request waited for a pod of (the router's annotation)
        self._expected: set[Key] | None = None  # None: not listed yet
        self._seen: set[Key] = set()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> Key:
        """One event of one ServedModel; its entry is validated once per spec generation."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        self._seen.add(key)
        if event_type == "DELETED":
            self._entries.pop(key, None)
            self.wanted.pop(key, None)
            return key
        entry = index.model_entry(body, self.config, previous=self._entries.get(key))
        self._entries[key] = entry
        if entry.wanted_at > 0:
            self.wanted[key] = entry.wanted_at
        else:
            self.wanted.pop(key, None)
        return key

    def get(self, key: Key) -> ModelEntry | None:
        return self._entries.get(key)

    def values(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # --- the first listing ---------------------------------------------------------------

    def expect(self, keys: Iterable[Key]) -> None:
        """The ServedModels that exist (a LIST at start): none is judged before each was seen."""
        keys = set(keys)
        self._expected = keys if self._expected is None else self._expected & keys  # a later LIST: gone ones drop out

    def missing(self) -> set[Key]:
        """What the first listing still owes (everything, until the LIST answered)."""
        if self._expected is None:
            return {("", "")}
        return self._expected - self._seen

    def complete(self) -> bool:
        return not self.missing()
