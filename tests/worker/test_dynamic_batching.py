"""Dynamic batching: requests that queue while a copy is busy share its next forward pass.

Over real HTTP against a real worker app. The batchable stand-in (ballast)
lets a test hold a pass running, so what queues behind it is exact; the
clock is a ManualClock, so a batch window closes only when the test says.
The last tests run the real transformers worker (sample models) to show a
batched answer is the answer the request gets alone.
"""
from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.polling import wait_for_async
from hotset_testing.worker_server import ballast_app, serve_in_thread
from hotset_worker.batching import Batcher, BatchTiming, group_by_length, estimated_rows
from hotset_worker.clock import ManualClock
from hotset_worker.fair_threads import FairThreads
from hotset_worker.frameworks.base import WorkerContext



def batched(max_rows: int = 16, max_delay_ms: float = 0) -> dict:
    return {"size": MiB, "batching": {"maxBatchSize": max_rows, "maxDelayMs": max_delay_ms}}


async def predict(client: httpx.AsyncClient, model: str, data) -> httpx.Response:
    return await client.post("/predict", json={"model_id": model, "input_data": data})


async def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    await wait_for_async(condition, what, timeout_s)


async def inflight(client: httpx.AsyncClient, model: str) -> int:
    copies = {c["id"]: c for c in (await client.get("/status")).json()["models"]}
    return copies[model]["inflight"] if model in copies else 0


async def hold_a_pass(client: httpx.AsyncClient, model: str) -> asyncio.Task:
    """Start a request whose pass blocks until the gate opens; returns once it is running."""
    ballast.FORWARD_GATE.clear()
    ballast.FORWARD_STARTED.clear()
    running = asyncio.create_task(predict(client, model, [1]))
    await wait_for(lambda: asyncio.to_thread(ballast.FORWARD_STARTED.is_set), "the held pass to start")
    return running


async def test_requests_queued_behind_a_running_pass_are_served_by_one_forward_pass(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": batched()})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, inference_threads=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await predict(client, "m", [1])).status_code == 200  # loaded; a lone pass
            held = await hold_a_pass(client, "m")
            queued = [asyncio.create_task(predict(client, "m", [n])) for n in (2, 3, 4, 5, 6)]
            await wait_for(lambda: _equals(inflight(client, "m"), 6), "five requests to queue")
            ballast.FORWARD_GATE.set()
            answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [200] * 6
    assert [a.json()["predictions"]["scaled"] for a in answers[1:]] == [[4.0], [6.0], [8.0], [10.0], [12.0]]
    assert ballast.FORWARDS == [("m", [1]), ("m", [1]), ("m", [1, 1, 1, 1, 1])]  # the five: one pass
    timing = answers[1].headers["server-timing"]
    assert "batch;dur=" in timing and "infer;dur=" in timing


async def test_a_bad_input_in_a_batch_fails_alone(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": batched()})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, inference_threads=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await predict(client, "m", [1])).status_code == 200
            held = await hold_a_pass(client, "m")
            inputs = [[1], "not numbers", [2], [ballast.POISON], [3]]
            queued = [asyncio.create_task(predict(client, "m", data)) for data in inputs]
            await wait_for(lambda: _equals(inflight(client, "m"), 6), "the batch to queue")
            ballast.FORWARD_GATE.set()
            answers = await asyncio.gather(held, *queued)
    statuses = [a.status_code for a in answers[1:]]
    assert statuses == [200, 400, 200, 500, 200]
    assert "input_data must be a list of numbers" in answers[2].json()["error"]
    assert "a poisoned row" in answers[4].json()["error"]  # it failed on its own pass, the others answered
    assert [answers[i].json()["predictions"]["scaled"] for i in (1, 3, 5)] == [[2.0], [4.0], [6.0]]
    # the joint pass of the four checked inputs failed, so each ran alone: only the poisoned one failed
    assert ballast.FORWARDS[2:] == [("m", [1, 1, 1, 1]), ("m", [1]), ("m", [1]), ("m", [1]), ("m", [1])]


async def test_a_lone_request_does_not_wait_for_the_window(tmp_path) -> None:
    clock = ManualClock()  # never advanced: a request that waited for its window would never be answered
    store = ballast.catalog(tmp_path, {"m": batched(max_rows=32, max_delay_ms=1000)})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, clock=clock)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            for n in range(3):
                answer = await predict(client, "m", [n])
                assert answer.status_code == 200 and answer.json()["predictions"]["scaled"] == [2.0 * n]
    assert ballast.FORWARDS == [("m", [1])] * 3


async def test_a_lone_request_reaches_its_thread_on_the_loop_turn_it_arrives_on(tmp_path) -> None:
    """Batching on costs a lone request no extra loop turn: its pass is handed to the inference
    threads inside its own first step, as the direct path's is (no task of the batcher's to run
    first). Structural, not timed: a loaded loop makes every extra turn cost its wait."""
    threads = FairThreads(1)
    handed: list[int] = []

    def run(rows, function, *args):
        handed.append(rows)
        return threads.submit(function, *args, cost=rows)

    spec = ballast.catalog(tmp_path, {"m": batched(max_rows=32, max_delay_ms=1000)}).get("m")
    worker = ballast.create_worker(spec, WorkerContext())
    worker.load()
    batcher = Batcher(worker, 32, 1.0, run, ManualClock())
    try:
        timing = BatchTiming()
        request = asyncio.ensure_future(batcher.submit(1, lambda: worker.rows_for_predict([3]), timing))
        await asyncio.sleep(0)  # one turn of the loop: the request's first step, and no more
        assert handed == [1]
        assert await request == {"model": "m", "scaled": [6.0]}
        assert timing.waited_s == 0 and batcher.passes == 1
    finally:
        threads.shutdown()


async def test_a_second_pass_beside_a_running_one_waits_for_its_window_or_a_full_batch(tmp_path) -> None:
    clock = ManualClock()
    store = ballast.catalog(tmp_path, {"m": batched(max_rows=3, max_delay_ms=50)})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, clock=clock, inference_threads=2)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await predict(client, "m", [1])).status_code == 200
            held = await hold_a_pass(client, "m")  # one of the copy's two pass slots, held
            second = asyncio.create_task(predict(client, "m", [2]))
            await wait_for(lambda: _equals(inflight(client, "m"), 2), "a request to queue")
            third = asyncio.create_task(predict(client, "m", [3]))
            await wait_for(lambda: _equals(inflight(client, "m"), 3), "a second request to queue")
            assert ballast.STARTED == [("m", [1]), ("m", [1])]  # the free slot waits: the window is open
            fourth = asyncio.create_task(predict(client, "m", [4]))  # three rows: full, it starts at once
            await wait_for(lambda: asyncio.to_thread(lambda: len(ballast.STARTED) == 3), "the full batch's pass")
            assert ballast.STARTED[-1] == ("m", [1, 1, 1])
            fifth = asyncio.create_task(predict(client, "m", [5]))  # both slots busy: it queues
            await wait_for(lambda: _equals(inflight(client, "m"), 5), "a fifth request to queue")
            ballast.FORWARD_GATE.set()
            answers = await asyncio.gather(held, second, third, fourth, fifth)
    assert [a.status_code for a in answers] == [200] * 5
    assert ballast.STARTED[-1] == ("m", [1])  # once a slot was free and no window to wait for: at once


async def test_a_window_closes_on_the_clock(tmp_path) -> None:
    clock = ManualClock()
    store = ballast.catalog(tmp_path, {"m": batched(max_rows=8, max_delay_ms=50)})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, clock=clock, inference_threads=2)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await predict(client, "m", [1])).status_code == 200
            held = await hold_a_pass(client, "m")
            waiting = asyncio.create_task(predict(client, "m", [2]))
            await wait_for(lambda: _equals(inflight(client, "m"), 2), "a request to queue")
            assert len(ballast.STARTED) == 2 and not waiting.done()
            clock.advance(0.05)  # its window closes: the free slot takes it
            await wait_for(lambda: asyncio.to_thread(lambda: len(ballast.STARTED) == 3), "its pass to start")
            ballast.FORWARD_GATE.set()
            assert (await waiting).json()["predictions"]["scaled"] == [4.0]
            assert (await held).status_code == 200


async def test_oip_infer_requests_share_a_pass_too(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": batched()})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, inference_threads=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await predict(client, "m", [1])).status_code == 200
            held = await hold_a_pass(client, "m")

            def body(values: list[float]) -> dict:
                return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]}

            queued = [asyncio.create_task(client.post("/v2/models/m/infer", json=body(v))) for v in ([1.0], [2.0, 3.0])]
            await wait_for(lambda: _equals(inflight(client, "m"), 3), "two infer requests to queue")
            ballast.FORWARD_GATE.set()
            await held
            answers = [await task for task in queued]
    outputs = [{o["name"]: o["data"] for o in a.json()["outputs"]} for a in answers]
    assert [o["OUTPUT0"] for o in outputs] == [[2.0], [4.0, 6.0]] and outputs[0]["MODEL"] == ["m"]
    model, rows = ballast.FORWARDS[-1]  # both in one pass (in the order they arrived: two connections race)
    assert model == "m" and sorted(rows) == [1, 2]


async def test_batch_sizes_and_queue_delay_are_in_the_metrics(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": batched()})
    with serve_in_thread(ballast_app(store, budget=100 * MiB, pod_name="p", inference_threads=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await predict(client, "m", [1])).status_code == 200
            held = await hold_a_pass(client, "m")
            queued = [asyncio.create_task(predict(client, "m", [n])) for n in range(4)]
            await wait_for(lambda: _equals(inflight(client, "m"), 5), "four requests to queue")
            ballast.FORWARD_GATE.set()
            await asyncio.gather(held, *queued)
            text = (await client.get("/metrics")).text
    labels = '{framework="torchvision",model="m",pod="p"}'
    assert f"hotset_batch_rows_count{labels} 3.0" in text  # three passes: 1, 1, then 4 rows
    assert f"hotset_batch_rows_sum{labels} 6.0" in text
    assert f"hotset_batch_requests_sum{labels} 6.0" in text
    assert f"hotset_batch_queue_seconds_count{labels} 6.0" in text


def test_rows_are_grouped_by_length_only_when_padding_would_waste() -> None:
    assert group_by_length([5, 6, 5, 6]) == [[0, 2, 1, 3]]  # similar: one pass
    groups = group_by_length([4, 120, 5, 4, 118, 6, 5, 121])
    assert sorted(sorted(g) for g in groups) == [[0, 2, 3, 5, 6], [1, 4, 7]]  # short ones apart from long ones
    assert group_by_length([3, 200]) == [[0, 1]]  # too few rows to be worth two passes
    assert estimated_rows(["a", "b", "c"]) == 3 and estimated_rows("a") == 1 and estimated_rows([1, 2]) == 1


# ----- the real transformers worker ---------------------------------------------------------


def _real_app(sample_store, **options):
    from hotset_worker import main

    settings = main.parse_settings(["--model-store", str(sample_store), "--memory-budget", "2Gi"], {})
    return main.build_app(settings)


async def test_concurrent_requests_of_a_real_classifier_answer_as_they_would_alone(sample_store) -> None:
    texts = ["good", "a wonderful little movie that i would watch again and again with my whole family",
             "bad", "the service was terrible", "what a lovely day", "boring", "i hate this film", "nice"]
    with serve_in_thread(_real_app(sample_store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            alone = []
            for text in texts:
                answer = await predict(client, "sentiment", text)
                assert answer.status_code == 200
                alone.append(answer.json()["predictions"][0]["probabilities"])
            together = await asyncio.gather(*(predict(client, "sentiment", text) for text in texts * 3))
            mixed = await predict(client, "sentiment", texts)  # one request, rows of very different lengths
            metrics = (await client.get("/metrics")).text
    for index, answer in enumerate(together):
        assert answer.status_code == 200
        got = answer.json()["predictions"][0]["probabilities"]
        assert got == pytest.approx(alone[index % len(texts)], abs=1e-5)
    assert [row["probabilities"] for row in mixed.json()["predictions"]] == [pytest.approx(p, abs=1e-5) for p in alone]
    assert 'hotset_batch_rows_count{framework="transformers",model="sentiment"' in metrics


async def test_openai_embeddings_are_batched_and_match_alone(sample_store) -> None:
    with serve_in_thread(_real_app(sample_store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async def embed(text: str) -> list[float]:
                answer = await client.post("/v1/embeddings", json={"model": "mini-embed", "input": text})
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert body["usage"]["prompt_tokens"] > 0
                return body["data"][0]["embedding"]

            alone = [await embed(text) for text in ("one", "two words", "three words here")]
            together = await asyncio.gather(*(embed(text) for text in ("one", "two words", "three words here") * 4))
            metrics = (await client.get("/metrics")).text
    for index, vector in enumerate(together):
        assert np.allclose(vector, alone[index % 3], atol=1e-5)
    assert 'hotset_batch_rows_count{framework="transformers",model="mini-embed"' in metrics


async def _equals(value, expected) -> bool:
    return (await value) == expected
