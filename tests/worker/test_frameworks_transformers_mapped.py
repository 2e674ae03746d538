"""Weights from the source cache are mapped, not copied; the cache never evicts them under a loaded
model, and no mapping outlives the copy. Weights from a user's own folder (file://) are copied, so
rewriting a file there cannot reach a loaded model.

The cache is filled from a real S3 server (MinIO on loopback) by the real fetcher; the model is the
sample sentiment classifier, loaded by the real transformers worker in this process, so the test
can read this process's own memory map (/proc/self/maps).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from hotset_common.spec import ModelSpec
from hotset_worker import engine
from hotset_worker.frameworks.base import FrameworkWorker, WorkerContext
from hotset_worker.sources.cache import ContentCache
from hotset_worker.sources.credentials import Credentials
from hotset_worker.sources.fetcher import SourceFetcher, source_key
from hotset_worker.sources.plan import SourceSettings

pytestmark = pytest.mark.slow
SECRET = "keys"
TEXTS = ["a wonderful little model", "a terrible, broken thing"]


@pytest.fixture(scope="module")
def sentiment_folder(sample_specs: dict[str, ModelSpec]) -> Path:
    return Path(sample_specs["sentiment"].source.removeprefix("file://"))


@pytest.fixture(scope="module")
def uploaded(s3, sentiment_folder: Path) -> None:
    s3.make_bucket("models")
    s3.upload_folder("models", "sentiment/", sentiment_folder)


class _Held:
    """What the manager would say it holds (the fetcher keeps those copies' entries leased)."""

    def __init__(self) -> None:
        self.keys: set[tuple[str, str]] = set()

    def __call__(self) -> set[tuple[str, str]]:
        return set(self.keys)


@pytest.fixture()
def fetcher(s3, uploaded, tmp_path: Path) -> Iterator[tuple[SourceFetcher, _Held]]:
    credentials = s3.credential_files(tmp_path / "credentials", SECRET)
    fetcher = SourceFetcher(ContentCache(tmp_path / "cache", 2**30), SourceSettings(s3_endpoint=s3.endpoint),
                            Credentials(credentials))
    held = fetcher.held = _Held()
    try:
        yield fetcher, held
    finally:
        fetcher.close()


def _spec(model_id: str, source: str, **options: object) -> ModelSpec:
    return ModelSpec(id=model_id, framework="transformers", task="text-classification", source=source,
                     source_options=options)


def _mappings_of(path: Path) -> list[str]:
    """This process's memory mappings of `path` (also once it was deleted)."""
    name = str(path.resolve())
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if name in line]


def _probabilities(worker: FrameworkWorker) -> np.ndarray:
    return np.array([[row["probabilities"][label] for label in sorted(row["probabilities"])]
                     for row in worker.predict(TEXTS)])


def test_a_model_from_the_cache_maps_its_weights_and_answers_as_a_copied_load(fetcher, sentiment_folder) -> None:
    fetcher, held = fetcher
    spec = _spec("cached", "s3://models/sentiment", secret_name=SECRET)
    held.keys.add(("cached", source_key(spec)))
    mapped = engine.create(spec, WorkerContext(fetcher=fetcher))
    copied = engine.create(_spec("copied", sentiment_folder.as_uri()), WorkerContext())
    mapped.load()
    copied.load()
    try:
        weights = fetcher.cached(spec) / "model.safetensors"
        assert _mappings_of(weights), "the cached weights should be mapped from the cache entry"
        assert not _mappings_of(sentiment_folder / "model.safetensors")  # the file:// copy owns its memory
        assert mapped.measured_bytes() == copied.measured_bytes() > 0  # still measured, tensor by tensor
        np.testing.assert_array_equal(_probabilities(mapped), _probabilities(copied))
    finally:
        mapped.unload()
        copied.unload()


def test_a_mapped_models_entry_is_never_evicted_while_loaded_and_no_mapping_outlives_its_unload(fetcher) -> None:
    fetcher, held = fetcher
    spec = _spec("cached", "s3://models/sentiment", secret_name=SECRET)
    held.keys.add(("cached", source_key(spec)))
    worker = engine.create(spec, WorkerContext(fetcher=fetcher))
    worker.load()
    entry = fetcher.cached(spec)
    weights = entry / "model.safetensors"
    before = _probabilities(worker)
    # Another pod of the node sharing the cache folder evicts everything it may: not this entry.
    other_pod = ContentCache(fetcher.cache.root, budget_bytes=1)
    assert other_pod.evict_unused() == 0
    assert weights.is_file() and _mappings_of(weights)
    np.testing.assert_array_equal(_probabilities(worker), before)

    worker.unload()
    assert _mappings_of(weights) == []  # the unload let go of the file itself, not only of the model
    held.keys.clear()  # the manager no longer holds the copy: the next sweep drops its lease
    fetcher.sweep()
    assert other_pod.evict_unused() > 0
    assert not entry.exists() and _mappings_of(weights) == []  # no mapping of a deleted file pins the disk


def test_rewriting_a_file_sources_weights_in_place_does_not_reach_the_loaded_model(sentiment_folder, tmp_path) -> None:
    folder = tmp_path / "sentiment"
    shutil.copytree(sentiment_folder, folder)
    worker = engine.create(_spec("own-folder", folder.as_uri()), WorkerContext())
    worker.load()
    try:
        before = _probabilities(worker)
        weights = folder / "model.safetensors"
        size = weights.stat().st_size
        with open(weights, "r+b") as rewrite:  # the same file, its tensors rewritten in place
            data_start = 8 + int.from_bytes(rewrite.read(8), "little")  # after safetensors' header
            rewrite.seek(data_start)
            rewrite.write(b"\x7f" * (size - data_start))
        np.testing.assert_array_equal(_probabilities(worker), before)
    finally:
        worker.unload()
