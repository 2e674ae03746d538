"""The source cache alone: entries appear whole or not at all, room is made least valuable first,
an entry in use is never evicted, and a failed fill evicts nothing. Fills here are small functions
writing files (the cache's contract with the scheme modules); the real schemes are tested against
real servers in test_source_fetcher.py, test_sources_from_s3.py and test_sources_from_the_hub.py."""
from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from hotset_common import errors
from hotset_worker.sources.cache import CacheFull, ContentCache, Progress, format_progress

MiB = 2**20


def _writer(nbytes: int, calls: list[str] | None = None, delay_s: float = 0.0):
    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        if calls is not None:
            calls.append(folder.name)
        time.sleep(delay_s)
        (folder / "weights.bin").write_bytes(b"x" * nbytes)
        progress.add(nbytes)

    return fill


def _far() -> float:
    return time.monotonic() + 60


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_is_renamed_in_only_when_its_fill_finished(tmp_path) -> None:
    cache = ContentCache(tmp_path, 10 * MiB)
    seen_during_fill: list[bool] = []

    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        (folder / "half").write_bytes(b"x")
        seen_during_fill.append(cache.has("k1"))
        (folder / "rest").write_bytes(b"y")

    lease = cache.acquire("k1", "s3://b/m", 2, fill, _far())
    assert seen_during_fill == [False]
    assert sorted(p.name for p in lease.path.iterdir()) == ["half", "rest"]
    assert not lease.hit and cache.has("k1")
    assert list(cache.tmp.iterdir()) == []


def test_a_failed_fill_leaves_nothing_and_the_next_attempt_starts_clean(tmp_path) -> None:
    cache = ContentCache(tmp_path, 10 * MiB)

    def broken(folder: Path, progress: Progress, deadline: float) -> None:
        (folder / "partial.bin").write_bytes(b"x" * 1000)
        raise errors.ModelLoadFailed("source 's3://b/m': object 'partial.bin' was truncated")

    with pytest.raises(errors.ModelLoadFailed, match="truncated"):
        cache.acquire("k1", "s3://b/m", 2000, broken, _far())
    assert list(cache.tmp.iterdir()) == [] and not cache.has("k1")
    assert cache.acquire("k1", "s3://b/m", 5, _writer(5), _far()).path.is_dir()


def test_a_full_disk_is_named_and_evicts_nothing(tmp_path) -> None:
    clock = FakeClock()
    cache = ContentCache(tmp_path, 3 * MiB, clock=clock)
    cache.acquire("old", "s3://b/old", MiB, _writer(MiB), _far()).release()

    def disk_full(folder: Path, progress: Progress, deadline: float) -> None:
        (folder / "weights.bin").write_bytes(b"x" * 100)
        progress.add(100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(errors.ModelLoadFailed, match=r"s3://b/new.*cache disk .* is full.*nothing was evicted"):
        cache.acquire("new", "s3://b/new", 2 * MiB + 1, disk_full, _far())  # would need 'old' evicted
    assert cache.has("old") and list(cache.tmp.iterdir()) == []


def test_room_is_made_least_valuable_first_and_only_once_the_new_entry_is_complete(tmp_path) -> None:
    clock = FakeClock()
    cache = ContentCache(tmp_path, 3 * MiB, clock=clock)
    for key in ("often-used", "used-once", "recent"):  # equal downloads (10 ms each), equal sizes
        cache.acquire(key, f"s3://b/{key}", MiB, _writer(MiB, delay_s=0.01), _far()).release()
        clock.now += 10
    for _ in range(5):  # its downloads are worth keeping: five loads read it
        cache.acquire("often-used", "s3://b/often-used", MiB, _writer(MiB), _far()).release()
    clock.now += 10
    cache.acquire("recent", "s3://b/recent", MiB, _writer(MiB), _far()).release()
    present_while_filling: list[bool] = []

    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        present_while_filling.append(cache.has("used-once"))
        _writer(MiB)(folder, progress, deadline)

    cache.acquire("newcomer", "s3://b/newcomer", MiB, fill, _far()).release()
    assert present_while_filling == [True]  # evicted after the fill, not before
    assert {info.key for info in cache.infos()} == {"often-used", "recent", "newcomer"}


def test_an_entry_in_use_is_never_evicted_and_a_cache_that_cannot_make_room_says_why(tmp_path) -> None:
    cache = ContentCache(tmp_path, 2 * MiB)
    held = cache.acquire("held", "s3://b/held", MiB, _writer(MiB), _far())  # a loaded model's lease
    cache.acquire("idle", "s3://b/idle", MiB, _writer(MiB), _far()).release()
    assert cache.in_use("held") and not cache.in_use("idle")
    third = cache.acquire("third", "s3://b/third", MiB, _writer(MiB), _far())  # evicts 'idle', never 'held'
    assert cache.has("held") and not cache.has("idle")
    with pytest.raises(CacheFull, match=r"s3://b/fourth' needs 1\.0Mi.*2\.0Mi are taken, 2\.0Mi of them by models in use; "
                                        r"nothing was evicted"):
        cache.acquire("fourth", "s3://b/fourth", MiB, _writer(MiB), _far())
    assert cache.has("held") and cache.has("third")
    held.release()
    third.release()
    assert not cache.in_use("held")


def test_a_source_larger_than_the_whole_budget_is_refused_before_downloading(tmp_path) -> None:
    cache = ContentCache(tmp_path, MiB)
    calls: list[str] = []
    with pytest.raises(CacheFull, match="more than the whole source cache budget"):
        cache.acquire("huge", "hf://org/huge", 2 * MiB, _writer(2 * MiB, calls), _far())
    assert calls == []


def test_concurrent_acquires_of_one_key_fill_it_once(tmp_path) -> None:
    cache = ContentCache(tmp_path, 10 * MiB)
    calls: list[str] = []
    leases = []
    threads = [threading.Thread(target=lambda: leases.append(
        cache.acquire("k", "s3://b/m", MiB, _writer(MiB, calls, delay_s=0.2), _far()))) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(leases) == 10
    assert sum(1 for lease in leases if not lease.hit) == 1


def test_a_fill_abandoned_by_a_dead_process_is_removed(tmp_path) -> None:
    ContentCache(tmp_path, MiB)
    leftover = tmp_path / "tmp" / "deadbeef.12345.abcd"
    leftover.mkdir()
    (leftover / "half.bin").write_bytes(b"x")
    (tmp_path / "tmp" / "deadbeef.12345.abcd.expect").write_text("1000")
    cache = ContentCache(tmp_path, MiB)  # the next process to look
    assert list(cache.tmp.iterdir()) == []


def test_waiting_for_another_fill_ends_at_the_deadline(tmp_path) -> None:
    cache = ContentCache(tmp_path, 10 * MiB)
    started = threading.Event()

    def slow(folder: Path, progress: Progress, deadline: float) -> None:
        started.set()
        time.sleep(1.0)
        _writer(10)(folder, progress, deadline)

    filler = threading.Thread(target=lambda: cache.acquire("k", "s3://b/m", 10, slow, _far()))
    filler.start()
    started.wait(5)
    other = ContentCache(tmp_path, 10 * MiB)  # another pod on the node: its own locks
    with pytest.raises(errors.ModelLoadFailed, match="deadline passed while another load was fetching it"):
        other.acquire("k", "s3://b/m", 10, _writer(10), time.monotonic() + 0.2)
    filler.join()


def test_progress_reads_as_status_shows_it() -> None:
    progress = Progress(total=4 * 2**30)
    progress.add(int(1.2 * 2**30))
    assert format_progress(progress) == "downloading 1.2 of 4.0 GiB"
    small = Progress(total=24 * MiB)
    small.add(3 * MiB)
    assert format_progress(small) == "downloading 3.0 of 24.0 MiB"
