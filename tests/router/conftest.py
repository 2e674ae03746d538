"""Fixtures of the router's tests: real processes, stopped by pid after each test (or module)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from gateway_helpers import Processes


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    processes = Processes(tmp_path / "logs")
    try:
        yield processes
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(processes.logs(), file=sys.stderr)
        processes.stop_all()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Like `procs`, shared by the tests of one module (their logs are printed if the module fails)."""
    processes = Processes(tmp_path_factory.mktemp("logs"))
    try:
        yield processes
    finally:
        processes.stop_all()
