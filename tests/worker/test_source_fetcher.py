"""The source fetcher against a real S3 server (MinIO), in process: downloads, progress, deadlines,
interrupted transfers, objects rewritten mid-download, and one download however many loads
(threads or processes) want it."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import re
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_testing.cutting_proxy import CuttingProxy
from hotset_testing.worker_server import wait_until
from hotset_worker.sources.cache import ContentCache
from hotset_worker.sources.credentials import Credentials
from hotset_worker.sources.fetcher import SourceFetcher
from hotset_worker.sources.plan import SourceSettings

pytestmark = pytest.mark.slow
SECRET = "keys"


@pytest.fixture(scope="module")
def big_model(s3, tmp_path_factory) -> int:
    """A 24 MiB 'model' (two weight files and a config), uploaded once."""
    folder = tmp_path_factory.mktemp("big")
    (folder / "config.json").write_text('{"kind": "test"}')
    (folder / "weights-1.bin").write_bytes(bytes(range(256)) * (12 * 4096))
    (folder / "weights-2.bin").write_bytes(b"\x07" * (12 * 2**20))
    s3.make_bucket("models")
    return s3.upload_folder("models", "big/", folder)


@pytest.fixture()
def proxy(s3):
    target = urlsplit(s3.endpoint)
    with CuttingProxy(target.hostname, target.port).running() as running:
        yield running


def _fetcher(tmp_path: Path, s3, timeout_s: float = 60.0, budget: int = 2**30) -> SourceFetcher:
    credentials = s3.credential_files(tmp_path / "credentials", SECRET)
    return SourceFetcher(ContentCache(tmp_path / "cache", budget), SourceSettings(s3_endpoint=s3.endpoint),
                         Credentials(credentials), load_timeout_s=timeout_s)


def _spec(model_id: str, uri: str = "s3://models/big", **options: object) -> ModelSpec:
    return ModelSpec(id=model_id, framework="transformers", source=uri,
                     source_options={"secret_name": SECRET, **options})


def _leftovers(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "cache" / "tmp").iterdir())


OLD_WEIGHTS, NEW_WEIGHTS = b"\x01" * (8 * 2**20), b"\x02" * (8 * 2**20)
OLD_TAIL, NEW_TAIL = b"\x03" * 2**20, b"\x04" * 2**20


@pytest.fixture()
def changing(s3, big_model) -> str:
    """A prefix of this test's own, which it rewrites: config.json, weights-1.bin (8 MiB), weights-2.bin
    (1 MiB); the fetch takes them in that order."""
    prefix = f"changing-{uuid.uuid4().hex[:8]}"
    client = s3.client()
    for name, body in (("config.json", b'{"kind": "test"}'), ("weights-1.bin", OLD_WEIGHTS), ("weights-2.bin", OLD_TAIL)):
        client.put_object(Bucket="models", Key=f"{prefix}/{name}", Body=body)
    return prefix


def _downloaded_mib(fetcher: SourceFetcher, model_id: str) -> float:
    found = re.match(r"downloading (\d+\.\d)", fetcher.progress(model_id))
    return float(found.group(1)) if found else 0.0


def test_a_download_lands_whole_and_a_second_fetch_is_a_hit(s3, big_model, tmp_path) -> None:
    fetcher = _fetcher(tmp_path, s3)
    folder = fetcher.folder(_spec("big"))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "weights-1.bin", "weights-2.bin"]
    assert sum(p.stat().st_size for p in folder.iterdir()) == big_model
    assert fetcher.folder(_spec("big")) == folder  # the same entry: keyed by the listing's ETags
    assert _leftovers(tmp_path) == []


def test_a_rotated_secret_is_used_from_the_next_fetch_though_clients_are_reused(s3, big_model, tmp_path) -> None:
    from hotset_common.sources import credential_key

    fetcher = _fetcher(tmp_path, s3)
    folder = fetcher.folder(_spec("big"))
    secret_file = tmp_path / "credentials" / credential_key("", SECRET, "AWS_SECRET_ACCESS_KEY")
    secret_file.write_text("not-the-secret")  # the kubelet refreshed the mounted Secret
    with pytest.raises(errors.ModelLoadFailed, match=r"refused \((403|SignatureDoesNotMatch|InvalidAccessKeyId|AccessDenied)"):
        fetcher.folder(_spec("big"))  # a hit still lists the prefix: with the new keys, not a kept client's
    secret_file.write_text(s3.secret_key)
    assert fetcher.folder(_spec("big")) == folder


def test_progress_says_how_far_a_slow_download_is(s3, big_model, proxy, tmp_path) -> None:
    proxy.rate = 8 * 2**20  # 8 MiB/s: about 3 s for the model
    fetcher = _fetcher(tmp_path, s3)
    spec = _spec("slow", endpoint=proxy.url)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(fetcher.folder, spec)
        seen: list[str] = []
        while not done.done():
            if text := fetcher.progress("slow"):
                seen.append(text)
            time.sleep(0.05)
        done.result()
    shown = [t for t in seen if re.fullmatch(r"downloading \d+\.\d of 24\.0 MiB", t)]
    assert shown, seen
    assert len({t for t in shown}) >= 3  # it moved while we watched
    assert fetcher.progress("slow") == ""


def test_a_download_past_the_load_deadline_fails_and_the_next_starts_clean(s3, big_model, proxy, tmp_path) -> None:
    proxy.rate = 2 * 2**20  # 12 s for the model; the deadline is 1 s
    fetcher = _fetcher(tmp_path, s3, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(errors.ModelLoadFailed, match=r"s3://models/big.*deadline passed.*nothing was kept"):
        fetcher.folder(_spec("late", endpoint=proxy.url))
    assert time.monotonic() - started < 5
    assert _leftovers(tmp_path) == []
    proxy.rate = None
    assert _fetcher(tmp_path, s3).folder(_spec("late", endpoint=proxy.url)).is_dir()  # the same cache, a longer deadline


def test_a_models_own_load_timeout_replaces_the_workers_both_ways(s3, big_model, proxy, tmp_path) -> None:
    proxy.rate = 4 * 2**20  # about 6 s for the model
    generous = _fetcher(tmp_path, s3, timeout_s=1.0)  # the worker's value alone would fail it
    started = time.monotonic()
    assert generous.folder(_spec("large", endpoint=proxy.url).model_copy(update={"load_timeout_seconds": 120.0})).is_dir()
    assert time.monotonic() - started > 1.0  # it really took longer than the worker's value
    strict = _fetcher(tmp_path / "other", s3, timeout_s=600.0)
    with pytest.raises(errors.ModelLoadFailed, match=r"deadline passed.*'quick' may take 1s: its spec.loadTimeoutSeconds"):
        strict.folder(_spec("quick", endpoint=proxy.url).model_copy(update={"load_timeout_seconds": 1.0}))


def test_an_interrupted_download_fails_naming_the_object_and_leaves_nothing(s3, big_model, proxy, tmp_path) -> None:
    proxy.cut_after(6 * 2**20)  # mid-way through the first weight file
    fetcher = _fetcher(tmp_path, s3)
    with pytest.raises(errors.ModelLoadFailed) as failure:
        fetcher.folder(_spec("cut", endpoint=proxy.url))
    message = failure.value.message
    assert "s3://models/big" in message and "weights-1.bin" in message, message
    assert "interrupted" in message or "truncated" in message, message
    assert proxy.cuts == 1
    assert _leftovers(tmp_path) == []
    assert not any((tmp_path / "cache" / "entries").iterdir())
    assert fetcher.folder(_spec("cut", endpoint=proxy.url)).is_dir()  # the next attempt starts clean


def test_ten_threads_wanting_one_source_download_it_once(s3, big_model, proxy, tmp_path) -> None:
    fetcher = _fetcher(tmp_path, s3)
    proxy.rate = 32 * 2**20
    specs = [_spec(f"m{i}", endpoint=proxy.url) for i in range(10)]  # ten models, one source
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        folders = set(pool.map(fetcher.folder, specs))
    assert len(folders) == 1
    info = fetcher.cache.infos()
    assert len(info) == 1 and info[0].bytes == big_model


def _fetch_in_another_process(cache: str, credentials: str, endpoint: str, proxy: str, out: multiprocessing.Queue) -> None:
    fetcher = SourceFetcher(ContentCache(Path(cache), 2**30), SourceSettings(s3_endpoint=endpoint),
                            Credentials(Path(credentials)))
    started = time.monotonic()
    path = fetcher.folder(_spec("other-pod", endpoint=proxy))
    out.put((str(path), time.monotonic() - started))


def test_two_pods_sharing_a_node_cache_download_once(s3, big_model, proxy, tmp_path) -> None:
    proxy.rate = 16 * 2**20  # 1.5 s: the second process arrives while the first downloads
    credentials = s3.credential_files(tmp_path / "credentials", SECRET)
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = context.Queue()
    processes = [context.Process(target=_fetch_in_another_process,
                                 args=(str(tmp_path / "cache"), str(credentials), s3.endpoint, proxy.url, out))
                 for _ in range(2)]
    for process in processes:
        process.start()
    results = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    assert len({path for path, _ in results}) == 1
    assert len(ContentCache(tmp_path / "cache", 2**30).infos()) == 1
    assert proxy.answered < 1.3 * big_model  # the model's bytes crossed the wire once
    assert _leftovers(tmp_path) == []


def test_an_object_rewritten_after_the_listing_fails_the_load_naming_it_and_the_next_fetches_the_new(
        s3, changing, proxy, tmp_path) -> None:
    proxy.rate = 4 * 2**20  # two seconds in weights-1.bin: the test rewrites weights-2.bin meanwhile
    fetcher = _fetcher(tmp_path, s3)
    spec = _spec("changing", uri=f"s3://models/{changing}", endpoint=proxy.url)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fetch = pool.submit(fetcher.folder, spec)
        wait_until(lambda: _downloaded_mib(fetcher, "changing") >= 0.5 or fetch.done(), timeout_s=60,
                   what="the fetch inside weights-1.bin")
        s3.client().put_object(Bucket="models", Key=f"{changing}/weights-2.bin", Body=NEW_TAIL)  # not through the proxy
        assert _downloaded_mib(fetcher, "changing") < 8.0, "the fetch left weights-1.bin before the rewrite"
        with pytest.raises(errors.ModelLoadFailed) as failure:
            fetch.result()
    message = failure.value.message
    assert re.search(rf"s3://models/{changing}.*object '{changing}/weights-2\.bin' changed while the source was being "
                     r'downloaded \(its ETag is no longer the listed "?[0-9a-f]{32}"?\); nothing was kept', message), message
    assert _leftovers(tmp_path) == []
    assert not any((tmp_path / "cache" / "entries").iterdir())  # no entry of old and new together
    proxy.rate = None
    folder = fetcher.folder(spec)  # the next load lists again: the new version, whole
    assert (folder / "weights-2.bin").read_bytes() == NEW_TAIL
    assert (folder / "weights-1.bin").read_bytes() == OLD_WEIGHTS


def test_an_object_rewritten_while_it_streams_is_cached_whole_in_its_listed_version_never_mixed(
        s3, changing, proxy, tmp_path) -> None:
    """One GET is of one version. MinIO holds the overwrite until the GET in progress ends, so the
    fetch completes with the listed version; a server that let the rewrite through mid-stream would
    fail the MD5 check (or If-Match) instead. Either way no entry holds bytes of both versions."""
    proxy.rate = 4 * 2**20
    fetcher = _fetcher(tmp_path, s3)
    spec = _spec("streaming", uri=f"s3://models/{changing}", endpoint=proxy.url)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fetch = pool.submit(fetcher.folder, spec)
        wait_until(lambda: _downloaded_mib(fetcher, "streaming") >= 1.0 or fetch.done(), timeout_s=60,
                   what="the fetch inside weights-1.bin")
        rewrite = pool.submit(s3.client().put_object, Bucket="models", Key=f"{changing}/weights-1.bin", Body=NEW_WEIGHTS)
        try:
            folder = fetch.result()
        except errors.ModelLoadFailed as failure:  # the other honest outcome: named, nothing kept
            assert f"'{changing}/weights-1.bin'" in failure.message, failure.message
            assert not any((tmp_path / "cache" / "entries").iterdir())
        else:
            assert (folder / "weights-1.bin").read_bytes() == OLD_WEIGHTS  # whole, the version listed
            assert (folder / "weights-2.bin").read_bytes() == OLD_TAIL
        rewrite.result(timeout=60)
    assert _leftovers(tmp_path) == []
    proxy.rate = None
    again = fetcher.folder(spec)  # the rewrite is a new listing: a new entry, the new bytes
    assert (again / "weights-1.bin").read_bytes() == NEW_WEIGHTS
