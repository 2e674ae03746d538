"""Requests a user would send to each sample model, and checks of what comes back."""
from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from scenarios.platform import Platform

IMAGE_LABELS = {"red", "green", "blue", "black", "white"}
IRIS_FLOWER = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


def red_png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (230, 20, 20)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def payload(model: str) -> Any:
    """input_data for the seed API's POST /predict."""
    if model.startswith("sentiment"):
        return ["what a wonderful and great day", "this is terrible and awful"]
    if model.startswith("colors"):
        return red_png()
    if model.startswith("iris"):
        return IRIS_FLOWER
    raise ValueError(f"no sample input for {model!r}")


def predict(platform: Platform, model: str, timeout: float = 120.0, like: str | None = None) -> httpx.Response:
    """POST /predict for `model` through the platform's router, as its caller, with the sample input of
    `like` (default: the model's own)."""
    body = {"model_id": model, "input_data": payload(like or model)}
    return httpx.post(f"{platform.router_url}/predict", json=body, headers=platform.router_headers, timeout=timeout)


def check_predictions(model: str, answer: httpx.Response) -> None:
    """What a user would check: the right shape and labels, probabilities that sum to one."""
    assert answer.status_code == 200, f"{model}: {answer.status_code} {answer.text[:500]}"
    predictions = answer.json()["predictions"]
    if model.startswith("sentiment"):
        assert [p["label"] for p in predictions] and all(p["label"] in ("negative", "positive") for p in predictions)
        assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-3 for p in predictions)
    elif model.startswith("colors"):
        assert predictions[0]["label"] in IMAGE_LABELS, predictions
        assert abs(sum(predictions[0]["probabilities"].values()) - 1) < 1e-3
    elif model.startswith("iris"):
        (output, values), = predictions.items()
        rows = np.asarray(values, dtype=float)
        assert rows.shape == (2, 3), (output, rows.shape)
        assert np.allclose(rows.sum(axis=1), 1, atol=1e-3)
