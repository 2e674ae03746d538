"""The worker's two hot inference routes as a plain ASGI layer in front of its FastAPI app.

``POST /predict`` and ``POST /v2/models/{name}[/versions/{v}]/infer`` carry
nearly all of a worker's traffic, and for a small model the HTTP path costs
more than the forward pass: profiled at concurrency 8 on a warm tiny BERT,
the event loop held the GIL about three times as long as the inference
threads, and FastAPI's routing, dependency solving and middleware stack were
a large share of it. These routes need none of that: read the body
(bounded), call the data plane, write the answer. Everything else (the
lifespan included) goes to the FastAPI app unchanged, which still describes
both routes in its OpenAPI document. The router serves its own inference
routes the same way (router/hotset_router/inference_asgi.py).

Answers are the FastAPI routes' own, byte for byte in shape: errors are
``http.error_body`` with the error's status and headers, a body nested past
what a parser walks is a 400, anything else a framework raises a 500 naming
it (logged).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from hotset_common import errors, http, wire
from hotset_common.http import ASGIApp, Receive, Scope, Send
from hotset_worker import codec
from hotset_worker.dataplane import OFF_LOOP_BYTES, DataPlane
from hotset_worker.manager import RequestTiming

log = logging.getLogger(__name__)


class InferenceRoutes:
    """Serves ``/predict`` and OIP v2 infer itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, dataplane: DataPlane, max_body_bytes: int,
                 parse_predict: Callable[[bytes], wire.PredictRequest]) -> None:
        self.app = app
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.parse_predict = parse_predict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/predict":
                await self._serve(scope, receive, send, None)
                return
            match = wire.INFER_PATH.match(path)
            if match:
                await self._serve(scope, receive, send, match)
                return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, infer: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = await http.read_body(receive, headers.get("content-length"), self.max_body_bytes)
            if infer is None:
                status, content, answer_headers = await self._predict(body, headers)
            else:
                status, content, answer_headers = await self._infer(infer.group("name"), infer.group("version"),
                                                                    body, headers)
        except errors.HotsetError as exc:
            await http.respond_error(send, exc)
            return
        except RecursionError:  # a value nested past what some step could walk: the input's fault
            await http.respond_error(send, errors.NestedTooDeeply())
            return
        except Exception as exc:  # noqa: BLE001 - answered as the FastAPI app's handler answers it
            log.exception("unhandled error", exc_info=exc)
            await http.respond_error(send, errors.HotsetError(f"internal error: {type(exc).__name__}: {exc}"))
            return
        await http.respond(send, status, content, answer_headers)

    async def _predict(self, raw: bytes, headers: Mapping[str, str]) -> tuple[int, bytes, dict[str, str]]:
        encoding = headers.get("content-encoding")

        def parse() -> wire.PredictRequest:
            return self.parse_predict(http.decompress(raw, encoding, self.max_body_bytes))

        body = parse() if len(raw) <= OFF_LOOP_BYTES and not encoding else await asyncio.to_thread(parse)
        timing = RequestTiming()
        self.dataplane.note_share_weight(headers.get(wire.SHARE_WEIGHT_HEADER))
        predictions = await self.dataplane.predict(body.model_id, body.input_data, wire.parse_timeout(
            headers.get(wire.TIMEOUT_HEADER)), timing, headers.get(wire.VARIANT_HEADER))
        answer = wire.PredictResponse(model_id=body.model_id, predictions=predictions, model_version=timing.version)
        return 200, answer.model_dump_json().encode(), {"content-type": "application/json",
                                                        "server-timing": timing.header(),
                                                        wire.VERSION_HEADER: timing.version}

    async def _infer(self, name: str, version: str | None, body: bytes,
                     headers: Mapping[str, str]) -> tuple[int, bytes, dict[str, str]]:
        def decode() -> codec.InferRequest:
            header_length = codec.parse_header_length(headers.get(codec.HEADER_LENGTH.lower()))
            raw = http.decompress(body, headers.get("content-encoding"), self.max_body_bytes)
            return codec.decode_request(raw, header_length)

        timing = RequestTiming()
        self.dataplane.note_share_weight(headers.get(wire.SHARE_WEIGHT_HEADER))
        answer = await self.dataplane.infer(name, version, body, headers, decode,
                                            wire.parse_timeout(headers.get(wire.TIMEOUT_HEADER)), timing,
                                            headers.get(wire.VARIANT_HEADER))
        return answer.status, answer.body, {**answer.headers, "server-timing": timing.header(),
                                            wire.VERSION_HEADER: timing.version}
