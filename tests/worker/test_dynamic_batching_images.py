"""Dynamic batching of a real torchvision image classifier, in a real worker process.

The worker (the ``hotset-worker`` CLI, one inference thread) serves the
sample ``colors`` MobileNetV2, made locally by ``samples.generate``, under
three specs: batched, batched with a long window, and batching off. A test
keeps the copy busy with a real request (sixteen large PNGs to decode and
classify: about a second of one thread), queues its requests behind that
pass, and reads what happened from the worker's own figures: the
``hotset_batch_*`` histograms (passes, requests and rows per pass, queue
seconds) and each answer's Server-Timing. Nothing here compares a duration
with a threshold: "busy" is the worker's ``/status`` saying how many
requests hold the copy, and "no wait" is a wait of exactly zero.
"""
from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from hotset_testing.polling import wait_for_async
from hotset_testing.worker_server import REPO, worker_process
from hotset_worker import samples

POD = "image-batching-pod"
BATCHED = "colors-batched"
WINDOW = "colors-window"  # batched, with the longest window there is: a lone request that waited for it would show
UNBATCHED = "colors-unbatched"
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "black": (0, 0, 0), "white": (255, 255, 255)}
LABELS = list(COLOURS)  # the sample model's labels, in its model.json order
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]


def png(colour: str, size: tuple[int, int] = (64, 64)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, COLOURS[colour]).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def tensor(colour: str, height: int = 64, width: int = 64) -> list:
    """A preprocessed [1, 3, H, W] image of one colour (resized and normalised, as OIP tensors are)."""
    rgb = np.array(COLOURS[colour], dtype=np.float32)[:, None, None] / 255.0
    return ((np.broadcast_to(rgb, (3, height, width)) - MEAN) / STD)[None].tolist()


@dataclass(frozen=True)
class Ask:
    """One request: its protocol, its images (colour, size) or a tensor, and what it should answer."""

    protocol: str  # "predict" (seed API) or "infer" (OIP v2)
    colours: tuple[str, ...]
    sizes: tuple[tuple[int, int], ...] = ()
    as_tensor: bool = False

    def body(self, model: str) -> tuple[str, dict[str, Any]]:
        sizes = self.sizes or ((64, 64),) * len(self.colours)
        images = [png(colour, size) for colour, size in zip(self.colours, sizes)]
        if self.protocol == "predict":
            data: Any = tensor(self.colours[0]) if self.as_tensor else (images[0] if len(images) == 1 else images)
            return "/predict", {"model_id": model, "input_data": data}
        if self.as_tensor:
            entry = {"name": "input", "datatype": "FP32", "shape": [1, 3, 64, 64],
                     "data": np.asarray(tensor(self.colours[0])).reshape(-1).tolist()}
        else:
            entry = {"name": "image", "datatype": "BYTES", "shape": [len(images)], "data": images}
        return f"/v2/models/{model}/infer", {"inputs": [entry]}


def probabilities(ask: Ask, answer: httpx.Response) -> list[list[float]]:
    """Each image's probabilities in label order, whichever protocol answered."""
    assert answer.status_code == 200, answer.text
    if ask.protocol == "predict":
        rows = answer.json()["predictions"]
        assert [row["label"] for row in rows] == list(ask.colours)  # each request got its own images' answers
        return [[row["probabilities"][label] for label in LABELS] for row in rows]
    (output,) = answer.json()["outputs"]
    assert output["name"] == "probabilities" and output["shape"] == [len(ask.colours), len(LABELS)]
    rows = np.asarray(output["data"], dtype=np.float64).reshape(output["shape"]).tolist()
    assert [LABELS[int(np.argmax(row))] for row in rows] == list(ask.colours)
    return rows


def batch_wait_ms(answer: httpx.Response) -> float:
    """The ``batch`` entry of the answer's Server-Timing: milliseconds it waited for its pass to start."""
    match = re.search(r"batch;dur=([0-9.]+)", answer.headers["server-timing"])
    assert match, answer.headers["server-timing"]
    return float(match.group(1))


@pytest.fixture(scope="module")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog of the sample classifier under three batching settings (one source folder)."""
    store = samples.generate(REPO / "build" / "models")  # idempotent: reuses what is already built
    (colors,) = [raw for raw in json.loads(store.read_text())["models"] if raw["id"] == "colors"]
    settings = {BATCHED: {"maxBatchSize": 32, "maxDelayMs": 2}, WINDOW: {"maxBatchSize": 32, "maxDelayMs": 1000},
                UNBATCHED: {"maxBatchSize": 1}}
    models = [dict(colors, id=name, name=name, batching=batching) for name, batching in settings.items()]
    path = tmp_path_factory.mktemp("image-batching") / "model-store.json"
    path.write_text(json.dumps({"models": models}))
    return path


@pytest.fixture(scope="module")
def worker_url(model_store: Path) -> Iterator[str]:
    """The real worker CLI with one inference thread: a copy runs one pass at a time, so what
    arrives during a pass queues for the next one."""
    args = ["--model-store", str(model_store), "--inference-threads", "1", "--torch-threads", "1",
            "--min-residency-s", "0"]
    env = {"HOTSET_MEMORY_BUDGET": "2Gi", "HOTSET_POD_NAME": POD, "HF_HUB_OFFLINE": "1"}
    with worker_process(args, env=env, timeout_s=120) as url:
        yield url


@pytest.fixture
async def client(worker_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=worker_url, timeout=120) as client:
        yield client


async def send(client: httpx.AsyncClient, model: str, ask: Ask) -> httpx.Response:
    path, body = ask.body(model)
    return await client.post(path, json=body)


async def batch_figures(client: httpx.AsyncClient, model: str) -> dict[str, float]:
    """The model's hotset_batch_* histogram counts and sums from the worker's /metrics."""
    text = (await client.get("/metrics")).text
    figures: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("hotset_batch_") and sample.labels.get("model") == model \
                    and sample.name.endswith(("_count", "_sum")):
                figures[sample.name] = figures.get(sample.name, 0.0) + sample.value
    return figures


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


async def inflight(client: httpx.AsyncClient, model: str) -> int:
    copies = {c["id"]: c for c in (await client.get("/status")).json()["models"]}
    return copies[model]["inflight"] if model in copies else 0


async def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    await wait_for_async(condition, what, timeout_s)


# Sixteen 2000x2000 PNGs (the most pixels one request may hold): decoding and classifying them
# keeps the copy's one pass busy for about a second, long past the moment the queued requests arrive.
HOLD = Ask("predict", ("red",) * 16, ((2000, 2000),) * 16)


async def behind_a_busy_pass(client: httpx.AsyncClient, model: str, asks: list[Ask]) -> list[httpx.Response]:
    """Start HOLD's pass, send `asks` while it runs, and return their answers (HOLD's checked too)."""
    hold = asyncio.create_task(send(client, model, HOLD))
    await wait_for(lambda: _equals(inflight(client, model), 1), "the holding request's pass to start")
    queued = [asyncio.create_task(send(client, model, ask)) for ask in asks]
    await wait_for(lambda: _equals(inflight(client, model), 1 + len(asks)), f"{len(asks)} requests to queue")
    assert not hold.done(), "the holding pass ended before the requests queued: the test proved nothing"
    answers = await asyncio.gather(hold, *queued)
    assert answers[0].status_code == 200, answers[0].text
    return list(answers[1:])


# Different colours per request (a mix-up shows as a wrong label), different image sizes in one
# pass (each is resized to the model's 64x64 before it joins), a request of two images, a tensor.
MIXED_SIZES = [((90, 70),), ((300, 20),), ((8, 8),), ((640, 480),), ((64, 64),)]


def asks_for(protocol: str) -> list[Ask]:
    protocols = ["predict", "infer"] * 4 if protocol == "both" else [protocol] * 8
    colours = ["red", "green", "blue", "black", "white"]
    asks = [Ask(protocols[i], (colour,), MIXED_SIZES[i]) for i, colour in enumerate(colours)]
    asks.append(Ask(protocols[5], ("blue", "white"), ((120, 40), (16, 16))))
    asks.append(Ask(protocols[6], ("green",), as_tensor=True))
    asks.append(Ask(protocols[7], ("black",), ((1000, 1000),)))
    return asks


@pytest.mark.parametrize("protocol", ["predict", "infer", "both"])
async def test_requests_queued_behind_a_busy_pass_share_one_pass_and_answer_as_alone(
        client: httpx.AsyncClient, protocol: str) -> None:
    asks = asks_for(protocol)
    alone = [probabilities(ask, await send(client, BATCHED, ask)) for ask in asks]
    before = await batch_figures(client, BATCHED)
    answers = await behind_a_busy_pass(client, BATCHED, asks)
    figures = grew(before, await batch_figures(client, BATCHED))
    for ask, answer, expected in zip(asks, answers, alone):
        assert probabilities(ask, answer) == [pytest.approx(row, abs=1e-5) for row in expected], ask
        assert batch_wait_ms(answer) > 0  # it waited for the busy pass: it was batched, not run alone
    assert figures["hotset_batch_requests_count"] == 2  # the holding pass, then one pass for all eight
    assert figures["hotset_batch_requests_sum"] == 1 + len(asks)
    assert figures["hotset_batch_rows_sum"] == 16 + sum(len(ask.colours) for ask in asks)
    assert figures["hotset_batch_queue_seconds_count"] == 1 + len(asks)


async def test_a_bad_image_in_a_batch_fails_only_its_own_request(client: httpx.AsyncClient) -> None:
    garbage = base64.b64encode(b"these bytes are no image at all").decode()
    good = [Ask("predict", ("red",), ((90, 70),)), Ask("infer", ("green",)), Ask("predict", ("blue",), ((30, 300),))]
    bad = [
        ("/predict", {"model_id": BATCHED, "input_data": garbage}, "cannot decode image"),
        ("/predict", {"model_id": BATCHED, "input_data": "/etc/passwd"}, "base64"),
        (f"/v2/models/{BATCHED}/infer",
         {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3 * 32 * 32}]},
         "[N, 3, 64, 64]"),
        (f"/v2/models/{BATCHED}/infer",
         {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [2], "data": [png("red"), garbage]}]},
         "cannot decode image 1"),
    ]
    alone = [probabilities(ask, await send(client, BATCHED, ask)) for ask in good]
    before = await batch_figures(client, BATCHED)
    hold = asyncio.create_task(send(client, BATCHED, HOLD))
    await wait_for(lambda: _equals(inflight(client, BATCHED), 1), "the holding request's pass to start")
    queued = [asyncio.create_task(send(client, BATCHED, good[0]))]
    queued += [asyncio.create_task(client.post(path, json=body)) for path, body, _ in bad[:2]]
    queued += [asyncio.create_task(send(client, BATCHED, good[1]))]
    queued += [asyncio.create_task(client.post(path, json=body)) for path, body, _ in bad[2:]]
    queued += [asyncio.create_task(send(client, BATCHED, good[2]))]
    await wait_for(lambda: _equals(inflight(client, BATCHED), 1 + len(queued)), "the batch to queue")
    assert not hold.done(), "the holding pass ended before the requests queued: the test proved nothing"
    held, *answers = await asyncio.gather(hold, *queued)
    figures = grew(before, await batch_figures(client, BATCHED))
    assert held.status_code == 200
    good_answers = [answers[0], answers[3], answers[6]]
    bad_answers = [answers[1], answers[2], answers[4], answers[5]]
    for ask, answer, expected in zip(good, good_answers, alone):
        assert probabilities(ask, answer) == [pytest.approx(row, abs=1e-5) for row in expected]
    for (_, _, problem), answer in zip(bad, bad_answers):
        assert answer.status_code == 400, answer.text
        assert problem in answer.json()["error"]
        assert len(answer.json()["error"]) < 1000  # names the problem, quotes no input back
    assert figures["hotset_batch_requests_count"] == 2  # the bad inputs left the pass; the good ones ran in one
    assert figures["hotset_batch_requests_sum"] == 1 + len(queued)
    assert figures["hotset_batch_rows_sum"] == 16 + len(good)  # only the good requests' rows ran


async def test_a_lone_request_runs_at_once_and_records_no_wait(client: httpx.AsyncClient) -> None:
    """With a 1000 ms window and nothing queued, each request is a pass of its own, at once: its
    recorded wait is zero (not "short"), in Server-Timing and in the queue-seconds histogram."""
    before = await batch_figures(client, WINDOW)
    for colour in ("red", "green", "blue"):
        answer = await send(client, WINDOW, Ask("predict", (colour,)))
        probabilities(Ask("predict", (colour,)), answer)
        assert batch_wait_ms(answer) == 0.0
    figures = grew(before, await batch_figures(client, WINDOW))
    assert figures["hotset_batch_requests_count"] == 3 and figures["hotset_batch_requests_sum"] == 3
    assert figures["hotset_batch_queue_seconds_count"] == 3
    assert figures["hotset_batch_queue_seconds_sum"] == 0.0


async def test_with_batching_off_requests_never_enter_a_batch(client: httpx.AsyncClient) -> None:
    asks = [Ask("predict", (colour,)) for colour in ("red", "green")] + [Ask("infer", ("blue",))]
    alone = [await send(client, UNBATCHED, ask) for ask in asks]
    together = await asyncio.gather(*(send(client, UNBATCHED, ask) for ask in asks * 3))
    expected = [probabilities(ask, answer) for ask, answer in zip(asks, alone)]
    for index, answer in enumerate([*alone, *together]):
        ask = asks[index % len(asks)]
        assert probabilities(ask, answer) == [pytest.approx(row, abs=1e-5) for row in expected[index % len(asks)]]
        assert batch_wait_ms(answer) == 0.0  # never entered a batcher: no wait recorded at all
    assert await batch_figures(client, UNBATCHED) == {}  # no pass of this model went through a batcher


async def _equals(value, expected) -> bool:
    return (await value) == expected
