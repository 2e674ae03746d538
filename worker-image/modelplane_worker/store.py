"""Model metadata: which models this worker may load, and how.

The manager asks a ModelStore for a model's spec and never cares where the
metadata came from. Standalone mode reads the seed's JSON file
(``{"models": [{"id", "name", "type", "framework", "version", "description"}]}``,
extended with task, source, memory, labels, pinned, replicas, ...);
cluster mode can feed a MemoryModelStore from ServedModels.
"""
from __future__ import annotations

import abc
import json
import logging
import threading
from pathlib import Path
from typing import Any, Iterable

import pydantic

from modelplane_common import errors
from modelplane_common.spec import ModelSpec, Task, with_variants

log = logging.getLogger(__name__)


class ModelStore(abc.ABC):
    """Read-only view of the models a worker may serve."""

    @abc.abstractmethod
    def get(self, model_id: str) -> ModelSpec:
        """The spec of `model_id`; ModelNotFound names the id when there is none."""

    @abc.abstractmethod
    def list(self) -> list[ModelSpec]:
        """Every model in the store, in a stable order."""

    def ids(self) -> list[str]:
        return [spec.id for spec in self.list()]


class MemoryModelStore(ModelStore):
    """Specs held in memory; cluster mode replaces them as ServedModels change."""

    def __init__(self, specs: Iterable[ModelSpec] = ()) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, ModelSpec] = {}
        for spec in specs:
            self.put(spec)

    def get(self, model_id: str) -> ModelSpec:
        with self._lock:
            spec = self._specs.get(model_id)
        if spec is None:
            raise errors.ModelNotFound(f"model {model_id!r} is not in this worker's model store")
        return spec

    def list(self) -> list[ModelSpec]:
        with self._lock:
            return [self._specs[key] for key in sorted(self._specs)]

    def put(self, spec: ModelSpec) -> None:
        """Add or replace `spec`, and its canary version (a model of its own) in step with it."""
        with self._lock:
            for key in [k for k, other in self._specs.items() if other.variant_of == spec.id]:
                del self._specs[key]
            for entry in with_variants([spec]):
                self._specs[entry.id] = entry

    def remove(self, model_id: str) -> None:
        with self._lock:
            self._specs.pop(model_id, None)
            for key in [k for k, other in self._specs.items() if other.variant_of == model_id]:
                del self._specs[key]


class JsonModelStore(MemoryModelStore):
    """The seed's ``models.json``; relative file sources resolve against its folder.

    Re-read whenever the file changes (checked on each lookup: one stat), so a
    pod whose store is a mounted ConfigMap sees ServedModels added after it
    started. A changed file that does not parse keeps the previous catalog.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen = self._signature()
        super().__init__(parse_store_file(self.path))

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        seen = self._signature()
        if seen == self._seen or seen is None:
            return
        try:
            specs = parse_store_file(self.path)
        except ValueError as exc:
            log.warning("model store %s changed but does not parse; keeping the previous catalog: %s", self.path, exc)
            return
        with self._lock:
            self._specs = {spec.id: spec for spec in with_variants(specs)}
            self._seen = seen

    def get(self, model_id: str) -> ModelSpec:
        self._refresh()
        return super().get(model_id)

    def list(self) -> list[ModelSpec]:
        self._refresh()
        return super().list()


def parse_store_file(path: Path) -> list[ModelSpec]:
    """Parse a store file; ValueError names the file, the entry and the bad field."""
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read model store {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"model store {path} is not valid JSON: {exc}") from exc
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'model store {path} must be an object with a "models" list')
    specs = [parse_entry(entry, index, path) for index, entry in enumerate(entries)]
    seen: set[str] = set()
    for spec in specs:
        if spec.id in seen:
            raise ValueError(f"model store {path} lists model {spec.id!r} twice")
        seen.add(spec.id)
    return specs


def parse_entry(entry: Any, index: int, path: Path) -> ModelSpec:
    if not isinstance(entry, dict):
        raise ValueError(f"model store {path}: entry {index} is not an object")
    fields = dict(entry)
    if "task" not in fields and "type" in fields:
        task = _task_from_seed_type(fields["type"])
        if task is not None:
            fields["task"] = task
    if isinstance(fields.get("source"), dict):  # ServedModel shape: source: {uri: ...}
        fields["source"] = fields["source"].get("uri", "")
    if isinstance(fields.get("source"), str):
        fields["source"] = resolve_relative_source(fields["source"], path.parent)
    canary = (fields.get("rollout") or {}).get("canary") if isinstance(fields.get("rollout"), dict) else None
    if isinstance(canary, dict) and isinstance(canary.get("source"), str):
        fields["rollout"] = {**fields["rollout"], "canary": {**canary, "source": resolve_relative_source(canary["source"], path.parent)}}
    try:
        return ModelSpec.model_validate(fields)
    except pydantic.ValidationError as exc:
        name = entry.get("id", f"#{index}")
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"model store {path}: model {name!r}: {problems}") from exc


def _task_from_seed_type(value: Any) -> str | None:
    """The seed's free-form "type" ("text_classification", "image-classification") as a Task."""
    if not isinstance(value, str):
        return None
    normalised = value.strip().lower().replace("_", "-").replace(" ", "-")
    known = {task.value for task in Task}
    return normalised if normalised in known else None


def resolve_relative_source(source: str, base: Path) -> str:
    """``file://models/x`` or a bare ``models/x`` becomes ``file:///<store folder>/models/x``."""
    scheme, sep, rest = source.partition("://")
    if not sep:
        scheme, rest = "file", source
    if scheme != "file" or not rest or ".." in Path(rest).parts:
        return source  # the spec's own validation names what is wrong
    if rest.startswith("/") or rest.startswith("localhost/"):
        return f"file://{rest}"
    return f"file://{(base / rest).resolve()}"
