"""Child processes for tests, benchmarks and the local stack: started with a log file, stopped by pid.

One place for what every harness here does with a real server process:
start it with its output in a log file, poll its HTTP endpoint until it
answers (failing early, with the log's tail, if it exits), and stop it by
pid — SIGTERM, a grace period, then SIGKILL. A process started in its own
session (``own_session=True``) is signalled as a process group, so whatever
it spawned goes with it; with ``sweep_group=True`` as well, only the process
itself is signalled (so it can shut its children down in its own order) and
what is left of its group is SIGKILLed afterwards, even if it had already exited.

    with spawn("worker", argv, log_dir / "worker.log", url=url, own_session=True) as worker:
        wait_http(worker, "/v2/health/ready", 120)
        ...                                   # stopped on exit, failure or not
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where the install scripts cache what they build or fetch (HOTSET_CACHE, as the scripts read it)."""
    return Path(os.environ.get("HOTSET_CACHE", Path.home() / ".cache" / "hotset"))


# Ports handed to child servers come from below the kernel's ephemeral range
# (ip_local_port_range, 32768-60999 by default): a port from bind(0) lies in that
# range, and an outgoing connection's source port can take it in the moment
# between our check and the child's bind ("address already in use").
_PORT_RANGE = (20000, 32768)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 outside the ephemeral range (held open together so they differ)."""
    low, high = _PORT_RANGE
    ephemeral = _ephemeral_range()
    if ephemeral[0] <= low < ephemeral[1] or ephemeral[0] < high <= ephemeral[1]:
        low, high = 1024, ephemeral[0]
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for port in random.sample(range(low, high), min(high - low, 64 * count)):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports in {low}-{high} on 127.0.0.1")


def exited(process: psutil.Process) -> bool:
    """Whether a process has finished exiting (gone, or a zombie its parent has yet to reap).

    A process mid-exit has already dropped its command line while its state still reads running for
    a few milliseconds; a wait on this check waits through that window.
    """
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    return free_ports(1)[0]


@dataclasses.dataclass
class Process:
    """A child process with its log file (and, for a server, its base URL); a context manager that stops it."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    own_session: bool = False
    stop_timeout_s: float = 10.0
    sweep_group: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.own_session and not self.sweep_group:
                os.killpg(self.popen.pid, signum)
            else:
                self.popen.send_signal(signum)

    def _sweep(self) -> None:
        """With `sweep_group`: SIGKILL whatever is still in its process group (its pid is the group id)."""
        if self.own_session and self.sweep_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL after `timeout_s` (default `stop_timeout_s`): this pid, or its group."""
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait(10)
        self._sweep()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.popen.poll() is None:
            self._signal(signal.SIGKILL)
            self.popen.wait(10)
        self._sweep()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def spawn(name: str, argv: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None, url: str = "",
          own_session: bool = False, stop_timeout_s: float = 10.0, append: bool = False, cwd: Path | None = REPO,
          sweep_group: bool = False) -> Process:
    """Start `argv` with stdout and stderr in `log_path` and `env` added to this environment.

    `cwd` is the repository root unless given (None: this process's own).
    `sweep_group` (with `own_session`): see the module docstring.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab" if append else "wb") as log:
        popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=own_session)
    return Process(name, popen, log_path, url, own_session, stop_timeout_s, sweep_group)


def wait_http(process: Process, path: str, deadline_s: float = 60.0, expect: int = 200, tail_lines: int = 40) -> None:
    """Poll `process.url + path` until it answers `expect`.

    Raises RuntimeError with the log's tail as soon as the process exits, and
    TimeoutError (with the last answer and the tail) after `deadline_s`.
    """
    end = time.monotonic() + deadline_s
    last = ""
    while time.monotonic() < end:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.log_tail(tail_lines)}")
        try:
            response = httpx.get(process.url + path, timeout=2.0)
            if response.status_code == expect:
                return
            last = f"HTTP {response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{process.name} not ready at {process.url + path} after {deadline_s}s ({last}):\n"
                       f"{process.log_tail(tail_lines)}")
