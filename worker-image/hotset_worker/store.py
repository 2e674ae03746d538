"""Model metadata: which models this worker may load, and how.

The manager asks a ModelStore for a model's spec and never cares where the
metadata came from:

- ``JsonModelStore``: the seed's JSON file (standalone, ``make run``), re-read
  when it changes;
- ``FollowedModelStore``: cluster mode. The operator serves each pool's
  catalog as a feed (hotset_common.model_store.CatalogUpdate): a complete
  snapshot first, then only what changed, each answer held open until there is
  a change. A pod therefore learns of a new, changed or deleted ServedModel
  within a second, whatever the catalog's size, and needs no Kubernetes API
  access. A removed model's idle copies are unloaded by the manager's own
  check (``ModelManager.roll_stale_copies``).

The format is parsed in one place for every component (``hotset_common.model_store``).
"""
from __future__ import annotations

import abc
import logging
import threading
from pathlib import Path
from typing import Iterable

import httpx
import pydantic

from hotset_common import errors, model_store
from hotset_common.model_store import CatalogUpdate
from hotset_common.spec import ModelSpec
from hotset_common.worker_identity import BearerToken

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

    @property
    def generation(self) -> int | None:
        """A number that changes whenever the store's contents may have (None: unknown, so a reader
        compares the whole list each time); /status reads the catalog again only when it moves."""
        return None


class MemoryModelStore(ModelStore):
    """Specs held in memory, each with its canary version (a model of its own) kept in step.

    Every change is O(1) in the store's size: a catalog of thousands of models gets its
    changes one by one."""

    def __init__(self, specs: Iterable[ModelSpec] = ()) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, ModelSpec] = {}
        self._variants: dict[str, list[str]] = {}  # model -> the ids derived from it (canary version, static adapters)
        self._derived: set[str] = set()  # those ids (a model of the store's own takes the place of one)
        self._generation = 0  # bumped by every change (status_report.py reads the catalog again then)
        for spec in specs:
            self.put(spec)

    def get(self, model_id: str) -> ModelSpec:
        with self._lock:
            spec = self._specs.get(model_id)
        if spec is None:
            raise errors.ModelNotFound(f"model {errors.excerpt(model_id)} is not in this worker's model store")
        return spec

    def list(self) -> list[ModelSpec]:
        with self._lock:
            return [self._specs[key] for key in sorted(self._specs)]

    def put(self, spec: ModelSpec) -> None:
        """Add or replace `spec`, and its canary version in step with it."""
        with self._lock:
            self._put_locked(spec)

    def remove(self, model_id: str) -> None:
        with self._lock:
            self._remove_locked(model_id)

    def replace(self, specs: Iterable[ModelSpec]) -> None:
        """Hold exactly `specs` (and their canary versions) from now on."""
        with self._lock:
            self._specs, self._variants, self._derived = {}, {}, set()
            self._generation += 1
            for spec in specs:
                self._put_locked(spec)

    @property
    def generation(self) -> int | None:
        return self._generation

    def _put_locked(self, spec: ModelSpec) -> None:
        self._remove_locked(spec.id)
        self._generation += 1
        self._specs[spec.id] = spec
        derived = [variant] if (variant := spec.canary_variant()) is not None else []
        derived += spec.static_adapters()  # LoRA adapters its engine starts with, each a model of its own
        kept = []
        for other in derived:
            if other.id in self._specs and other.id not in self._derived:
                log.warning("model %s: %s is already a model of this store; its static adapter of that name is "
                            "not served", spec.id, other.id)
                continue
            self._specs[other.id] = other
            self._derived.add(other.id)
            kept.append(other.id)
        if kept:
            self._variants[spec.id] = kept

    def _remove_locked(self, model_id: str) -> None:
        if model_id in self._specs:
            self._generation += 1
        self._specs.pop(model_id, None)
        self._derived.discard(model_id)
        for derived in self._variants.pop(model_id, ()):
            if derived in self._derived:  # not since replaced by a model of the store's own
                self._specs.pop(derived, None)
                self._derived.discard(derived)


class JsonModelStore(MemoryModelStore):
    """The seed's ``models.json``; relative file sources resolve against its folder.

    Re-read whenever the file changes (checked on each lookup: one stat), so a
    store edited while the worker runs is followed. A changed file that does
    not parse keeps the previous catalog.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen = self._signature()
        super().__init__(model_store.read_file(self.path))

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
            specs = model_store.read_file(self.path)
        except ValueError as exc:
            log.warning("model store %s changed but does not parse; keeping the previous catalog: %s", self.path, exc)
            return
        self.replace(specs)
        self._seen = seen

    def get(self, model_id: str) -> ModelSpec:
        self._refresh()
        return super().get(model_id)

    def list(self) -> list[ModelSpec]:
        self._refresh()
        return super().list()

    @property
    def generation(self) -> int | None:
        self._refresh()  # one stat: a changed file is read first
        return self._generation


class FollowedModelStore(MemoryModelStore):
    """This pod's pool catalog, followed from the operator's feed by a thread of its own.

    `url`: the feed of this pod's pool (the operator sets ``HOTSET_CATALOG_URL``). The first
    answer is awaited for up to `first_wait_s` at start (pinned models are known before the
    first load); after that the store follows in the background and keeps what it has while
    the operator cannot be reached (an operator restart, a network blip), asking again after
    `retry_s`. An entry that does not parse is skipped, logged with its model and field; the
    others still apply. `credential`: what each request presents (a cluster pod's catalog token,
    read again as the kubelet rewrites it)."""

    def __init__(self, url: str, credential: BearerToken | None = None, wait_s: float = 25.0, retry_s: float = 1.0,
                 first_wait_s: float = 10.0, client: httpx.Client | None = None) -> None:
        super().__init__()
        self.url = url
        self.wait_s = wait_s
        self.retry_s = retry_s
        self.cursor = ""  # "<epoch>.<revision>" of what this store holds; "": nothing yet
        self.credential = credential or BearerToken()  # read per request: the kubelet rotates it
        self._http = client or httpx.Client(timeout=httpx.Timeout(wait_s + 10.0, connect=5.0))
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="catalog-follower", daemon=True)
        self._thread.start()
        if not self._first.wait(first_wait_s):
            log.warning("no catalog from %s within %.0fs; starting empty and following", url, first_wait_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.wait_s + 15.0)
        self._http.close()

    def apply(self, update: CatalogUpdate) -> None:
        """Take one answer of the feed: a complete snapshot replaces the store, changes patch it."""
        specs = []
        for index, entry in enumerate(update.models):
            try:
                specs.append(model_store.parse_entry(entry, self.url, None, index))
            except ValueError as exc:
                log.warning("skipping a catalog entry: %s", exc)
        if update.complete:
            self.replace(specs)
        else:
            with self._lock:
                for model_id in update.removed:
                    self._remove_locked(model_id)
                for spec in specs:
                    self._put_locked(spec)
        self.cursor = update.cursor

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                update = self._ask()
            except (httpx.HTTPError, pydantic.ValidationError, ValueError) as exc:
                log.info("catalog feed %s: %s; keeping %d models, asking again in %.0fs",
                         self.url, exc, len(self._specs), self.retry_s)
                self._stop.wait(self.retry_s)
                continue
            self.apply(update)
            self._first.set()

    def _ask(self) -> CatalogUpdate:
        params = {model_store.WAIT_PARAM: f"{self.wait_s:g}" if self.cursor else "0"}
        if self.cursor:
            params[model_store.CURSOR_PARAM] = self.cursor
        answer = self._http.get(self.url, params=params, headers=self.credential.headers())
        answer.raise_for_status()
        return CatalogUpdate.model_validate_json(answer.content)
