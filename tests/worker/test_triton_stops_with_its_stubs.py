"""Stopping the test harness's tritonserver leaves none of its Python-backend stub processes behind.

Each loaded Python-backend model runs in a `triton_python_backend_stub`
process; a stub left over holds memory and CPU on a machine shared by every
test run. Real processes: tritonserver with the sample `iris` loaded, stopped
by pid the normal way and after it was killed (as a crashed sidecar is).
An orphaned stub notices its parent is gone and exits on its own within a
second or so; the crash case holds the stubs stopped (SIGSTOP) so that only
`stop()` can end them, and the test fails if it does not.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from contextlib import suppress
from pathlib import Path

import httpx
import psutil
import pytest

from hotset_common.spec import ModelSpec
from hotset_testing.polling import wait_for
from hotset_testing.triton import TritonServer, start_tritonserver

STUB = "triton_python_backend_stub"


def stubs_in_group(group: int) -> list[int]:
    """pids of stub processes in the process group `group` (the server's pid: it runs in its own session)."""
    found = subprocess.run(["pgrep", "-g", str(group), "-f", STUB], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


@pytest.fixture
def server_with_iris(sample_specs: dict[str, ModelSpec], tmp_path: Path):
    server = start_tritonserver(tmp_path / "repository", log_dir=tmp_path)
    try:
        shutil.copytree(sample_specs["iris"].source.removeprefix("file://"), server.repository / "iris")
        loaded = httpx.post(f"{server.http_url}/v2/repository/models/iris/load", json={}, timeout=60)
        assert loaded.status_code == 200, loaded.text
        assert stubs_in_group(server.pid), "a loaded Python-backend model runs in a stub process"
        yield server
    finally:
        server.stop()


def test_stop_leaves_no_stub(server_with_iris: TritonServer) -> None:
    group = server_with_iris.pid
    server_with_iris.stop()
    assert not server_with_iris.running()
    wait_for(lambda: not stubs_in_group(group), timeout=2, what="no stub left in the server's group")


def test_stop_after_the_server_was_killed_leaves_no_stub(server_with_iris: TritonServer) -> None:
    group = server_with_iris.pid
    stubs = stubs_in_group(group)
    try:
        for pid in stubs:
            os.kill(pid, signal.SIGSTOP)  # cannot exit by itself now: only a SIGKILL ends it
        os.kill(server_with_iris.pid, signal.SIGKILL)  # the sidecar crashes; its stubs outlive it
        server_with_iris.process.popen.wait(timeout=10)
        assert stubs_in_group(group) == stubs
        server_with_iris.stop()
        wait_for(lambda: not stubs_in_group(group), timeout=2, what="no stub left in the server's group")
    finally:
        for pid in stubs:  # if stop() missed them: they must not outlive the test
            with suppress(psutil.NoSuchProcess):
                stub = psutil.Process(pid)
                if STUB in " ".join(stub.cmdline()):
                    stub.kill()
