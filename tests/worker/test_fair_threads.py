"""The worker's inference threads, shared between namespaces (fair_threads.py and a real worker).

A namespace that floods its model must not make another namespace's requests wait behind its
queue: with one thread held by a running pass, a newcomer runs next; weights split the threads
between two namespaces that both wait; nothing waits while a thread is free.
"""
from __future__ import annotations

import concurrent.futures
import threading

import httpx
import pytest

from hotset_common import wire
from hotset_common.spec import SourceOptions
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread, wait_until
from hotset_worker.fair_threads import FairThreads


def _held(threads: FairThreads) -> tuple[threading.Event, concurrent.futures.Future]:
    """Occupy the (only) thread until the event is set."""
    gate, started = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        gate.wait(10)
        return "held"

    future = threads.submit(hold, namespace="flood")
    assert started.wait(5)
    return gate, future


def test_a_newcomer_runs_before_the_queue_of_a_namespace_that_floods() -> None:
    threads = FairThreads(1)
    ran: list[str] = []
    try:
        gate, first = _held(threads)
        floods = [threads.submit(ran.append, f"flood-{i}", namespace="flood") for i in range(10)]
        calm = threads.submit(ran.append, "calm", namespace="calm")
        assert threads.queued() == {"flood": 10, "calm": 1}
        gate.set()
        concurrent.futures.wait([first, calm, *floods], timeout=10)
        assert ran[0] == "calm", ran  # FIFO would have run it eleventh
        assert ran[1:] == [f"flood-{i}" for i in range(10)]  # each namespace keeps its own order
    finally:
        threads.shutdown()


def test_weights_split_the_threads_between_namespaces_that_both_wait() -> None:
    threads = FairThreads(1)
    ran: list[str] = []
    threads.set_weight("heavy", 3)
    try:
        gate, first = _held(threads)
        futures = [threads.submit(ran.append, name, namespace=name) for _ in range(12) for name in ("light", "heavy")]
        gate.set()
        concurrent.futures.wait([first, *futures], timeout=10)
        first_eight = ran[:8]
        assert first_eight.count("heavy") == 6 and first_eight.count("light") == 2, ran  # 3 to 1
    finally:
        threads.shutdown()


def test_a_namespace_alone_gets_every_thread_and_a_cancelled_pass_never_runs() -> None:
    threads = FairThreads(2)
    both = threading.Barrier(2, timeout=5)
    try:
        # Two passes of one namespace run at once (the barrier needs both): work-conserving.
        passes = [threads.submit(both.wait, namespace="alone") for _ in range(2)]
        assert all(f.result(timeout=10) in (0, 1) for f in passes)
        gate, first = _held(threads)
        gate2, second = _held(threads)
        ran: list[str] = []
        waiting = threads.submit(ran.append, "cancelled", namespace="other")
        assert waiting.cancel()
        done = threads.submit(ran.append, "ran", namespace="other")
        gate.set()
        gate2.set()
        done.result(timeout=10)
        assert ran == ["ran"]
        # An exception reaches the caller's future, as an executor's would.
        with pytest.raises(ZeroDivisionError):
            threads.submit(lambda: 1 / 0, namespace="other").result(timeout=10)
    finally:
        threads.shutdown()


@pytest.fixture(scope="module")
def tenants_worker(tmp_path_factory):
    """A real worker with one inference thread and two namespaces' models of 200 ms passes, unbatched."""
    root = tmp_path_factory.mktemp("models")
    store = ballast.catalog(root, {"flood": {"predict_delay": 0.2}, "calm": {"predict_delay": 0.2}})
    for model_id, namespace in {"flood": "team-a", "calm": "team-b"}.items():
        spec = store.get(model_id)
        store.put(spec.model_copy(update={"source_options": SourceOptions(namespace=namespace)}))
    with serve_in_thread(ballast_app(store, budget=16 * MiB, inference_threads=1)) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            for model_id in ("flood", "calm"):
                assert client.post(f"/v2/repository/models/{model_id}/load").status_code == 200
            yield client


def _inflight(client: httpx.Client, model: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "hotset_inflight_requests" and sample.labels.get("model") == model:
                return sample.value
    return 0.0


def test_a_namespace_that_floods_a_worker_does_not_queue_another_namespaces_request_behind_it(tenants_worker) -> None:
    base = str(tenants_worker.base_url)
    finished: list[str] = []
    lock = threading.Lock()

    flood = 16
    shared = httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_connections=flood + 2))

    def predict(model: str, headers: dict[str, str] | None = None) -> int:
        code = shared.post("/predict", json={"model_id": model, "input_data": [1.0]}, headers=headers).status_code
        with lock:
            finished.append(model)
        return code

    with shared, concurrent.futures.ThreadPoolExecutor(flood + 1) as pool:
        floods = [pool.submit(predict, "flood", {wire.SHARE_WEIGHT_HEADER: "team-a=1"}) for _ in range(flood)]
        wait_until(lambda: _inflight(tenants_worker, "flood") >= flood - 2, what="the flood queued on the worker")
        assert predict("calm") == 200
        with lock:
            before_calm = finished.index("calm")
        assert all(f.result() == 200 for f in floods)
    # One thread, 16 passes of 200 ms queued: FIFO answers "calm" after about 20 of them; fair
    # queueing after the pass that was running (and the one a thread may have taken meanwhile).
    assert before_calm <= 3, finished
