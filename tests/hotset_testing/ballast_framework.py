"""A test-only framework whose models hold real memory and load from real files.

A "ballast" model is a folder with ``ballast.json``: ``{"bytes": N,
"load_delay_s": s, "factor": f}``. Loading reads that file through the real
source resolution, sleeps for the delay (a slow load that releases the GIL, as
torch's do) and allocates N bytes; a missing or corrupt file fails the load.
Manager and API tests use it to control sizes and timings exactly, passing
``create_worker`` as the manager's factory (the global registry stays as is).
"""
from __future__ import annotations

import asyncio

import collections
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_worker.frameworks import sources
from hotset_worker.manager import ModelManager
from hotset_worker.store import MemoryModelStore
from hotset_worker.frameworks.base import FrameworkWorker, Rows, RowsResult, TensorSpec, WorkerContext

_loads_lock = threading.Lock()
ATTEMPTS: collections.Counter[str] = collections.Counter()  # load() calls, failed ones included
LOADS: collections.Counter[str] = collections.Counter()  # loads that read a valid file
UNLOADS: collections.Counter[str] = collections.Counter()
EVENTS: list[str] = []  # "load:a", "unload:a", in the order they finished
FORWARDS: list[tuple[str, list[int]]] = []  # batched passes: (model, rows of each request in it)
FORWARD_GATE = threading.Event()  # cleared: every batched pass waits for it (tests hold a pass running)
FORWARD_GATE.set()
FORWARD_STARTED = threading.Event()  # set when a batched pass starts (before it waits at the gate)
STARTED: list[tuple[str, list[int]]] = []  # batched passes as they start (before the gate)
HELD = {"bytes": 0, "peak": 0}  # bytes every ballast model holds now, and the most they held at once
POISON = -1  # a value a single request may carry: its forward pass raises (a batch then runs its requests alone)


def write_model(folder: Path, size: int, load_delay_s: float = 0.0, factor: float = 2.0, predict_delay_s: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"bytes": size, "load_delay_s": load_delay_s, "factor": factor, "predict_delay_s": predict_delay_s}
    (folder / "ballast.json").write_text(json.dumps(config))
    return folder


def reset_counters() -> None:
    with _loads_lock:
        for counter in (ATTEMPTS, LOADS, UNLOADS):
            counter.clear()
        EVENTS.clear()
        HELD.update(bytes=0, peak=0)
        FORWARDS.clear()
        STARTED.clear()
    FORWARD_GATE.set()
    FORWARD_STARTED.clear()


def make_spec(model_id: str, folder: Path, memory: int | str = 0, **extra: Any) -> ModelSpec:
    """A spec for a ballast model (labelled as torchvision: the spec only knows real frameworks)."""
    return ModelSpec(id=model_id, framework="torchvision", source=f"file://{folder}", memory=memory, **extra)


def create_worker(spec: ModelSpec, context: WorkerContext) -> FrameworkWorker:
    """The manager's worker factory in tests: every model is a ballast model."""
    return BallastWorker(spec, context)


class BallastWorker(FrameworkWorker):
    def __init__(self, spec: ModelSpec, context: WorkerContext) -> None:
        super().__init__(spec, context)
        self._data: np.ndarray | None = None
        self._factor = 1.0
        self._predict_delay_s = 0.0
        self.predicting = threading.Event()  # set while predict() runs (tests wait on it)

    def load(self) -> None:
        with _loads_lock:
            ATTEMPTS[self.spec.id] += 1
        folder = sources.resolve(self.spec.source, dict(self.context.source_roots), self.context.file_roots)
        try:
            config = json.loads((folder / "ballast.json").read_text())
            size, delay, factor = int(config["bytes"]), float(config.get("load_delay_s", 0)), float(config.get("factor", 2))
            self._predict_delay_s = float(config.get("predict_delay_s", 0))
        except FileNotFoundError:
            raise errors.ModelLoadFailed(f"{folder / 'ballast.json'} is missing") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.ModelLoadFailed(f"{folder / 'ballast.json'} is corrupt: {exc}") from None
        with _loads_lock:
            LOADS[self.spec.id] += 1
        time.sleep(delay)
        self._data = np.ones(size, dtype=np.uint8)
        self._factor = factor
        with _loads_lock:
            EVENTS.append(f"load:{self.spec.id}")
            HELD["bytes"] += size
            HELD["peak"] = max(HELD["peak"], HELD["bytes"])

    def predict(self, input_data: Any) -> Any:
        if not isinstance(input_data, list) or not all(isinstance(x, (int, float)) for x in input_data):
            raise errors.BadInput("input_data must be a list of numbers")
        self.predicting.set()
        with _loads_lock:
            EVENTS.append(f"predict:{self.spec.id}:{input_data}")
        try:
            time.sleep(self._predict_delay_s)
            if self._data is None:
                raise RuntimeError(f"{self.spec.id} was unloaded during predict()")
        finally:
            self.predicting.clear()
        return {"model": self.spec.id, "scaled": [x * self._factor for x in input_data]}

    # Dynamic batching (only for specs that ask for it: ballast specs have no task default).
    def batchable(self) -> bool:
        return True

    def rows_for_predict(self, input_data: Any) -> Rows:
        if not isinstance(input_data, list) or not all(isinstance(x, (int, float)) for x in input_data):
            raise errors.BadInput("input_data must be a list of numbers")
        model = self.spec.id
        return Rows(len(input_data) or 1, list(input_data),
                    lambda result: {"model": model, "scaled": result.values.tolist()})

    def rows_for_infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Rows:
        tensor = inputs.get("INPUT0")
        if tensor is None or tensor.dtype != np.float32:
            raise errors.BadInput(f"model {self.spec.id!r} expects one FP32 input 'INPUT0', got {sorted(inputs)}")
        model = self.spec.id.encode()
        return Rows(int(tensor.shape[0]) if tensor.ndim else 1, tensor.reshape(-1).tolist(),
                    lambda result: {"OUTPUT0": result.values.astype(np.float32),
                                    "MODEL": np.array([model], dtype=np.object_)})

    def forward(self, batch: list[Rows]) -> list[RowsResult]:
        with _loads_lock:
            STARTED.append((self.spec.id, [rows.count for rows in batch]))
        FORWARD_STARTED.set()
        FORWARD_GATE.wait(timeout=30)
        with _loads_lock:
            FORWARDS.append((self.spec.id, [rows.count for rows in batch]))
        if self._data is None:
            raise RuntimeError(f"{self.spec.id} was unloaded during forward()")
        if any(POISON in rows.payload for rows in batch):
            raise RuntimeError("a poisoned row")
        time.sleep(self._predict_delay_s)
        return [RowsResult(np.asarray(rows.payload, dtype=np.float64) * self._factor) for rows in batch]

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        tensor = inputs.get("INPUT0")
        if tensor is None:
            raise errors.BadInput(f"model {self.spec.id!r} expects input 'INPUT0', got {sorted(inputs)}")
        if tensor.dtype != np.float32:
            raise errors.BadInput(f"input 'INPUT0' must be FP32, got {tensor.dtype}")
        time.sleep(self._predict_delay_s)
        return {
            "OUTPUT0": (tensor * self._factor).astype(np.float32),
            "MODEL": np.array([self.spec.id.encode()], dtype=np.object_),
        }

    @classmethod
    def declared_tensors(cls, spec: ModelSpec, context: WorkerContext) -> tuple[list[TensorSpec], list[TensorSpec]]:
        described = cls(spec, context)
        return described.inputs(), described.outputs()

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "FP32", [-1])]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("OUTPUT0", "FP32", [-1]), TensorSpec("MODEL", "BYTES", [1])]

    def unload(self) -> None:
        held = 0 if self._data is None else int(self._data.nbytes)
        self._data = None
        with _loads_lock:
            HELD["bytes"] -= held
            UNLOADS[self.spec.id] += 1
            EVENTS.append(f"unload:{self.spec.id}")

    def measured_bytes(self) -> int:
        return 0 if self._data is None else int(self._data.nbytes)

    def measures_its_own_bytes(self) -> bool:
        return True


MiB = 2**20


def catalog(root: Path, models: dict[str, dict[str, Any]]) -> MemoryModelStore:
    """A store of ballast models: ``{"a": {"size": MiB, "delay": 0.2, "memory": "1Mi", "pinned": True}}``.

    ``"batching"`` is the spec's (``{"maxBatchSize": 8, "maxDelayMs": 5}``: requests then share passes);
    ``"latency_class"`` is the spec's (``"realtime"``, ``"batch"``); so is ``"priority"``;
    ``"predict_delay"`` makes each predict(), infer() (and batched pass) take that long; ``"warmup"`` lists the spec's warm-up inputs. A model with ``"missing": True`` has no file; ``"corrupt": True`` has a broken one.
    """
    store = MemoryModelStore()
    for model_id, options in models.items():
        folder = root / model_id
        if options.get("missing"):
            folder.mkdir(parents=True, exist_ok=True)
        elif options.get("corrupt"):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "ballast.json").write_text('{"bytes": ')
        else:
            write_model(
                folder, options.get("size", MiB), options.get("delay", 0.0), options.get("factor", 2.0), options.get("predict_delay", 0.0)
            )
        extra = {key: options[key] for key in ("batching", "latency_class", "priority") if key in options}
        store.put(make_spec(model_id, folder, memory=options.get("memory", 0), pinned=options.get("pinned", False),
                            warmup=options.get("warmup", []), **extra))
    return store


def manager(store: MemoryModelStore, budget: int, **options: Any) -> ModelManager:
    """A real ModelManager whose every model is a ballast model."""
    return ModelManager(store, WorkerContext(), budget, create_worker=create_worker, **options)


async def predict(manager: ModelManager, model_id: str, timeout_s: float | None = None) -> str:
    """One request for `model_id` through the manager (admission, load, use); the model that answered."""
    async with manager.use(model_id, timeout_s) as worker:
        return (await asyncio.to_thread(worker.predict, [1]))["model"]
