"""hf:// through the real huggingface_hub client, against a stand-in for the hub (no hub is reachable
here): tests/hotset_testing/hub_standin.py serves repositories in the hub's layout, and the client
reaches it through HF_ENDPOINT, as a pool reaches a mirror."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_testing import hub_standin
from hotset_testing.worker_server import wait_until, worker_process
from hotset_worker.sources.cache import ContentCache
from hotset_worker.sources.credentials import Credentials
from hotset_worker.sources.fetcher import SourceFetcher
from hotset_worker.sources.plan import SourceSettings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hub(sample_specs):
    with hub_standin.running() as (standin, endpoint):
        folder = Path(sample_specs["sentiment"].source.removeprefix("file://"))
        standin.push("hotset/sentiment", folder)
        standin.push("hotset/private-sentiment", folder, token="hf_secret_token")
        standin.endpoint = endpoint  # type: ignore[attr-defined]
        yield standin


def _fetcher(tmp_path: Path, hub, credentials: Path | None = None) -> SourceFetcher:
    return SourceFetcher(ContentCache(tmp_path / "cache", 2**30), SourceSettings(hf_endpoint=hub.endpoint),
                         Credentials(credentials))


def _spec(model_id: str, uri: str, **options: object) -> ModelSpec:
    return ModelSpec(id=model_id, framework="transformers", task="text-classification", source=uri,
                     source_options=options)


def test_the_worker_serves_a_hub_model_through_hf_endpoint(hub, tmp_path) -> None:
    store = tmp_path / "models.json"
    store.write_text(json.dumps({"models": [{"id": "sentiment", "framework": "transformers",
                                             "task": "text-classification", "source": "hf://hotset/sentiment"}]}))
    args = ["--model-store", str(store), "--memory-budget", "1Gi", "--source-cache", str(tmp_path / "cache")]
    with worker_process(args, env={"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "1"}, timeout_s=120) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=120, what="worker readiness")
        answer = client.post("/predict", json={"model_id": "sentiment", "input_data": "a wonderful little model"})
        assert answer.status_code == 200, answer.text
        assert client.post("/v2/repository/models/sentiment/unload").status_code == 200
        gets = sum(n for key, n in hub.requests.items() if key.startswith("GET hotset/sentiment/"))
        assert client.post("/predict", json={"model_id": "sentiment", "input_data": "so bad"}).status_code == 200
        # The second load asked the hub for the commit only: every file came from the cache.
        assert sum(n for key, n in hub.requests.items() if key.startswith("GET hotset/sentiment/")) == gets
        hits = [line for line in client.get("/metrics").text.splitlines()
                if line.startswith("hotset_source_cache_hits_total{") and 'model="sentiment"' in line]
        assert len(hits) == 1 and hits[0].endswith(" 1.0") and 'scheme="hf"' in hits[0], hits


def test_a_revision_is_cached_by_its_commit_and_a_moved_branch_is_a_new_entry(hub, tmp_path, sample_specs) -> None:
    fetcher = _fetcher(tmp_path, hub)
    commit = hub.repos["hotset/sentiment"].branches["main"]
    on_main = fetcher.folder(_spec("a", "hf://hotset/sentiment"))
    pinned = fetcher.folder(_spec("b", f"hf://hotset/sentiment@{commit}"))
    assert on_main == pinned  # the branch resolved to the same commit: one entry
    assert (on_main / "config.json").is_file() and not (on_main / ".cache").exists()
    moved = tmp_path / "next-version"
    shutil.copytree(Path(sample_specs["sentiment-v2"].source.removeprefix("file://")), moved)
    new_commit = hub.push("hotset/sentiment", moved)
    assert new_commit != commit
    after = fetcher.folder(_spec("c", "hf://hotset/sentiment"))
    assert after != on_main and on_main.is_dir()  # the old commit stays cached for whoever holds it
    asked = sum(hub.requests.values())
    assert fetcher.folder(_spec("d", f"hf://hotset/sentiment@{commit}")) == on_main
    assert sum(hub.requests.values()) == asked  # a cached commit needs no request at all


@pytest.mark.parametrize(("uri", "named"), [
    ("hf://hotset/no-such-model", r"hf://hotset/no-such-model.*repository 'hotset/no-such-model'.*does not exist"),
    ("hf://hotset/sentiment@no-such-branch", r"revision 'no-such-branch' does not exist"),
    ("hf://hotset/private-sentiment", r"hf://hotset/private-sentiment.*(does not exist, or the token|access refused)"),
])
def test_a_missing_repository_revision_or_token_fails_naming_it(hub, tmp_path, uri, named) -> None:
    fetcher = _fetcher(tmp_path, hub)
    with pytest.raises(errors.ModelLoadFailed, match=named):
        fetcher.folder(_spec("m", uri))
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_a_token_from_the_models_secret_opens_a_private_repository(hub, tmp_path) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "team-a.hub-token.HF_TOKEN").write_text("hf_secret_token")
    fetcher = _fetcher(tmp_path, hub, credentials)
    folder = fetcher.folder(_spec("m", "hf://hotset/private-sentiment", secret_name="hub-token", namespace="team-a"))
    assert (folder / "config.json").is_file()


def test_an_interrupted_hub_download_leaves_nothing_and_the_next_one_starts_clean(hub, tmp_path) -> None:
    fetcher = _fetcher(tmp_path, hub)
    hub.cut.add("model.safetensors")  # every try of it is cut short: the client's resumes cannot finish it
    try:
        with pytest.raises(errors.ModelLoadFailed, match=r"hf://hotset/sentiment.*'model.safetensors'"):
            fetcher.folder(_spec("m", "hf://hotset/sentiment"))
    finally:
        hub.cut.clear()
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
    assert not any((tmp_path / "cache" / "entries").iterdir())
    assert (fetcher.folder(_spec("m", "hf://hotset/sentiment")) / "config.json").is_file()
