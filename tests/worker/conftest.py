"""Fixtures for the worker suite: the sample models, a real tritonserver, the ballast counters reset."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework, s3_server
from hotset_testing.triton import TritonServer, start_tritonserver
from hotset_worker import samples
from hotset_worker.triton_backend import TritonBackend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _ballast_counters() -> None:
    """Every test starts with the ballast framework's counters at zero (loads, unloads, bytes held):
    a test reads what its own manager did, never what an earlier test left."""
    ballast_framework.reset_counters()


@pytest.fixture(scope="session")
def sample_store() -> Path:
    """build/models/model-store.json, made (idempotently, seconds when already built) by the real generator."""
    return samples.generate(REPO / "build" / "models")


@pytest.fixture(scope="session")
def sample_specs(sample_store: Path) -> dict[str, ModelSpec]:
    import json

    return {raw["id"]: ModelSpec(**raw) for raw in json.loads(sample_store.read_text())["models"]}


@pytest.fixture(scope="session")
def tritonserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver started by hotset-triton on free loopback ports, stopped by pid."""
    root = tmp_path_factory.mktemp("triton")
    server = start_tritonserver(root / "repository", log_dir=root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def triton_backend(tritonserver: TritonServer) -> Iterator[TritonBackend]:
    """The pod's one client of that tritonserver, as main() makes it; closed at the end."""
    backend = TritonBackend(tritonserver.url, tritonserver.repository)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3_server.S3Server]:
    """A real S3 server (MinIO, built by scripts/install-s3.sh) on loopback, one per test module,
    stopped by pid; the tests make their own buckets."""
    try:
        s3_server.minio_binary()
    except s3_server.ServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    with s3_server.running(tmp_path_factory.mktemp("minio")) as server:
        yield server
