"""Fixtures for the kind e2e tier (Docker hosts): cluster, images, chart, teardown.

Skips every test with a clear message where docker (with a running engine),
kind, kubectl or helm is missing. Set MODELPLANE_KIND_KEEP=1 to keep the
cluster after the run for debugging.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from platform_kind import (REPO, KindPlatform, build_and_load_images, create_cluster, delete_cluster, dump,  # noqa: E402
                           why_not_runnable)
from scenarios.platform import Kube  # noqa: E402

_state: dict[str, KindPlatform] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = why_not_runnable()
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindPlatform]:
    models_dir = (REPO / "build" / "models").resolve()
    subprocess.run([str(Path(sys.executable).parent / "modelplane-samples"), "--out", str(models_dir)], check=True,
                   timeout=900)
    delete_cluster()  # a cluster left by an interrupted run
    cluster = create_cluster(tmp_path_factory.mktemp("kind"), models_dir)
    installed = KindPlatform(cluster)
    _state["platform"] = installed
    try:
        build_and_load_images()
        installed.prepare()
        installed.install()
        installed.wait_installed()
        yield installed
    finally:
        installed.stop_forwards()
        _state.pop("platform", None)
        if not os.environ.get("MODELPLANE_KIND_KEEP"):
            delete_cluster()


@pytest.fixture(scope="session")
def sm_kube(platform: KindPlatform) -> Kube:
    return platform.kube


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    installed = _state.get("platform")
    if report.failed and call.when in ("setup", "call") and installed is not None:
        report.sections.append(("kind e2e diagnostics", dump(installed.cluster, installed.namespace)))
