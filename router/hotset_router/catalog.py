"""What each model is (name, type, framework, version), as the workers' own catalogs describe it.

The map (model_map.py) keeps what placement needs per pod; the seed's
``GET /models`` also describes every model. The newest report that lists a
model wins: workers read the same model store, so their entries agree, and
a changed ServedModel reaches every pod's catalog within a sync.
"""
from __future__ import annotations

from typing import Iterable

from hotset_common.wire import CatalogEntry, ModelMetadata


class ModelCatalog:
    def __init__(self) -> None:
        self._entries: dict[str, CatalogEntry] = {}

    def update(self, entries: Iterable[CatalogEntry]) -> None:
        for entry in entries:
            self._entries[entry.id] = entry

    def entries(self) -> list[CatalogEntry]:
        return list(self._entries.values())

    def base_of(self, model: str) -> str:
        """The base model a LoRA adapter runs on; "" for any other model."""
        entry = self._entries.get(model)
        return entry.base_model if entry is not None else ""

    def metadata(self, model: str) -> ModelMetadata:
        """A model's metadata from a worker's catalog; its id alone when no catalog lists it
        (a copy still loaded after its ServedModel went)."""
        entry = self._entries.get(model)
        if entry is not None:
            return entry.metadata()
        return ModelMetadata(id=model, name=model, type="", framework="", version="")
