"""The model-store format: which models a worker may load, and how; written and read in one place.

Three readers used to parse it three ways (the worker's file store, the
router's ``--model-store``, the operator's ConfigMap), and the router skipped
entries the worker accepted (a seed ``"type": "text_classification"``, a
``file://relative`` source). Now:

- **the entry** (``store_entry``/``encode_entry``) is what the operator
  publishes of an accepted ServedModel: the spec without the registry fields
  workers never read (labels, owner, oncall; a canary's derived fields);
- **the file** (``read_file``): the seed's ``{"models": [...]}`` JSON, extended
  (``make run``, standalone workers, the router's ``--model-store``); relative
  ``file://`` sources resolve against the file's folder, a seed ``type`` is
  read as a task when it names one;
- **the feed** (``CatalogUpdate``): what a worker pod follows in cluster mode,
  the operator's catalog of its pool as a first complete snapshot, then the
  changes since the revision it holds (docs/architecture.md, "The catalog").

Every reader refuses what ``ModelSpec`` refuses, naming the model and the field.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import msgspec
import pydantic
from pydantic import BaseModel, Field

from hotset_common.spec import ModelSpec, Task

# Registry fields no worker reads: kept out of the entries every pod of a pool receives.
_NOT_IN_STORE = {"memory_bytes", "labels", "owner", "oncall", "variant_of", "variant_weight", "scheduling"}
# replicas.idleSeconds is for the operator and the router; a worker's entry (and the spec hash that
# rolls a dedicated group) stays as it was without it.
_EXCLUDE: dict[str, Any] = {name: True for name in _NOT_IN_STORE} | {"replicas": {"idle_seconds"}}

FEED_PATH = "/v1/catalogs"  # the operator's catalog feed: FEED_PATH/<namespace>/<store>
CURSOR_PARAM = "since"  # ``<epoch>.<revision>``: what the caller already holds
WAIT_PARAM = "wait"  # seconds the operator may hold the request open for a change


def store_entry(spec: ModelSpec) -> dict[str, Any]:
    """One model as a worker's store reads it (only what workers use)."""
    return spec.model_dump(mode="json", exclude=_EXCLUDE) | {"memory": spec.memory_bytes}


def encode_entry(spec: ModelSpec) -> bytes:
    """``store_entry`` as compact JSON: the bytes one model adds to its pool's catalog."""
    return msgspec.json.encode(store_entry(spec))


def parse_entry(entry: Any, where: str, base: Path | None = None, index: int = 0) -> ModelSpec:
    """One entry as a spec; ValueError names `where`, the model and each bad field.

    `base`: the folder relative ``file://`` sources resolve against (a file's); None for the feed,
    whose sources the operator validated as absolute."""
    if not isinstance(entry, dict):
        raise ValueError(f"model store {where}: entry {index} is not an object")
    fields = dict(entry)
    if "task" not in fields and "type" in fields:
        task = _task_from_seed_type(fields["type"])
        if task is not None:
            fields["task"] = task
    if isinstance(fields.get("source"), dict):  # ServedModel shape: source: {uri: ..., sha256, endpoint, ...}
        source = fields["source"]
        fields["source"] = source.get("uri", "")
        if options := {k: v for k, v in source.items() if k != "uri"}:
            fields.setdefault("source_options", options)
    if base is not None:
        fields = _resolve_sources(fields, base)
    try:
        return ModelSpec.model_validate(fields)
    except pydantic.ValidationError as exc:
        name = entry.get("id", f"#{index}")
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"model store {where}: model {name!r}: {problems}") from exc


def parse_entries(entries: Iterable[Any], where: str, base: Path | None = None) -> list[ModelSpec]:
    """Every entry as a spec, all or nothing: a bad entry or an id listed twice is a ValueError."""
    specs = [parse_entry(entry, where, base, index) for index, entry in enumerate(entries)]
    seen: set[str] = set()
    for spec in specs:
        if spec.id in seen:
            raise ValueError(f"model store {where} lists model {spec.id!r} twice")
        seen.add(spec.id)
    return specs


def read_file(path: Path) -> list[ModelSpec]:
    """A store file's specs; ValueError names the file, the entry and the bad field."""
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read model store {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"model store {path} is not valid JSON: {exc}") from exc
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'model store {path} must be an object with a "models" list')
    return parse_entries(entries, str(path), Path(path).parent)


def _resolve_sources(fields: dict[str, Any], base: Path) -> dict[str, Any]:
    if isinstance(fields.get("source"), str):
        fields["source"] = resolve_relative_source(fields["source"], base)
    rollout = fields.get("rollout")
    canary = rollout.get("canary") if isinstance(rollout, dict) else None
    if isinstance(canary, dict) and isinstance(canary.get("source"), str):
        fields["rollout"] = {**rollout, "canary": {**canary, "source": resolve_relative_source(canary["source"], base)}}
    return fields


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


class CatalogUpdate(BaseModel):
    """One answer of the operator's catalog feed (``GET FEED_PATH/<namespace>/<store>?since=&wait=``).

    `complete`: `models` is the whole catalog (a first request, an operator restarted since, or a
    cursor older than the changes it keeps); otherwise `models` are the entries added or changed
    since the caller's cursor and `removed` the ids that left. An answer with neither means nothing
    changed within the wait."""

    epoch: str  # the operator process that numbers the revisions: another epoch means start over
    revision: int
    complete: bool
    models: list[dict[str, Any]] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)

    @property
    def cursor(self) -> str:
        return f"{self.epoch}.{self.revision}"
