"""The one client of the Triton sidecar, against a real tritonserver: what the pod asks it, from the
event loop and from worker threads at once, and the sizes it takes from Triton's own reports."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_testing.triton import TritonServer, free_ports
from hotset_worker import engine
from hotset_worker.backends import Backends
from hotset_worker.triton_backend import TritonBackend, TritonRefused, memory_from_statistics

from test_triton_worker import context_for, iris_copy


def test_memory_comes_from_tritons_report_summed_over_devices() -> None:
    """The statistics extension's shape for a backend that reports memory (e.g. ONNX Runtime on a GPU)."""
    statistics = {"model_stats": [{"name": "m", "version": "1", "memory_usage": [
        {"type": "GPU", "id": 0, "byte_size": 300 * 2**20}, {"type": "CPU", "id": 0, "byte_size": 20 * 2**20}]}]}
    assert memory_from_statistics(statistics) == 320 * 2**20
    assert memory_from_statistics({"model_stats": [{"name": "m", "memory_usage": []}]}) == 0  # reports nothing
    assert memory_from_statistics({}) == 0


def test_statistics_of_a_loaded_model_and_the_size_that_follows(
        sample_specs: dict[str, ModelSpec], triton_backend: TritonBackend, tmp_path: Path) -> None:
    _, spec = iris_copy(sample_specs, tmp_path, "iris-stats")
    worker = engine.create(spec, context_for(triton_backend))
    worker.load()
    try:
        statistics = triton_backend.statistics("iris-stats")
        (model,) = statistics["model_stats"]
        assert model["name"] == "iris-stats" and "memory_usage" in model
        reported = triton_backend.memory_bytes("iris-stats")
        assert reported == memory_from_statistics(statistics)
        if reported:  # a backend that reports its memory: that is the size
            assert worker.measured_bytes() == reported
        else:  # the Python backend reports none: the stub's resident memory, not the 64 MiB estimate
            assert 5 * 2**20 < worker.measured_bytes() < 1024 * 2**20
            assert worker.measured_bytes() != spec.memory_bytes
    finally:
        worker.unload()
    with pytest.raises(TritonRefused, match="iris-stats"):
        triton_backend.statistics("iris-stats")


async def test_the_event_loop_and_worker_threads_share_the_one_client(
        sample_specs: dict[str, ModelSpec], tritonserver: TritonServer, tmp_path: Path) -> None:
    """Health and held models asked on the loop while threads load and infer, as in a serving pod."""
    backend = TritonBackend(tritonserver.url, tritonserver.repository)
    backends = Backends([backend])
    workers = []
    for name in ("iris-a", "iris-b"):
        _, spec = iris_copy(sample_specs, tmp_path, name)
        workers.append(engine.create(spec, context_for(backend)))
    try:
        # A pod's sidecar has answered ready before models load (its startup probe); a probe left
        # unanswered while Triton is busy loading then keeps that answer (the health grace) instead of
        # reading as down, which on a loaded 2-core CI machine it was (all 20 answers False).
        assert await backends.ready()
        loads = [asyncio.to_thread(worker.load) for worker in workers]
        readiness = [backends.ready() for _ in range(20)]
        results = await asyncio.gather(*loads, *readiness)
        assert all(results[len(loads):])
        assert backend.thread_name in {t.name for t in threading.enumerate()}  # the threads' calls ran there
        assert {"iris-a", "iris-b"} <= (await backend.held_models() or set())
        answers = await asyncio.gather(*(asyncio.to_thread(w.predict, [[5.0, 3.4, 1.5, 0.2]]) for w in workers * 5))
        assert all(a["species_probabilities"][0][0] > 0.5 for a in answers)
    finally:
        for worker in workers:
            await asyncio.to_thread(worker.unload)
        await backends.aclose()
    assert backend.thread_name not in {t.name for t in threading.enumerate()}  # its own loop thread stopped


async def test_a_blocking_call_on_the_event_loop_is_refused_not_left_to_stall_it(triton_backend: TritonBackend) -> None:
    with pytest.raises(RuntimeError, match="on an event loop"):
        triton_backend.model_ready("anything")


async def test_a_pod_without_a_sidecar(sample_specs: dict[str, ModelSpec]) -> None:
    backends = Backends([TritonBackend("")])
    assert await backends.ready()  # nothing to wait for
    assert await backends.readiness() == {"triton": False}
    with pytest.raises(errors.BackendUnavailable, match="has none"):
        await backends.require(sample_specs["iris"])
    await backends.require(sample_specs["sentiment"])  # in-process frameworks need no backend
    assert await backends.serves(sample_specs["sentiment"]) and not await backends.serves(sample_specs["iris"])


async def test_a_sidecar_that_is_down_is_named_in_the_503(sample_specs: dict[str, ModelSpec]) -> None:
    (port,) = free_ports(1)
    backends = Backends([TritonBackend(f"127.0.0.1:{port}")])
    try:
        assert not await backends.ready()
        with pytest.raises(errors.BackendUnavailable, match=f"127.0.0.1:{port}, which is not ready"):
            await backends.require(sample_specs["iris"])
        assert await backends.readiness() == {"triton": False}
    finally:
        await backends.aclose()
