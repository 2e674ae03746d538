"""A Docker engine for the kind tier: the one that answers, or one started here and stopped by pid.

Where ``docker info`` answers, that engine is used as it is. Otherwise Debian's
``dockerd`` (``scripts/install-docker.sh``) is started in its own session with a
daemon config of ours: data under ``~/.cache/modelplane/docker`` (so image layers
survive between runs), and, where this machine's capability bounding set lacks
CAP_SYS_RESOURCE, ``modelplane-runc`` as the default OCI runtime (the shim that
lets kind's ``--privileged`` node containers start; docs/e2e.md). It is stopped
by its own pid when the tier ends; its containerd child stops with it.

    .venv/bin/python e2e/kind/engine.py start   # by hand: prints the pid, leaves it running
    .venv/bin/python e2e/kind/engine.py stop
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

CACHE = Path(os.environ.get("MODELPLANE_CACHE", Path.home() / ".cache" / "modelplane"))
STATE = CACHE / "dockerd"
CAP_SYS_RESOURCE = 24


def docker_answers(timeout_s: float = 20) -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              timeout=timeout_s).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def lacks_sys_resource() -> bool:
    """True where this machine cannot grant CAP_SYS_RESOURCE, so `docker run --privileged` fails."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return not int(line.split()[1], 16) & (1 << CAP_SYS_RESOURCE)
    return False


def shim_binary() -> Path:
    return CACHE / "tools" / "modelplane-runc" / "modelplane-runc"


def daemon_config() -> dict[str, object]:
    """dockerd's settings: our data root, and the CAP_SYS_RESOURCE shim as the default runtime where needed."""
    # ip-forward off: dockerd would otherwise turn on the host's net.ipv4.ip_forward, and no
    # container here needs routing off its bridge (nodes reach each other on it).
    config: dict[str, object] = {"data-root": str(CACHE / "docker"), "storage-driver": "overlay2",
                                 "ip-forward": False}
    if lacks_sys_resource():
        shim = shim_binary()
        if not shim.is_file():
            raise RuntimeError(f"{shim} is missing: run scripts/install-kind.sh")
        config["runtimes"] = {"modelplane-runc": {"path": str(shim)}}
        config["default-runtime"] = "modelplane-runc"
    return config


def start() -> int:
    """Start dockerd in its own session and wait until `docker info` answers; returns its pid."""
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not Path(dockerd).is_file():
        raise RuntimeError("no dockerd: run scripts/install-docker.sh (Debian's docker.io)")
    STATE.mkdir(parents=True, exist_ok=True)
    config_path = STATE / "daemon.json"
    config_path.write_text(json.dumps(daemon_config(), indent=1))
    pidfile = STATE / "dockerd.pid"
    log = (STATE / "dockerd.log").open("ab")
    popen = subprocess.Popen([dockerd, "--config-file", str(config_path), "--pidfile", str(pidfile)],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"dockerd exited with {popen.returncode}; see {STATE / 'dockerd.log'}")
        if docker_answers(5):
            (STATE / "started-by-modelplane.pid").write_text(str(popen.pid))
            return popen.pid
        time.sleep(0.5)
    stop(popen.pid)
    raise TimeoutError(f"dockerd did not answer within 120 s; see {STATE / 'dockerd.log'}")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(pid: int, timeout_s: float = 60) -> None:
    """SIGTERM dockerd by its pid (it stops its containerd), SIGKILL what is left of its session after the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    (STATE / "started-by-modelplane.pid").unlink(missing_ok=True)
    # dockerd's parent cgroup in each hierarchy outlives it; an empty one goes with it.
    for group in Path("/sys/fs/cgroup").glob("*/docker"):
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def docker_engine(keep: bool = False) -> Iterator[int | None]:
    """The engine for a test session: yields None when one already answered, else the pid of ours,
    stopped afterwards unless `keep` (then `engine.py stop` stops it)."""
    if docker_answers():
        yield None
        return
    pid = start()
    try:
        yield pid
    finally:
        if not keep:
            stop(pid)


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"]:
        if docker_answers():
            print("a Docker engine already answers")
            return 0
        print(start())
        return 0
    if argv[:1] == ["stop"]:
        marker = STATE / "started-by-modelplane.pid"
        if not marker.is_file():
            print("no dockerd started by engine.py start")
            return 1
        stop(int(marker.read_text()))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
