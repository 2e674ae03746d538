"""The catalog feed and the worker's store that follows it: the real aiohttp server of the operator
(``feed.py``) on a thread, and ``FollowedModelStore``, the code every pool pod runs."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Iterator

import httpx
import pytest

from hotset_common import model_store
from hotset_common.model_store import CatalogUpdate
from hotset_common.spec import ModelSpec
from hotset_operator import feed
from hotset_operator.catalog import Catalog, Catalogs
from hotset_testing.polling import wait_for
from hotset_testing.processes import free_port
from hotset_worker.store import FollowedModelStore

STORE = ("team", "pool")


def spec(name: str, description: str = "") -> ModelSpec:
    return ModelSpec(id=name, framework="torchvision", source=f"pvc://models/{name}", memory="10Mi",
                     description=description)


class Feed:
    """The operator's feed over `catalogs`, served on a loop thread; changes go through `call`."""

    def __init__(self, readers: feed.Readers | None = None, port: int | None = None, ready: bool = True) -> None:
        self.catalogs = Catalogs()
        self.ready = ready
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}{model_store.FEED_PATH}/team/pool"
        self._loop = asyncio.new_event_loop()
        self._server = feed.FeedServer(feed.build_app(self.catalogs, lambda: self.ready, readers), "127.0.0.1", self.port)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> "Feed":
        self._thread.start()
        self.call(self._server.start())
        return self

    def __exit__(self, *_: object) -> None:
        self.call(self._server.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    def put(self, *specs: ModelSpec) -> None:
        async def put() -> None:
            for s in specs:
                self.catalogs.put(STORE, s.id, model_store.encode_entry(s))
        self.call(put())

    def remove(self, name: str) -> None:
        async def remove() -> None:
            self.catalogs.remove(STORE, name)
        self.call(remove())


@contextlib.contextmanager
def following(url: str, **options) -> Iterator[FollowedModelStore]:
    store = FollowedModelStore(url, wait_s=5, retry_s=0.2, first_wait_s=5, **options)
    try:
        yield store
    finally:
        store.close()


def test_a_pod_gets_the_whole_catalog_then_each_change_within_a_second() -> None:
    with Feed() as served:
        served.put(*(spec(f"m{i}") for i in range(50)))
        with following(served.url) as store:
            assert len(store.ids()) == 50  # the first answer, before the worker starts serving
            started = time.monotonic()
            served.put(spec("m7", "edited"), spec("new"))
            served.remove("m3")
            wait_for(lambda: store.get("m7").description == "edited" and "new" in store.ids()
                     and "m3" not in store.ids(), "the changes in the pod's store", 5, 0.01)
            assert time.monotonic() - started < 1.0
            # What it was sent: the changes only, not the catalog again.
            update = CatalogUpdate.model_validate_json(httpx.get(served.url, params={"since": store.cursor}).content)
            assert (update.complete, update.models, update.removed) == (False, [], [])


def test_a_delta_costs_what_changed_and_an_old_or_foreign_cursor_gets_everything() -> None:
    catalog = Catalog(keep_removed=2)
    for i in range(10):
        catalog.put(f"m{i}", b"{}")
    seen = catalog.revision
    catalog.put("m1", b'{"x":1}')
    assert catalog.put("m2", b"{}") is False  # unchanged: no new revision
    catalog.remove("m4")
    answer = catalog.read(seen)
    assert (answer.complete, answer.entries, answer.removed) == (False, (b'{"x":1}',), ("m4",))
    for i in range(5, 10):
        catalog.remove(f"m{i}")
    for i in range(3000):  # enough changes to compact the log
        catalog.put("m0", str(i).encode())
    assert catalog.read(seen).complete  # removals it no longer remembers: the reader starts over
    assert len(catalog.read(None).entries) == len(catalog) == 4


def test_the_store_keeps_its_catalog_while_the_operator_is_away_and_starts_over_with_a_new_one() -> None:
    port = free_port()
    with Feed(port=port) as first:
        first.put(spec("a"), spec("b"))
        store = FollowedModelStore(first.url, wait_s=5, retry_s=0.2, first_wait_s=5)
        assert store.ids() == ["a", "b"]
    try:
        time.sleep(0.6)  # the operator is gone: the follower's requests fail
        assert store.ids() == ["a", "b"]  # what it had, still served
        with Feed(port=port, ready=False) as second:  # a new operator process, still reading its models
            second.put(spec("b"), spec("c"))
            time.sleep(1.0)
            assert store.ids() == ["a", "b"]  # never handed an incomplete catalog (503 until ready)
            second.ready = True
            wait_for(lambda: store.ids() == ["b", "c"], "the new operator's catalog, complete", 10, 0.05)
    finally:
        store.close()


@pytest.mark.kube
def test_the_feed_answers_a_pools_catalog_to_its_own_pods_only(kube_cluster, tmp_path) -> None:
    """With worker identity on (worker_proofs.CatalogReaders, on the real API server): a pod of the
    pool, presenting its catalog token (bound to it, as the kubelet projects it), reads the catalog;
    no token, a pod of another pool, another account, or a token for another audience do not. The
    follower reads its token file again as the kubelet rotates it."""
    from kubernetes import client, config

    from hotset_common import worker_identity as identity
    from hotset_common.worker_identity import BearerToken, ReviewedTokens, TokenReviews
    from hotset_operator import index
    from hotset_operator.worker_proofs import CatalogReaders
    from hotset_testing import identities

    api = config.new_client_from_config(str(kube_cluster.kubeconfig))
    core = client.CoreV1Api(api)
    namespace = STORE[0]
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        identities.ensure_accounts(core, namespace, identity.WORKER_ACCOUNT, "stranger")
        made = {}
        for name, pool, account in (("pool-pod", {"hotset.io/pool": "shared"}, identity.WORKER_ACCOUNT),
                                    ("dedicated-pod", {"hotset.io/pool": "dedicated", "hotset.io/servedmodel": "x"},
                                     identity.WORKER_ACCOUNT),
                                    ("stranger-pod", {"hotset.io/pool": "shared"}, "stranger")):
            made[name] = core.create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": {
                "app.kubernetes.io/part-of": "hotset", "app.kubernetes.io/component": "worker", **pool}},
                "spec": {"serviceAccountName": account, "schedulerName": "hotset-test-unscheduled",
                         "containers": [{"name": "worker", "image": "hotset-worker:test"}]}})
        workers = [index.pod_entry(api.sanitize_for_serialization(pod)) for pod in made.values()]  # the owned pods
        readers = CatalogReaders(ReviewedTokens(TokenReviews(api, identity.CATALOG_AUDIENCE)), identity.WORKER_ACCOUNT,
                                 lambda: workers, time.monotonic)

        def bound(pod: str, audience: str = identity.CATALOG_AUDIENCE) -> str:
            account = made[pod].spec.service_account_name
            return identities.mint(core, namespace, account, audience, pod=made[pod])

        with Feed(readers) as served:
            served.put(spec("a"))
            for sent, status, words in [
                    ("", 401, "answers only its pool's worker pods"),
                    ("garbage", 401, "authenticates nobody"),
                    (bound("pool-pod", identity.IDENTITY_AUDIENCE), 401, "authenticates nobody for the audience"),
                    (bound("dedicated-pod"), 403, "follows the catalog of team/dedicated/x, not team/pool"),
                    (bound("stranger-pod"), 403, "not the workers' ServiceAccount")]:
                answer = httpx.get(served.url, headers={"Authorization": f"Bearer {sent}"} if sent else {})
                assert answer.status_code == status and words in answer.json()["error"], (words, answer.text)
            token_file = identities.write_token(tmp_path / "catalog-token", bound("dedicated-pod"))
            with following(served.url, credential=BearerToken(path=token_file, reread_s=0.1)) as store:
                assert store.ids() == []  # refused: another pool's pod
                identities.write_token(token_file, bound("pool-pod"))  # the kubelet writes the pod's own
                wait_for(lambda: store.ids() == ["a"], "the catalog, with the rotated token", 10, 0.05)
    finally:
        core.delete_namespace(namespace)
        api.close()


@pytest.mark.parametrize("cursor", ["", "garbage", "other-epoch.5", "x.y"])
def test_any_cursor_it_cannot_use_gets_the_complete_catalog(cursor: str) -> None:
    with Feed() as served:
        served.put(spec("a"))
        update = CatalogUpdate.model_validate_json(httpx.get(served.url, params={"since": cursor, "wait": "1"}).content)
        assert update.complete and [m["id"] for m in update.models] == ["a"]
