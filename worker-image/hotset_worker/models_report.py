"""The seed's ``GET /models``, built in proportion to what changed, and paged on request.

A pod's catalog may hold thousands of models. Each entry of
``available_models`` is built once and kept until its spec or its best known
size changes (the store hands out the same spec object until the model
changes), so a call re-builds only what changed since the last one; with
``limit`` (and ``after``, the last id of the previous page) it answers one
page in id order, so neither the worker nor the caller handles the whole
catalog at once.
"""
from __future__ import annotations

import bisect

from hotset_common import wire
from hotset_common.spec import ModelSpec
from hotset_worker import status_report
from hotset_worker.manager import ModelManager

MAX_PAGE = 1000


class ModelsReport:
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self._entries: dict[str, tuple[ModelSpec, int, wire.ModelMetadata]] = {}
        self.built = 0  # entries built (tests: a second call builds none)

    def _metadata(self, spec: ModelSpec) -> wire.ModelMetadata:
        size = self.manager.known_size(spec)
        kept = self._entries.get(spec.id)
        if kept is not None and kept[0] is spec and kept[1] == size:
            return kept[2]
        metadata = catalog_entry(spec, self.manager).metadata()
        self._entries[spec.id] = (spec, size, metadata)
        self.built += 1
        return metadata

    def whole(self) -> wire.ModelsResponse:
        specs = self.manager.store.list()
        if len(self._entries) > 2 * len(specs) + 64:  # models that left the store
            listed = {spec.id for spec in specs}
            self._entries = {key: entry for key, entry in self._entries.items() if key in listed}
        available = {spec.id: self._metadata(spec) for spec in specs}
        loaded = {key: available[key].name if key in available else key for key in self.manager.loaded_ids()}
        return wire.ModelsResponse(available_models=available, loaded_models=loaded)

    def page(self, limit: int, after: str = "") -> wire.ModelsPage:
        specs = self.manager.store.list()  # in id order
        ids = [spec.id for spec in specs]
        start = bisect.bisect_right(ids, after) if after else 0
        chosen = specs[start:start + max(1, min(limit, MAX_PAGE))]
        available = {spec.id: self._metadata(spec) for spec in chosen}
        loaded = {key: meta.name for key, meta in available.items() if self.manager.is_loaded(key)}
        more = start + len(chosen) < len(specs)
        return wire.ModelsPage(available_models=available, loaded_models=loaded, next=chosen[-1].id if more and chosen else "")


def catalog_entry(spec: ModelSpec, manager: ModelManager) -> wire.CatalogEntry:
    return status_report.catalog_entry(spec, manager.known_size(spec))  # one shape for /models and /status
