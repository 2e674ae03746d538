"""A reference server built the way seed 000 describes, to measure hotset against.

Written here from the design alone (no code of the seed's repository): FastAPI
with ``POST /predict {model_id, input_data}`` and ``GET /models``; a model
store read from a JSON file; a model manager that is one ``OrderedDict`` used
as an LRU with a fixed count (``max_models=2``); on a miss it evicts the least
recently used entry (``popitem(last=False)``, then ``del``) and loads the new
model inside the request; transformers models run tokenizer -> no_grad ->
softmax. The endpoints are ``async`` and do their work inline, so requests
are served one at a time, which is what makes the plain OrderedDict safe.

Usage: python benchmarks/seed_reference_server.py --store STORE.json --port P [--max-models 2]
"""
from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer


class PredictRequest(BaseModel):
    model_id: str
    input_data: Any


class TransformersWorker:
    """Loads when created; predicts probabilities per class."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        folder = urlparse(metadata["source"]).path
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()

    def predict(self, input_data: Any) -> list[list[float]]:
        inputs = self.tokenizer(input_data, return_tensors="pt", padding=True, truncation=True)
        with torch.no_grad():
            logits = self.model(**inputs).logits
        return torch.softmax(logits, dim=-1).tolist()


class ModelManager:
    """The seed's count-based LRU: an OrderedDict of at most `max_models` loaded workers."""

    def __init__(self, store: dict[str, dict[str, Any]], max_models: int) -> None:
        self.store = store
        self.max_models = max_models
        self.model_cache: OrderedDict[str, TransformersWorker] = OrderedDict()

    def get_model_worker(self, model_id: str) -> TransformersWorker | None:
        if model_id in self.model_cache:
            self.model_cache.move_to_end(model_id)
            return self.model_cache[model_id]
        metadata = self.store.get(model_id)
        if metadata is None:
            return None
        if len(self.model_cache) >= self.max_models:
            _, evicted = self.model_cache.popitem(last=False)
            del evicted
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        self.model_cache[model_id] = TransformersWorker(metadata)
        return self.model_cache[model_id]


def create_app(store_file: Path, max_models: int) -> FastAPI:
    entries = json.loads(store_file.read_text())["models"]
    manager = ModelManager({entry["id"]: entry for entry in entries}, max_models)
    app = FastAPI()

    @app.post("/predict")
    async def predict(request: PredictRequest) -> dict[str, Any]:
        worker = manager.get_model_worker(request.model_id)
        if worker is None:
            raise HTTPException(status_code=404, detail=f"model {request.model_id} not found")
        return {"model_id": request.model_id, "predictions": worker.predict(request.input_data)}

    @app.get("/models")
    async def models() -> dict[str, Any]:
        return {
            "available_models": manager.store,
            "loaded_models": {key: manager.store[key]["name"] for key in manager.model_cache},
        }

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-models", type=int, default=2)
    args = parser.parse_args()
    uvicorn.run(create_app(args.store, args.max_models), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
