"""A Docker engine for the kind tier: the one that answers, or one started here and stopped by pid.

Where ``docker info`` answers, that engine is used as it is. Otherwise Debian's
``dockerd`` (``scripts/install-docker.sh``) is started in its own session with a
daemon config of ours: data under ``~/.cache/hotset/docker`` (so image layers
survive between runs), and, where this machine's capability bounding set lacks
CAP_SYS_RESOURCE, ``hotset-runc`` as the default OCI runtime (the shim that
lets kind's ``--privileged`` node containers start; docs/e2e.md). It is stopped
by its own pid when the tier ends; its containerd child stops with it, and what
it left in the host's network (bridges, veths, iptables rules) goes with it
(``host_network.py``), so each run on a machine the tier left clean goes through
dockerd's first start, as on a new machine.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from host_network import HostNetwork, default_bridge_exists

CACHE = Path(os.environ.get("HOTSET_CACHE", Path.home() / ".cache" / "hotset"))
STATE = CACHE / "dockerd"
HOST_NETWORK = STATE / "host-network-before.json"
DATA_ROOT = CACHE / "docker"
NETWORK_STORE = DATA_ROOT / "network" / "files" / "local-kv.db"
CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class Engine:
    """The engine a session uses: `pid` None for one that already answered; `first_start` True where
    ours started with neither the default bridge nor a network store, as on a machine that never ran Docker."""

    pid: int | None
    first_start: bool = False


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
    return CACHE / "tools" / "hotset-runc" / "hotset-runc"


def daemon_config() -> dict[str, object]:
    """dockerd's settings: our data root, and the CAP_SYS_RESOURCE shim as the default runtime where needed."""
    # ip-forward off: dockerd would otherwise turn on the host's net.ipv4.ip_forward, and no
    # container here needs routing off its bridge (nodes reach each other on it).
    config: dict[str, object] = {"data-root": str(DATA_ROOT), "storage-driver": "overlay2",
                                 "ip-forward": False}
    if lacks_sys_resource():
        shim = shim_binary()
        if not shim.is_file():
            raise RuntimeError(f"{shim} is missing: run scripts/install-kind.sh")
        config["runtimes"] = {"hotset-runc": {"path": str(shim)}}
        config["default-runtime"] = "hotset-runc"
    return config


def remove_host_leftovers() -> list[str]:
    """What an engine of ours, stopped or interrupted, left in the host's network: removed; returns what stayed."""
    before = HostNetwork.load(HOST_NETWORK)
    if before is None:
        return []
    left = before.remove_leftovers()
    HOST_NETWORK.unlink(missing_ok=True)
    return left


def start() -> Engine:
    """Start dockerd in its own session and wait until `docker info` answers."""
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not Path(dockerd).is_file():
        raise RuntimeError("no dockerd: run scripts/install-docker.sh (Debian's docker.io)")
    STATE.mkdir(parents=True, exist_ok=True)
    remove_host_leftovers()  # of a run that was interrupted before it stopped its engine
    # dockerd names no gateway for its bridge only on a machine's first start: no docker0 and no
    # network store yet. Where no container is left (one kept with HOTSET_KIND_KEEP would lose its
    # network), ours holds nothing else (stop prunes every network), so it starts afresh each run,
    # while the image layers beside it stay.
    if not any((DATA_ROOT / "containers").glob("*")):
        NETWORK_STORE.unlink(missing_ok=True)
    first_start = not default_bridge_exists()
    HostNetwork.read().save(HOST_NETWORK)
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
            (STATE / "started-by-hotset.pid").write_text(str(popen.pid))
            return Engine(popen.pid, first_start)
        time.sleep(0.5)
    stop(popen.pid)
    raise TimeoutError(f"dockerd did not answer within 120 s; see {STATE / 'dockerd.log'}")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(pid: int, timeout_s: float = 60) -> list[str]:
    """Remove the engine's networks, SIGTERM dockerd by its pid (it stops its containerd), SIGKILL what is
    left of its session after the grace, then what it left in the host's network; returns what stayed."""
    # Every network in our data root is ours (kind's among them); dockerd would recreate their bridges.
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(["docker", "network", "prune", "-f"], capture_output=True, timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    (STATE / "started-by-hotset.pid").unlink(missing_ok=True)
    # dockerd bind-mounts its data root onto itself; one stopped hard leaves the mount (and a cache
    # folder that cannot be removed) behind.
    if os.path.ismount(DATA_ROOT):
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(["umount", str(DATA_ROOT)], capture_output=True, timeout=60)
    # dockerd's parent cgroup in each hierarchy outlives it; an empty one goes with it.
    for group in Path("/sys/fs/cgroup").glob("*/docker"):
        with contextlib.suppress(OSError):
            group.rmdir()
    return remove_host_leftovers()


@contextlib.contextmanager
def docker_engine(keep: bool = False) -> Iterator[Engine]:
    """The engine for a test session: the one that answers, else ours, stopped afterwards unless `keep`
    (then `engine.py stop` stops it). Raises at the end if ours left an interface it could not remove."""
    if docker_answers():
        yield Engine(None)
        return
    engine = start()
    try:
        yield engine
    finally:
        if not keep:
            left = stop(engine.pid)  # type: ignore[arg-type]
            if left:
                raise RuntimeError(f"the engine left host interfaces behind: {left}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"]:
        if docker_answers():
            print("a Docker engine already answers")
            return 0
        print(start().pid)
        return 0
    if argv[:1] == ["stop"]:
        marker = STATE / "started-by-hotset.pid"
        if not marker.is_file():
            print("no dockerd started by engine.py start")
            return 1
        left = stop(int(marker.read_text()))
        print("\n".join(left) or "stopped; nothing left in the host's network")
        return 1 if left else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
