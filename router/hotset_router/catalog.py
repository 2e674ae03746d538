"""What each model is (name, type, framework, version), as the workers' own catalogs describe it.

The map (model_map.py) keeps what placement needs per pod; the seed's
``GET /models`` also describes every model. The newest report that lists a
model wins: workers read the same model store, so their entries agree, and
a changed ServedModel reaches every pod's catalog within a sync.

Each model is kept as a plain dict of strings and numbers (``Described``),
not as the report's pydantic object: such a dict is untracked by the garbage
collector, whereas each CatalogEntry is three objects it must look into (the
model, its ``__dict__``, its fields-set), which at 10,000 models made every
full collection about 4 ms longer, the event loop held meanwhile (a
NamedTuple would still be tracked: only exact tuples are untracked).
"""
from __future__ import annotations

from typing import Iterable, TypedDict

from hotset_common.wire import CatalogEntry, ModelMetadata


class Described(TypedDict):
    """What the router says of a model (its metadata, and the base model of a LoRA adapter)."""

    id: str
    name: str
    type: str
    framework: str
    version: str
    description: str
    memory_bytes: int
    base_model: str


def described(entry: CatalogEntry) -> Described:
    return Described(id=entry.id, name=entry.name, type=entry.type, framework=entry.framework, version=entry.version,
                     description=entry.description, memory_bytes=entry.memory_bytes, base_model=entry.base_model)


def metadata_of(entry: Described) -> ModelMetadata:
    return ModelMetadata(id=entry["id"], name=entry["name"] or entry["id"], type=entry["type"],
                         framework=entry["framework"], version=entry["version"], description=entry["description"],
                         memory_bytes=entry["memory_bytes"])


class ModelCatalog:
    def __init__(self) -> None:
        self._entries: dict[str, Described] = {}

    def update(self, entries: Iterable[CatalogEntry]) -> None:
        for entry in entries:
            self._entries[entry.id] = described(entry)

    def entries(self) -> list[Described]:
        return list(self._entries.values())

    def base_of(self, model: str) -> str:
        """The base model a LoRA adapter runs on; "" for any other model."""
        entry = self._entries.get(model)
        return entry["base_model"] if entry is not None else ""

    def metadata(self, model: str) -> ModelMetadata:
        """A model's metadata from a worker's catalog; its id alone when no catalog lists it
        (a copy still loaded after its ServedModel went)."""
        entry = self._entries.get(model)
        if entry is not None:
            return metadata_of(entry)
        return ModelMetadata(id=model, name=model, type="", framework="", version="")
