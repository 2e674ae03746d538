"""Fixtures for the kind e2e tier: engine, images, cluster, chart, teardown, and the host's guards.

The session: note the host's kernel settings; use the Docker engine that answers
or start one (stopped by pid at the end); build the images; create the kind
cluster and load the images; install the chart with helm. At the end: delete the
cluster and its leftover cgroups, stop what was started, and fail if any host
kernel setting changed. Where no engine can be had, every test skips with the
reason, unless HOTSET_KIND_REQUIRED=1 (CI) makes that an error. Set
HOTSET_KIND_KEEP=1 to keep the cluster (and the engine) for debugging.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from cluster import (CLUSTER, KindCluster, build_images, create_cluster, delete_cluster, load_images,  # noqa: E402
                     missing_host_dirs, remove_host_dirs, tool)
from engine import Engine, docker_answers, docker_engine  # noqa: E402
from host_guard import HostSettings  # noqa: E402
from platform_kind import KindPlatform, dump  # noqa: E402
from scenarios.chart import REPO  # noqa: E402
from scenarios.platform import Kube  # noqa: E402

TIMINGS_FILE = REPO / "build" / "e2e-kind-timings.json"
_state: dict[str, object] = {}
timings: dict[str, float] = {}


def why_not_runnable() -> str | None:
    """None where the tier can run; otherwise what is missing, for the skip message."""
    missing = [name for name in ("docker", "kind", "kubectl", "helm") if tool(name) is None]
    if not docker_answers(5) and tool("dockerd") is None:
        missing.append("dockerd (no Docker engine answers)")
    if missing:
        return f"kind e2e tier skipped: {', '.join(missing)} not found (make install-kind; see docs/e2e.md)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = why_not_runnable()
    if reason is None:
        return
    if os.environ.get("HOTSET_KIND_REQUIRED") == "1":
        raise pytest.UsageError(reason.replace("skipped", "required but cannot run"))
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def host_settings() -> Iterator[HostSettings]:
    """The host's kernel settings before anything ran; the session fails if any changed by its end."""
    before = HostSettings.read()
    yield before
    changed = before.changes(HostSettings.read())
    if changed:
        before.restore(changed)
        pytest.fail(f"the kind tier changed host kernel settings (restored): {changed}", pytrace=False)


@pytest.fixture(scope="session")
def engine(host_settings: HostSettings) -> Iterator[Engine]:
    keep = os.environ.get("HOTSET_KIND_KEEP") == "1"
    with docker_engine(keep=keep) as started:
        yield started


@pytest.fixture(scope="session")
def platform(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindPlatform]:
    models_dir = (REPO / "build" / "models").resolve()
    subprocess.run([str(Path(sys.executable).parent / "hotset-samples"), "--out", str(models_dir)], check=True,
                   timeout=900, capture_output=True)
    node_image = build_images(timings)
    delete_cluster()  # a cluster left by an interrupted run
    created_dirs = missing_host_dirs()
    start = time.monotonic()
    cluster = create_cluster(tmp_path_factory.mktemp("kind"), models_dir, node_image)
    timings["cluster_create_s"] = time.monotonic() - start
    installed = KindPlatform(cluster)
    _state["platform"] = installed
    try:
        start = time.monotonic()
        load_images(cluster.nodes())
        timings["image_load_s"] = time.monotonic() - start
        start = time.monotonic()
        installed.prepare()
        installed.install()
        installed.wait_installed()
        timings["chart_install_s"] = time.monotonic() - start
        yield installed
    finally:
        installed.stop_forwards()
        _state.pop("platform", None)
        if os.environ.get("HOTSET_KIND_KEEP") != "1":
            start = time.monotonic()
            delete_cluster()
            remove_host_dirs(created_dirs)
            timings["cluster_delete_s"] = time.monotonic() - start


@pytest.fixture(scope="session")
def sm_kube(platform: KindPlatform) -> Kube:
    return platform.kube


@pytest.fixture(scope="session")
def kind_cluster(platform: KindPlatform) -> KindCluster:
    return platform.cluster


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if timings:
        TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS_FILE.write_text(json.dumps({"cluster": CLUSTER, **{k: round(v, 1) for k, v in timings.items()}},
                                           indent=1))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if timings:
        terminalreporter.write_line("kind tier timings (s): " + ", ".join(f"{k}={v:.0f}" for k, v in timings.items()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    installed = _state.get("platform")
    if report.failed and call.when in ("setup", "call") and isinstance(installed, KindPlatform):
        report.sections.append(("kind e2e diagnostics", dump(installed.cluster, installed.namespace)))
