"""Remote model sources as local folders: plan by scheme, fetch through the cache, hold a lease.

A framework worker asks for its model's folder while it loads (on the load
thread, so downloads never block the event loop). For a remote source the
fetcher plans (``s3``, ``hub``, ``archive``: what the source is now and its
content key), takes the entry from the cache or fills it once, and keeps a
lease on it for as long as the manager holds a copy of that model
(``in_use``: the manager's copies, asked on each fetch and every
``SWEEP_S``). ``oci://`` sources are image volumes the kubelet mounted
(``oci.folder``: nothing to fetch), or, where the pool has image volumes off,
pulled into the cache like the others (``oci_pull``). A load's deadline covers its fetch: one
still running at the model's ``loadTimeoutSeconds`` (else ``load_timeout_s``) fails the load,
naming how far it got.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol

from hotset_common import errors
from hotset_common import sources as locations
from hotset_common.spec import ModelSpec
from hotset_worker.sources import archive, hub, oci, oci_pull, s3
from hotset_worker.sources.cache import ContentCache, Lease, format_progress
from hotset_worker.sources.credentials import Credentials
from hotset_worker.sources.plan import FetchPlan, SourceSettings

log = logging.getLogger(__name__)

DEFAULT_LOAD_TIMEOUT_S = 1800.0
SWEEP_S = 10.0

HeldSources = Callable[[], Iterable[tuple[str, str]]]  # (model id, source key) of every copy held


class FetchObserver(Protocol):
    """What the fetcher reports (the worker's Prometheus metrics implement it)."""

    def source_fetched(self, spec: ModelSpec, scheme: str, hit: bool, nbytes: int, seconds: float) -> None: ...

    def source_failed(self, spec: ModelSpec, scheme: str) -> None: ...


class _NoObserver:
    def source_fetched(self, spec: ModelSpec, scheme: str, hit: bool, nbytes: int, seconds: float) -> None:
        pass

    def source_failed(self, spec: ModelSpec, scheme: str) -> None:
        pass


def source_key(spec: ModelSpec) -> str:
    """What names a copy's fetched files: its source and options."""
    return f"{spec.source}\0{spec.source_options.key()}"


class SourceFetcher:
    def __init__(self, cache: ContentCache | None, settings: SourceSettings | None = None,
                 credentials: Credentials | None = None, observer: FetchObserver | None = None,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> None:
        self.cache = cache
        self.settings = settings or SourceSettings()
        self.credentials = credentials or Credentials(None)
        self.observer = observer or _NoObserver()
        self.load_timeout_s = load_timeout_s
        self.held: HeldSources | None = None  # set once the manager exists (main.build_app)
        self._leases: dict[tuple[str, str], Lease] = {}
        self._fetching: dict[str, str] = {}  # model id -> the cache key it is being fetched into
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._stopped = threading.Event()

    # ----- the framework workers' one call --------------------------------

    def folder(self, spec: ModelSpec) -> Path:
        """The local folder of `spec`'s remote source, fetched if it is not cached (blocking)."""
        location = locations.parse(spec.source)
        if isinstance(location, locations.OciImage) and self.settings.oci_image_volumes:
            return oci.folder(spec.source, location, self.settings)
        if self.cache is None:
            raise errors.ModelLoadFailed(f"source {spec.source!r}: this worker has no source cache (--source-cache)")
        deadline = time.monotonic() + spec.load_timeout_s(self.load_timeout_s)
        self.sweep()
        started = time.monotonic()
        try:
            plan = self._cached_plan(location, spec) or self._plan(spec, location)
            with self._lock:
                self._fetching[spec.id] = plan.key
            try:
                lease = self.cache.acquire(plan.key, spec.source, plan.total_bytes, plan.fill, deadline)
            finally:
                with self._lock:
                    self._fetching.pop(spec.id, None)
        except errors.HotsetError as exc:
            self.observer.source_failed(spec, location_scheme(location))
            if time.monotonic() >= deadline and isinstance(exc, errors.ModelLoadFailed):
                raise errors.ModelLoadFailed(f"{exc.message} (a load of {spec.id!r} may take {spec.load_timeout_s(self.load_timeout_s):.0f}s: "
                                             "its spec.loadTimeoutSeconds, else the worker's --load-timeout-s)") from exc
            raise
        self._keep(spec, lease)
        seconds = lease.download_s if not lease.hit else time.monotonic() - started
        self.observer.source_fetched(spec, plan.scheme, lease.hit, lease.downloaded_bytes, seconds)
        log.info("source %s for %s: %s (%s)", spec.source, spec.id, f"cache hit in {seconds:.3f}s" if lease.hit else
                 f"downloaded {lease.downloaded_bytes} bytes in {lease.download_s:.2f}s", plan.describe)
        return lease.path

    def prepare(self, specs: Iterable[ModelSpec]) -> None:
        """At pod start: import the S3 client library if any of `specs` comes from a bucket
        (boto3 and botocore take a few tenths of a second), so the first load does not."""
        if self.cache is not None and any(locations.scheme_of(spec.source) in ("s3", "gs") for spec in specs):
            import boto3  # noqa: F401

    def cached(self, spec: ModelSpec) -> Path | None:
        """The folder of `spec`'s source if it can be read without fetching (metadata of a cold
        model must not download it): an image volume, or a copy this worker holds a lease on."""
        location = locations.parse(spec.source)
        if isinstance(location, locations.OciImage) and self.settings.oci_image_volumes:
            path = oci.mount_path(location, self.settings)
            return path if path.is_dir() else None
        with self._lock:
            lease = self._leases.get((spec.id, source_key(spec)))
        return lease.path if lease is not None and lease.held else None

    def progress(self, model_id: str) -> str:
        """``downloading 1.2 of 4.0 GiB`` while `model_id`'s source is being fetched here, else ''."""
        with self._lock:
            key = self._fetching.get(model_id)
        if key is None or self.cache is None:
            return ""
        progress = self.cache.progress(key)
        return format_progress(progress) if progress is not None else "waiting for another download of its source"

    # ----- leases ------------------------------------------------------------

    def _keep(self, spec: ModelSpec, lease: Lease) -> None:
        with self._lock:
            old = self._leases.get((spec.id, source_key(spec)))
            self._leases[(spec.id, source_key(spec))] = lease
        if old is not None:
            old.release()
        self._start_sweeper()

    def sweep(self) -> None:
        """Release the leases of copies the manager no longer holds (unloaded, evicted, failed)."""
        if self.held is None:
            return
        held = set(self.held())
        with self._lock:
            gone = [key for key in self._leases if key not in held]
            leases = [self._leases.pop(key) for key in gone]
        for lease in leases:
            lease.release()

    def _start_sweeper(self) -> None:
        if self._sweeper is not None or self.held is None:
            return
        self._sweeper = threading.Thread(target=self._sweep_forever, name="source-leases", daemon=True)
        self._sweeper.start()

    def _sweep_forever(self) -> None:
        while not self._stopped.wait(SWEEP_S):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - a failed sweep is retried on the next tick
                log.exception("releasing source leases failed")

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.release()

    # ----- planning ------------------------------------------------------------

    def _cached_plan(self, location: locations.Location, spec: ModelSpec) -> FetchPlan | None:
        """A plan that needs no request: the source's key is known from the spec (an archive's
        sha256, a hub commit, an image's manifest digest) and the cache holds it. None: ask the source (S3 always: only a
        listing tells whether a prefix changed)."""
        assert self.cache is not None
        key = None
        if isinstance(location, locations.Archive):
            key = archive.known_key(spec.source_options)
        elif isinstance(location, locations.HubRepo):
            key = hub.known_key(location, self.settings)
        elif isinstance(location, locations.OciImage):
            key = oci_pull.known_key(location)
        if key is None or not self.cache.has(key):
            return None

        def refill(folder: Path, progress: object, deadline: float) -> None:  # evicted in between: ask
            self._plan(spec, location).fill(folder, progress, deadline)  # type: ignore[arg-type]

        return FetchPlan(key=key, total_bytes=0, fill=refill, scheme=location_scheme(location), describe="cached")

    def _plan(self, spec: ModelSpec, location: locations.Location) -> FetchPlan:
        if isinstance(location, locations.BucketPrefix):
            return s3.plan(spec.source, location, spec.source_options, self.settings, self.credentials)
        if isinstance(location, locations.HubRepo):
            return hub.plan(spec.source, location, spec.source_options, self.settings, self.credentials)
        if isinstance(location, locations.Archive):
            return archive.plan(spec.source, location, spec.source_options)
        if isinstance(location, locations.OciImage):
            return oci_pull.plan(spec.source, location, spec.source_options, self.settings, self.credentials)
        raise errors.ModelLoadFailed(f"source {spec.source!r} is not fetched by the worker")


def location_scheme(location: locations.Location) -> str:
    return getattr(location, "scheme", "hf" if isinstance(location, locations.HubRepo) else "oci")
