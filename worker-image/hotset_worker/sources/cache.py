"""The model-file cache: downloaded sources, kept once per pod (or per node) under a byte budget.

Guarantees, and how they are kept:

- **Keyed by content.** An entry's key is a hash of what decides its bytes
  (each object's ETag and size, a hub commit, an archive's sha256), never of
  the URI alone: a changed bucket is a new entry, an unchanged one a hit.
- **Nothing half-written is ever an entry.** A fill writes into ``tmp/``
  under a name of its own and is renamed into ``entries/`` only when it is
  complete and verified; a failed fill's folder is removed at once, and one
  left by a process that died is removed by the next process that looks.
- **Concurrent loads download once**, in one process or several sharing the
  folder (a worker and its sidecar, or every pod of a node on a hostPath):
  the fill holds an exclusive ``flock`` on the key's ``fill`` lock, and whoever
  waits for it finds the finished entry (a hit) when it gets the lock.
- **Never evicts a file in use.** A user holds a shared ``flock`` on the
  key's ``use`` lock for as long as its model is loaded (``Lease``); an
  eviction takes that lock exclusively without waiting, or skips the entry.
  Locks die with their process, so a crashed pod never pins an entry.
- **Least valuable first, and a failed fill evicts nothing.** An entry's keep
  value is ``decayed uses x download seconds / bytes`` (the worker's eviction
  cost model, with downloads for loads). A fill first checks that room can be
  made (the budget less what is in use); the victims are evicted only once
  the new entry is complete and verified, so a missing object, a checksum
  mismatch or a full disk costs no cached model. The price: the disk should
  hold the budget plus the largest model being fetched.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

from hotset_common import errors
from hotset_common.quantity import format_bytes

log = logging.getLogger(__name__)

USE_HALF_LIFE_S = 3600.0  # an entry's uses count half after an hour without one
LOCK_POLL_S = 0.05


class CacheFull(errors.ModelLoadFailed):
    """The budget cannot hold the new entry beside the entries in use (nothing was evicted)."""


class CacheObserver(Protocol):
    def cache_evicted(self, nbytes: int) -> None: ...

    def cache_used(self, nbytes: int, budget: int) -> None: ...


class _NoObserver:
    def cache_evicted(self, nbytes: int) -> None:
        pass

    def cache_used(self, nbytes: int, budget: int) -> None:
        pass


class Progress:
    """How far one fill is: bytes written of the bytes expected (0: not known yet). A fill whose
    client writes files itself can set `probe` to count the bytes of the file in progress."""

    def __init__(self, total: int = 0) -> None:
        self.total = total
        self._done = 0
        self._lock = threading.Lock()
        self.probe: Callable[[], int] | None = None

    @property
    def done(self) -> int:
        probe = self.probe
        return self._done + (probe() if probe is not None else 0)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._done += nbytes


@dataclass(frozen=True)
class EntryInfo:
    """What the cache remembers of one entry (``entries/<key>.json``)."""

    key: str
    uri: str
    bytes: int
    download_s: float
    created: float
    used: float
    uses: float  # decayed count, as of `used`

    def value(self, now: float) -> float:
        """Download seconds a keep saves per byte: the order of eviction (lowest first)."""
        decay = 0.5 ** (max(0.0, now - self.used) / USE_HALF_LIFE_S)
        return self.uses * decay * max(self.download_s, 0.001) / max(self.bytes, 1)


class Lease:
    """A shared lock on one entry: while it is held, no process evicts the entry."""

    def __init__(self, path: Path, fd: int, key: str) -> None:
        self.path = path
        self.key = key
        self._fd: int | None = fd
        self.hit = True  # False: this acquire downloaded the entry
        self.downloaded_bytes = 0
        self.download_s = 0.0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops its flock
            self._fd = None


Fill = Callable[[Path, Progress, float], None]  # (folder to fill, progress, deadline) -> None


class ContentCache:
    def __init__(self, root: Path, budget_bytes: int, observer: CacheObserver | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"source cache budget must be positive, got {budget_bytes}")
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self.observer = observer or _NoObserver()
        self.clock = clock
        self.entries = self.root / "entries"
        self.tmp = self.root / "tmp"
        self.locks = self.root / "locks"
        for folder in (self.entries, self.tmp, self.locks):
            folder.mkdir(parents=True, exist_ok=True)
        self._threads: dict[str, threading.Lock] = {}
        self._threads_guard = threading.Lock()
        self._progress: dict[str, Progress] = {}
        self.remove_abandoned_fills()

    # ----- queries -------------------------------------------------------

    def path(self, key: str) -> Path:
        return self.entries / key

    def has(self, key: str) -> bool:
        return (self.entries / f"{key}.json").is_file() and self.path(key).exists()

    def info(self, key: str) -> EntryInfo | None:
        try:
            return EntryInfo(**json.loads((self.entries / f"{key}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def infos(self) -> list[EntryInfo]:
        found = []
        for meta in self.entries.glob("*.json"):
            info = self.info(meta.stem)
            if info is not None and self.path(info.key).exists():
                found.append(info)
        return found

    def used_bytes(self) -> int:
        """Bytes of complete entries and of fills in progress (their expected size)."""
        return sum(info.bytes for info in self.infos()) + sum(self._fills_in_progress().values())

    def progress(self, key: str) -> Progress | None:
        return self._progress.get(key)

    def in_use(self, key: str) -> bool:
        """Whether any process holds a lease on `key` (tried without waiting)."""
        with self._try_exclusive(self._lock_path(key, "use")) as got:
            return not got

    # ----- the one way in: get an entry, filling it at most once ---------

    def acquire(self, key: str, uri: str, expected_bytes: int, fill: Fill, deadline: float) -> Lease:
        """A lease on the complete entry `key`, filled by `fill` unless it exists (or appears while
        waiting for another fill of it). Raises what `fill` raised, CacheFull when no room can be
        made, ModelLoadFailed naming a deadline that passed; in each case nothing is left in tmp/
        and nothing was evicted."""
        threads = self._thread_lock(key)
        if not threads.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise errors.ModelLoadFailed(f"source {uri!r}: the load's deadline passed while another load was fetching it")
        try:
            lease = self._lease(key, deadline, uri)
            try:
                with self._exclusive(self._lock_path(key, "fill"), deadline, uri):
                    if self.has(key):
                        self._record_use(key)
                        return lease
                    lease.hit = False
                    self._fill(key, uri, expected_bytes, fill, deadline, lease)
                    return lease
            except BaseException:
                lease.release()
                raise
        finally:
            threads.release()

    def _fill(self, key: str, uri: str, expected: int, fill: Fill, deadline: float, lease: Lease) -> None:
        victims = self._plan_room(key, uri, expected)
        partial = self.tmp / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        expect = partial.with_name(partial.name + ".expect")
        progress = self._progress[key] = Progress(total=expected)
        started = time.monotonic()
        ok = False
        try:
            expect.write_text(str(expected))
            partial.mkdir()
            try:
                fill(partial, progress, deadline)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise errors.ModelLoadFailed(
                        f"source {uri!r}: the cache disk at {self.root} is full ({exc.strerror}) after "
                        f"{format_bytes(progress.done)} of {format_bytes(expected)}; nothing was evicted") from exc
                raise
            size = _tree_bytes(partial)
            seconds = time.monotonic() - started
            self._evict(victims)
            if self.path(key).exists():  # a folder without its record: a process died between the two
                shutil.rmtree(self.path(key))
            partial.rename(self.path(key))
            now = self.clock()
            self._write_info(EntryInfo(key, uri, size, seconds, now, now, 1.0))
            ok = True
        finally:
            self._progress.pop(key, None)
            lease.downloaded_bytes, lease.download_s = progress.done, time.monotonic() - started
            if not ok:
                shutil.rmtree(partial, ignore_errors=True)
            with contextlib.suppress(OSError):
                expect.unlink()
            self.observer.cache_used(self.used_bytes(), self.budget_bytes)

    # ----- room ----------------------------------------------------------

    def _plan_room(self, key: str, uri: str, expected: int) -> list[EntryInfo]:
        """The entries to evict (once the fill succeeded) so that `expected` more bytes fit; CacheFull
        when even every entry not in use would not make room."""
        self.remove_abandoned_fills()
        infos = [info for info in self.infos() if info.key != key]
        used = sum(info.bytes for info in infos) + sum(b for k, b in self._fills_in_progress().items() if k != key)
        needed = used + expected - self.budget_bytes
        if expected > self.budget_bytes:
            raise CacheFull(f"source {uri!r} needs {format_bytes(expected)}, more than the whole source cache "
                            f"budget of {format_bytes(self.budget_bytes)}; nothing was evicted")
        if needed <= 0:
            return []
        now = self.clock()
        victims, freed, busy = [], 0, 0
        for info in sorted(infos, key=lambda i: (i.value(now), i.used)):
            if freed >= needed:
                break
            if self.in_use(info.key):
                busy += info.bytes
                continue
            victims.append(info)
            freed += info.bytes
        if freed < needed:
            raise CacheFull(
                f"source {uri!r} needs {format_bytes(expected)} in the source cache ({format_bytes(self.budget_bytes)}): "
                f"{format_bytes(used)} are taken, {format_bytes(busy)} of them by models in use; nothing was evicted")
        return victims

    def _evict(self, victims: list[EntryInfo]) -> None:
        for info in victims:
            with self._try_exclusive(self._lock_path(info.key, "use")) as got:
                if not got:
                    continue  # taken into use since it was chosen: it stays (the budget may overrun a little)
                (self.entries / f"{info.key}.json").unlink(missing_ok=True)
                shutil.rmtree(self.path(info.key), ignore_errors=True)
            log.info("source cache: evicted %s (%s, %s)", info.key, info.uri, format_bytes(info.bytes))
            self.observer.cache_evicted(info.bytes)

    def evict_unused(self) -> int:
        """Remove every entry not in use (an operator's knob, and tests); the bytes freed."""
        victims = [info for info in self.infos() if not self.in_use(info.key)]
        self._evict(victims)
        return sum(info.bytes for info in victims)

    def remove_abandoned_fills(self) -> None:
        """Remove fills whose process is gone (its fill lock is free), e.g. a pod killed mid-download."""
        for child in self.tmp.iterdir():
            key = child.name.split(".", 1)[0]
            with self._try_exclusive(self._lock_path(key, "fill")) as got:
                if got:
                    if child.is_dir():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)

    def _fills_in_progress(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for expect in self.tmp.glob("*.expect"):
            with contextlib.suppress(OSError, ValueError):
                found[expect.name.split(".", 1)[0]] = int(expect.read_text() or 0)
        return found

    # ----- bookkeeping -----------------------------------------------------

    def _record_use(self, key: str) -> None:
        info = self.info(key)
        if info is None:
            return
        now = self.clock()
        decay = 0.5 ** (max(0.0, now - info.used) / USE_HALF_LIFE_S)
        self._write_info(EntryInfo(info.key, info.uri, info.bytes, info.download_s, info.created, now,
                                   info.uses * decay + 1.0))

    def _write_info(self, info: EntryInfo) -> None:
        target = self.entries / f"{info.key}.json"
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        staging.write_text(json.dumps(info.__dict__))
        staging.rename(target)

    # ----- locks -----------------------------------------------------------

    def _lock_path(self, key: str, kind: str) -> Path:
        return self.locks / f"{key}.{kind}"

    def _thread_lock(self, key: str) -> threading.Lock:
        with self._threads_guard:
            return self._threads.setdefault(key, threading.Lock())

    def _lease(self, key: str, deadline: float, uri: str) -> Lease:
        fd = os.open(self._lock_path(key, "use"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _wait_for_flock(fd, fcntl.LOCK_SH, deadline, uri)
        except BaseException:
            os.close(fd)
            raise
        return Lease(self.path(key), fd, key)

    @contextlib.contextmanager
    def _exclusive(self, path: Path, deadline: float, uri: str) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _wait_for_flock(fd, fcntl.LOCK_EX, deadline, uri)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _try_exclusive(self, path: Path) -> Iterator[bool]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
            else:
                yield True
        finally:
            os.close(fd)


def _wait_for_flock(fd: int, kind: int, deadline: float, uri: str) -> None:
    """flock `fd` (shared or exclusive), polling so that a deadline can end the wait."""
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise errors.ModelLoadFailed(
                    f"source {uri!r}: the load's deadline passed while another load was fetching it") from None
            time.sleep(LOCK_POLL_S)


def _tree_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def format_progress(progress: Progress) -> str:
    """``downloading 1.2 of 4.0 GiB`` (what status and ``kubectl describe`` show during a fetch)."""
    unit, factor = ("GiB", 2**30) if max(progress.total, progress.done) >= 2**30 else ("MiB", 2**20)
    if progress.total <= 0:
        return f"downloading {progress.done / factor:.1f} {unit}"
    return f"downloading {progress.done / factor:.1f} of {progress.total / factor:.1f} {unit}"

